"""Every module's `__all__` is sorted, names only what exists, and lists every public definition."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

PACKAGES = ["parl", "parl_remote", "parl_algos", "parl_evo", "parl_dashboard"]
# Aliases that replace themselves in sys.modules; their __all__ is the target's.
ALIASES = {"parl.algorithms", "parl.evo"}


def _modules():
    for name in PACKAGES:
        package = importlib.import_module(name)
        yield name
        for info in pkgutil.walk_packages(package.__path__, prefix=name + "."):
            if info.name not in ALIASES and ".__main__" not in info.name:
                yield info.name


@pytest.mark.parametrize("module_name", sorted(_modules()))
def test_dunder_all_is_sorted_and_complete(module_name):
    module = importlib.import_module(module_name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{module_name} has no __all__"
    assert list(exported) == sorted(exported), f"{module_name}.__all__ is not sorted"
    assert len(set(exported)) == len(exported), f"{module_name}.__all__ has duplicates"
    for name in exported:
        assert hasattr(module, name), f"{module_name}.__all__ names {name!r}, which does not exist"
    defined_here = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", None) == module_name
    }
    missing = defined_here - set(exported)
    assert not missing, (
        f"{module_name} defines public {sorted(missing)} but leaves them out of __all__"
    )

"""The modules of `parl_algos.train` import each other as a tree that reads top-down.

Read with `ast` from the sources: the command line on top, the spec registry under it (and
imported by nothing else), the run skeleton, the Trainers of the families, the parts they
share, the spec and `Trainer` protocol, the run, the configs. No module imports one of its
own layer or above, none imports a sibling inside a function (only optional dependencies are
imported there), and one module alone is the run skeleton.
"""

from __future__ import annotations

import ast
from pathlib import Path

import parl_algos.train
from parl_algos.train import SPECS, AlgorithmSpec

TRAIN = Path(parl_algos.train.__file__).parent
PREFIX = "parl_algos.train."

LAYERS = [
    {"__init__"},  # the package's face: it re-exports what the layers below define
    {"_cli"},
    {"_pbt"},  # population-based training reads a sweep's spaces and applies its parameters
    {"_registry", "_sweep"},  # a sweep runs the skeleton in its trials' actors
    {"_skeleton", "_export", "_a3c"},  # A3C and GA3C run the on-policy Trainer in single mode
    {"_on_policy", "_off_policy", "_recurrent", "_marl", "_offline"},
    {"_envs", "_evaluator", "_apex", "_marl_actors"},
    {"_spec"},
    {"_track"},
    {"_run"},
    {"_config"},
]
TRAINERS = {"_a3c", "_on_policy", "_off_policy", "_recurrent", "_marl", "_offline"}


def _imports() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Each module's sibling imports at module level, and those inside functions."""
    top: dict[str, set[str]] = {}
    inner: dict[str, set[str]] = {}
    for path in sorted(TRAIN.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top[path.stem], inner[path.stem] = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PREFIX):
                names = {node.module.removeprefix(PREFIX)}
            elif isinstance(node, ast.Import):
                names = {
                    a.name.removeprefix(PREFIX) for a in node.names if a.name.startswith(PREFIX)
                }
            else:
                continue
            (top if node in tree.body else inner)[path.stem] |= names
    return top, inner


def test_every_module_has_its_layer_and_imports_only_below_it():
    top, _ = _imports()
    layer = {name: i for i, names in enumerate(LAYERS) for name in names}
    assert set(layer) == set(top), "a module was added or removed: give it its layer"
    upward = sorted(
        (module, imported)
        for module, names in top.items()
        for imported in names
        if layer[imported] <= layer[module]
    )
    assert upward == []


def test_no_circle():
    top, _ = _imports()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join((*path, module))}"
        if module not in done:
            for imported in sorted(top[module]):
                visit(imported, (*path, module))
            done.add(module)

    for module in sorted(top):
        visit(module, ())


def test_no_sibling_is_imported_inside_a_function():
    _, inner = _imports()
    assert {module: names for module, names in inner.items() if names} == {}


def test_the_registry_is_imported_by_the_command_line_alone():
    top, _ = _imports()
    assert {m for m, names in top.items() if "_registry" in names} == {"_cli", "__init__"}
    assert not top["_skeleton"] & TRAINERS  # the spec, passed in, names the Trainer
    for module in TRAINERS:
        assert not top[module] & {"_cli", "_registry", "_skeleton"}, module


def test_one_skeleton_writes_run_directories():
    writers = {
        path.stem
        for path in TRAIN.glob("*.py")
        if '"config.toml"' in (text := path.read_text(encoding="utf-8")) or "signal.signal(" in text
    }
    assert writers == {"_skeleton"}


def test_specs_are_typed():
    assert all(isinstance(spec, AlgorithmSpec) for spec in SPECS.values())
    for path in TRAIN.glob("*.py"):
        assert "list[dict" not in path.read_text(encoding="utf-8"), path.name

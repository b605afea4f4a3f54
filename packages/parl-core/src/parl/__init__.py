"""PARL: a flexible, high-performance, distributed reinforcement-learning framework.

`import parl` is a lazy facade. It gives the names PARL users know -- `parl.Model`,
`parl.Algorithm`, `parl.Agent`, `parl.utils`, `parl.remote_class`, `parl.connect`,
`parl.algorithms`, `parl.samplers`, `parl.evo` -- and resolves each on first use (PEP 562), so
importing `parl` costs milliseconds and never imports torch. Names that live in sibling
distributions (parl-remote, parl-algos, parl-evo) raise an ImportError that says what to install
when the sibling is absent.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:  # pragma: no cover - for IDEs and type checkers only
    from parl import algorithms, evo, samplers, utils
    from parl._agent import Agent
    from parl._algorithm import Algorithm
    from parl._model import Model
    from parl_remote import (
        ClusterError,
        FutureGetRepeatedlyError,
        RemoteActorDiedError,
        RemoteAttributeError,
        RemoteError,
        RemoteSerializeError,
        ResourceError,
        SettingError,
        connect,
        disconnect,
        kill,
        remote_class,
    )
__all__ = [
    "Agent",
    "Algorithm",
    "ClusterError",
    "FutureGetRepeatedlyError",
    "Model",
    "RemoteActorDiedError",
    "RemoteAttributeError",
    "RemoteError",
    "RemoteSerializeError",
    "ResourceError",
    "SettingError",
    "__version__",
    "algorithms",
    "connect",
    "disconnect",
    "evo",
    "kill",
    "remote_class",
    "samplers",
    "utils",
]

# public name -> (module, attribute); attribute None means the module itself.
_LAZY: dict[str, tuple[str, str | None]] = {
    "Agent": ("parl._agent", "Agent"),
    "Algorithm": ("parl._algorithm", "Algorithm"),
    "Model": ("parl._model", "Model"),
    "utils": ("parl.utils", None),
    "algorithms": ("parl.algorithms", None),
    "samplers": ("parl.samplers", None),
    "evo": ("parl.evo", None),
    "connect": ("parl_remote", "connect"),
    "disconnect": ("parl_remote", "disconnect"),
    "kill": ("parl_remote", "kill"),
    "FutureGetRepeatedlyError": ("parl_remote", "FutureGetRepeatedlyError"),
    "remote_class": ("parl_remote", "remote_class"),
    "RemoteError": ("parl_remote", "RemoteError"),
    "RemoteActorDiedError": ("parl_remote", "RemoteActorDiedError"),
    "RemoteAttributeError": ("parl_remote", "RemoteAttributeError"),
    "RemoteSerializeError": ("parl_remote", "RemoteSerializeError"),
    "ResourceError": ("parl_remote", "ResourceError"),
    "ClusterError": ("parl_remote", "ClusterError"),
    "SettingError": ("parl_remote", "SettingError"),
}

# import name of a sibling distribution -> what to install to get it
_SIBLINGS = {
    "parl_remote": "parl-remote",
    "parl_algos": "parl-algos",
    "parl_evo": "parl-evo",
}


def _import_sibling(module: str, public_name: str) -> Any:
    """Import `module`, turning a missing sibling distribution into an actionable ImportError."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        dist = _SIBLINGS.get(exc.name or "")
        if dist is None:
            raise
        raise ImportError(
            f"parl.{public_name} needs the {dist!r} distribution, which is not installed; "
            f"install it with `pip install {dist}` (or `pip install -e packages/{dist}` "
            f"from a checkout of this repository)"
        ) from exc


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'parl' has no attribute {name!r}") from None
    module = _import_sibling(module_name, name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value  # cache: later look-ups never come back here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

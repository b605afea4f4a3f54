"""What a proxy class knows of the user's class: its methods, signatures and placement options.

`_ClassSpec` is made once per `@parl.remote_class` and shared by every engine: the handles bind
its method names, an engine places the actor by its options. `_running_loop` is the one check
an awaitable call makes before any engine sees it.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass

__all__: list[str] = []

_RESERVED = ("aio", "sync")


@dataclass(frozen=True)
class _MethodSpec:
    name: str
    is_async: bool
    signature: inspect.Signature | None


@dataclass(frozen=True)
class _ClassSpec:
    cls: type
    name: str
    methods: dict[str, _MethodSpec]
    wait: bool
    max_memory_mb: float
    n_gpu: int


def _method_specs(cls: type) -> dict[str, _MethodSpec]:
    specs = {}
    for name, static in inspect.getmembers_static(cls):
        if name.startswith("__") and name.endswith("__"):
            continue
        if isinstance(static, staticmethod | classmethod):
            func = getattr(cls, name)
            drop_first = False
        elif inspect.isfunction(static):
            func = static
            drop_first = True
        else:
            continue
        try:
            sig = inspect.signature(func)
            if drop_first:
                params = list(sig.parameters.values())[1:]
                sig = sig.replace(parameters=params)
        except (TypeError, ValueError):
            sig = None
        specs[name] = _MethodSpec(name, inspect.iscoroutinefunction(func), sig)
    return specs


def _check_reserved(cls: type) -> None:
    for klass in cls.__mro__[:-1]:  # everything but object
        for name in vars(klass):
            if name in _RESERVED or name.startswith("_parl_"):
                raise TypeError(
                    f"{cls.__qualname__} defines {name!r} (in {klass.__qualname__}), a name that "
                    f"@parl.remote_class reserves for its handles ({', '.join(_RESERVED)} and "
                    "_parl_*); rename it"
                )


def _running_loop(class_name: str, name: str) -> asyncio.AbstractEventLoop:
    """The running event loop of an awaitable call to `name`, or TypeError saying what to do."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise TypeError(
            f"{class_name} handle.aio.{name}(...) needs a running event loop: await it in "
            f"async code, or call handle.{name}(...) in plain code"
        ) from None

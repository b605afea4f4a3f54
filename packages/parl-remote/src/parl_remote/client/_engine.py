"""The engine seam: what the handles of `@parl.remote_class` ask of whatever runs their actors.

An engine places actors and carries their calls. The handles (`_remote_class`) and
`parl.connect` (`_connect`) know only the two interfaces below: `Engine`, this process's
membership in one cluster, and `ActorRef`, one actor as all the handles of a process share it.
The call core (`_call_core.ActorCore`) is every engine's: what a call means is decided there
once, whichever engine moves its bytes.

Engines are found by name (`parl.connect(backend=NAME)`) in the entry-point group
`parl_remote.engines`, the way the master finds its apps (`master/_apps.py`); parl-remote
declares its Ray engine so, and another distribution may declare one of its own:

    [project.entry-points."parl_remote.engines"]
    ray = "parl_remote.engines.ray:RayClient"

xparl, the default, is this registry's own (as SQLAlchemy's dialect registry holds its built-in
dialects by name and finds the others through entry points): it is there whatever an install's
metadata lists.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, cast

from parl_remote._exceptions import ClusterError
from parl_remote.client._call_core import ActorCore
from parl_remote.client._future import RemoteFuture
from parl_remote.client._spec import _ClassSpec

__all__ = ["ActorRef", "Engine", "EngineClass", "GROUP", "already_connected", "find", "names"]

GROUP = "parl_remote.engines"
DEFAULT = "xparl"
_BUILTIN = {DEFAULT: "parl_remote.engines.xparl:Client"}
_found: dict[str, EngineClass] = {}


class ActorRef(Protocol):
    """One actor as every handle of it in this process shares it, freed with the last."""

    client: Any  # the `Engine` that placed or adopted it
    spec: _ClassSpec
    actor_id: str
    core: ActorCore
    shadowed: tuple[str, ...]
    blocking: Any  # `.call(kind, name, args, kwargs)`: a blocking call, from any thread

    def acall(self, kind: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """An awaitable call, made now on the running loop."""

    def call_future(
        self, kind: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> RemoteFuture:
        """A future-mode call: made now, waited for with `get()`."""

    def where(self) -> tuple[Any, ...]:
        """What names this actor to another process, for its engine's `adopt` there."""


class Engine(Protocol):
    """This process's membership in one cluster, as the handles and `parl.connect` use it."""

    backend: str
    address: str
    _closed: bool

    @property
    def refs(self) -> Mapping[str, Any]:
        """Actor id -> its `ActorRef` in this process, while some handle of it lives."""

    def create_ref(
        self, spec: _ClassSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ActorRef:
        """Place a new actor and build its instance (blocking); its shared reference."""

    async def acreate_ref(
        self, spec: _ClassSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> ActorRef:
        """`create_ref` from async code."""

    def adopt(self, spec: _ClassSpec, actor_id: str, where: tuple[Any, ...]) -> ActorRef:
        """The reference of an actor whose handle arrived from another process."""

    def reconnect(
        self, address: str | None, cpu_num: int | None, distributed_files: Iterable[str]
    ) -> Engine:
        """`parl.connect(...)` again with this engine: itself, or ClusterError if it differs."""

    def kill(self, actor_id: str, reason: str) -> None:
        """Stop an actor now: its calls here and in every process fail with `reason`."""

    def preload(self, modules: list[str]) -> None:
        """Have the cluster's warm processes import `modules` now, ahead of any actor."""

    def after_fork(self) -> tuple[str, bytes | None] | None:
        """In a child made by `fork`: let this engine go, untouched; what rejoins its cluster."""

    def close(self) -> None:
        """Leave the cluster: every actor this process created is freed."""


class EngineClass(Protocol):
    """An engine as the registry finds it: how a process joins a cluster through it."""

    def __call__(self, *args: Any, **kwargs: Any) -> Engine: ...

    def prepare(
        self, address: str | None, *, tls: bool, cpu_num: int | None, preload: list[str]
    ) -> None:
        """Check `parl.connect`'s arguments (and what the engine needs) before anything else."""

    def connect(
        self,
        address: str | None,
        *,
        distributed_files: Iterable[str],
        log_to_driver: bool,
        cpu_num: int | None,
        inherited: tuple[str, bytes | None] | None,
    ) -> Engine:
        """Join the cluster at `address` (or start one); this process's engine."""

    def join(self, where: tuple[Any, ...]) -> Engine:
        """Connect this process where an arriving handle's actor lives (it was not connected)."""


def names() -> list[str]:
    """The engines this install knows: the built-in ones and its entry points, sorted."""
    return sorted({*_BUILTIN, *(ep.name for ep in importlib.metadata.entry_points(group=GROUP))})


def find(backend: str) -> EngineClass:
    """The engine called `backend`, or ValueError naming the engines there are."""
    engine = _found.get(backend)
    if engine is not None:
        return engine
    target = _BUILTIN.get(backend)
    if target is None:
        points = importlib.metadata.entry_points(group=GROUP, name=backend)
        point = next(iter(points), None)
        if point is None:
            raise ValueError(
                f"connect: {backend=} is not one of {', '.join(map(repr, names()))} (engines are "
                f"entry points of the group {GROUP!r}; after upgrading parl-remote, reinstall it "
                "so that its own are listed)"
            )
        target = point.value
    module, _, attr = target.partition(":")
    engine = cast(EngineClass, getattr(importlib.import_module(module), attr))
    _found[backend] = engine
    return engine


def already_connected(engine: Engine) -> ClusterError:
    """The error of `parl.connect` asking for another cluster than this process's."""
    return ClusterError(
        f"already connected to {engine.address} (backend={engine.backend!r}); call "
        "parl.disconnect() first to connect differently"
    )

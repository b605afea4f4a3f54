"""The envelopes between a worker and its actor processes, over their private socket pair.

Part of the one `Message` union of `messages.py`, which re-exports them; kept apart only to keep
each module short.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "ActorInitialized",
    "ActorStats",
    "Assign",
    "Assigned",
    "HostReady",
    "LeaveSession",
    "PausePreload",
    "Preload",
    "Preloaded",
]


class _Msg(msgspec.Struct, frozen=True, tag=True, array_like=True, forbid_unknown_fields=False):
    """Base of these envelopes: the same settings as `messages._Msg`."""


class ActorStats(_Msg, frozen=True):
    """How one actor process is doing, sampled by its worker."""

    actor_id: str
    cpu_percent: float
    rss_bytes: int
    calls: int = 0
    errors: int = 0
    busy: bool = False


class HostReady(_Msg, frozen=True):
    """A warm process is listening on `port` and waits for an actor."""

    port: int
    pid: int


class Preload(_Msg, frozen=True):
    """Import these modules in the background while no actor is assigned (`_preload`)."""

    modules: list[str]


class PausePreload(_Msg, frozen=True):
    """Hold the preloading at the next module (`paused`), or go on with it (`_preload`)."""

    paused: bool


class Preloaded(_Msg, frozen=True):
    """The warm process went through the first `done` module names it was sent."""

    done: int


class Assign(_Msg, frozen=True):
    """This process now belongs to actor `actor_id`: set `env`, expect the client's `Init`."""

    actor_id: str
    client_id: str
    class_name: str
    env: dict[str, str] = {}
    workdir: str = ""
    own_session: bool = True
    """Leave the worker's session for one of its own first (`LeaveSession`)."""


class LeaveSession(_Msg, frozen=True):
    """Leave the worker's session for one of its own (`setsid`), if still in it."""


class Assigned(_Msg, frozen=True):
    """The process took the assignment."""

    actor_id: str


class ActorInitialized(_Msg, frozen=True):
    """The actor's constructor returned; `ok` False when it raised; what it `imports`."""

    actor_id: str
    ok: bool
    imports: list[str] = []

"""The I/O-free core of calls to actors: what is sent, what comes back, and what it means.

Every decision about a call is made here, once, for the drivers that only move its bytes (xparl's
two, blocking and pipelined, in `engines/xparl/_drivers.py`; Ray's calls in `engines/ray`):

- `ActorCore` is the bookkeeping of one actor: its call ids (one counter for every call to it,
  whichever driver carries it), the `Init` and `Call` messages (arguments pickled with their
  arrays out of band, as views of the caller's memory: whether they are copied, or written
  into shared memory, before a later send is the connection's to decide, `connection.hold`), the
  reading of `Ready` / `Result` / `Error` replies into values or exceptions, and the actor's
  fate (dead, and why) with the texts of the errors a caller then sees.
- `Replies` matches replies to the requests waiting for them on one connection, by the id that
  `message_id` reads; the pipelined driver, the client's requests to the master and `xparl`'s
  all use it.

No sockets, event loops, threads or clocks: the tests drive it with plain messages.
"""

from __future__ import annotations

import inspect
import itertools
import pickle
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from parl_remote._exceptions import (
    RemoteActorDiedError,
    RemoteAttributeError,
    RemoteError,
    RemoteSerializeError,
)
from parl_remote.wire import _serialize as ser
from parl_remote.wire.protocol import messages as m

__all__ = ["ActorCore", "Replies", "error_from", "init_payload", "message_id"]

W = TypeVar("W")
INIT = "__init__"
_NONE = pickle.dumps(None, protocol=5)
_METHOD, _GETATTR, _SETATTR = m.CallKind.METHOD, m.CallKind.GETATTR, m.CallKind.SETATTR
_CALL_IDS = (m.Call, m.Result, m.Error)
_INIT_IDS = (m.Init, m.Ready)


def message_id(msg: Any) -> int | None:
    """The id a request carries and its reply repeats; None for a message that is neither.

    A call's `id` (its `Result` or `Error` repeats it), 0 for `Init` and its `Ready` (whose
    `Error` has id 0 too), a master request's `request_id`.
    """
    kind = type(msg)
    if kind in _CALL_IDS:
        call_id: int = msg.id
        return call_id
    if kind in _INIT_IDS:
        return 0
    return getattr(msg, "request_id", None)


class Replies(Generic[W]):
    """The requests waiting for a reply on one connection, each under its id.

    A driver registers a waiter with `expect` when it sends, hands every message it receives
    to `match` (which returns the waiter it answers, or None), and on losing the connection
    takes every waiter left with `take_all` to fail them.
    """

    __slots__ = ("_waiting",)

    def __init__(self) -> None:
        self._waiting: dict[int, W] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def expect(self, key: int, waiter: W) -> None:
        """Wait for the reply to the request with id `key`."""
        if key in self._waiting:
            raise ValueError(f"a request with id {key} is already waiting for its reply")
        self._waiting[key] = waiter

    def match(self, reply: Any) -> W | None:
        """The waiter `reply` answers (no longer waiting), or None if it answers none."""
        key = message_id(reply)
        return None if key is None else self._waiting.pop(key, None)

    def forget(self, key: int) -> None:
        """Stop waiting for the reply to `key` (its caller gave up)."""
        self._waiting.pop(key, None)

    def take_all(self) -> list[W]:
        """Every waiter still waiting, in the order they were registered; none is left."""
        waiters, self._waiting = self._waiting, {}
        return list(waiters.values())


def error_from(msg: m.Error, where: str) -> BaseException:
    """The exception an `Error` reply stands for, raised in the caller."""
    if msg.kind == "raised":
        return ser.loads_exception(msg.payload, msg.type_name, msg.message, msg.traceback, where)
    if msg.kind == "attribute":
        return RemoteAttributeError(f"{msg.message} (in {where})")
    if msg.kind == "serialize":
        text = msg.message + (
            f"\n--- remote traceback ---\n{msg.traceback}" if msg.traceback else ""
        )
        return RemoteSerializeError(text)
    return RemoteError(f"{where}: {msg.message}")


def init_payload(
    cls: type[Any], name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[bytes, list[Any]]:
    """Pickle `(cls, args, kwargs)` for `Init`, after checking the arguments fit `cls`."""
    if cls.__init__ is not object.__init__:
        try:
            inspect.signature(cls).bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{name}(): {exc}") from None
    try:
        return ser.dumps((cls, args, kwargs))
    except Exception as exc:
        named = {f"the class {name}": cls}
        named.update(_named_arguments(args, kwargs))
        raise RemoteSerializeError(
            f"cannot send {name}(...) to the cluster: {ser.find_culprit(named)}"
        ) from exc


def _named_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    named = {f"argument {i}": a for i, a in enumerate(args)}
    named.update({f"argument {k!r}": v for k, v in kwargs.items()})
    return named


def _ignore(names: tuple[str, ...]) -> None:
    pass


class ActorCore:
    """Call bookkeeping and fate of one actor (see the module docstring).

    Args:
        class_name: the actor's class, for messages.
        assigned: the master's answer that placed the actor (its id, address and pid).
    """

    def __init__(self, class_name: str, assigned: m.ActorAssigned) -> None:
        self.class_name = class_name
        self.actor_id = assigned.actor_id
        self.host, self.port, self.pid = assigned.host, assigned.port, assigned.pid
        self.dead: str | None = None
        self.ids = itertools.count(1)  # every call's id, whichever driver carries it
        self.on_shadowed: Callable[[tuple[str, ...]], None] = _ignore  # set by the handles

    def __repr__(self) -> str:
        return f"{self.class_name} actor {self.actor_id} at {self.host}:{self.port}"

    # -- requests ------------------------------------------------------------------------------
    def init(self, payload: bytes, buffers: list[Any], bundle: bytes) -> tuple[Any, ...]:
        """`(Init, buffers)` building the actor from `init_payload`'s pickle and the code bundle."""
        return m.Init(self.actor_id, payload, bundle), buffers

    def call(
        self,
        kind: m.CallKind,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> tuple[Any, ...]:
        """`(Call, buffers)` for a method call, an attribute read or an attribute write.

        Arrays among the arguments travel out of band as views of the caller's memory: a
        driver that sends the call after returning to its caller holds them first
        (`connection.hold`: into a segment of the connection's shared memory, or copied).
        """
        buffers: list[Any]
        # Arguments are not checked against the signature here (it would cost more than the
        # call): a mismatch raises the method's own TypeError, from the actor.
        try:
            if kind == _METHOD:
                if ser.plain_args(args, kwargs):  # sent as themselves: nothing to pickle
                    return m.Call(next(self.ids), name, b"", kind, args), []
                data, buffers = ser.dumps((args, kwargs))
            elif kind == _GETATTR:
                data, buffers = _NONE, []
            else:
                data, buffers = ser.dumps(args[0])
        except Exception as exc:
            raise self._unsendable(kind, name, args, kwargs) from exc
        return m.Call(next(self.ids), name, data, kind), buffers

    def _unsendable(
        self, kind: m.CallKind, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> RemoteSerializeError:
        if kind == _SETATTR:
            named = {f"the value for {name!r}": args[0]}
        else:
            named = _named_arguments(args, kwargs)
        return RemoteSerializeError(
            f"cannot send the arguments of {self.class_name}.{name}() to the actor: "
            f"{ser.find_culprit(named)}"
        )

    # -- replies -------------------------------------------------------------------------------
    def result(self, reply: Any, buffers: tuple[Any, ...], name: str) -> Any:
        """The value a reply to `name` (INIT for `Init`) carries, or raise the error it reports.

        For `Init`, the value is the names of the class's methods that instance attributes hide.
        """
        kind = type(reply)
        if kind is m.Result:
            if reply.shadowed:  # attributes now hide these methods (`_shadow.py`)
                self.on_shadowed(tuple(reply.shadowed))
            if not reply.payload:
                return reply.value  # a plain value, sent as itself
            try:
                return pickle.loads(reply.payload, buffers=buffers)
            except Exception as exc:
                raise RemoteSerializeError(
                    f"the result of {self.class_name}.{name}() could not be unpickled here: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        if kind is m.Error:
            raise error_from(reply, f"{self.class_name}.{name}() of actor {self.actor_id}")
        if kind is m.Ready and name == INIT:
            return tuple(reply.shadowed)
        raise RemoteError(
            f"{self.class_name} actor {self.actor_id} answered {kind.__name__} to {name}()"
        )

    # -- fate ----------------------------------------------------------------------------------
    def mark_dead(self, reason: str) -> None:
        """The actor is gone (the first reason given stays)."""
        if self.dead is None:
            self.dead = reason

    def fate_error(self, reason: str | None) -> RemoteError:
        """The error for a call whose connection broke, given what the master says.

        `reason` is why the actor died, or None while the master counts it alive: then only
        the connection was lost.
        """
        if self.dead is None:
            if reason is None:
                return self.lost_error()
            self.dead = reason
        return self.died_error()

    def died_error(self) -> RemoteActorDiedError:
        """The error of every call once the actor is dead."""
        error = RemoteActorDiedError(
            f"{self.class_name} actor {self.actor_id} (pid {self.pid} on {self.host}) died: "
            f"{self.dead}. This call and every later call on it fail; create a new actor to go on."
        )
        error.actor_id = self.actor_id
        return error

    def lost_error(self) -> RemoteError:
        """The error of a call whose connection broke while the actor lives on."""
        error = RemoteError(
            f"lost the connection to {self.class_name} actor {self.actor_id} (pid {self.pid} on "
            f"{self.host}), which the master still counts alive; the call may or may not have "
            "run. Later calls connect again."
        )
        error.actor_id = self.actor_id
        return error

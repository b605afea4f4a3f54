"""Errors of the remote runtime: every failure a caller can see derives from `RemoteError`.

The tree::

    RemoteError                      a remote operation failed
    ├── RemoteActorDiedError         the actor's process is gone (crash, exit, memory limit,
    │                                lost worker, freed); this and every later call fail
    ├── RemoteSerializeError         an argument or result cannot be pickled / unpickled
    ├── RemoteAttributeError         the actor has no such attribute (also an AttributeError)
    ├── RemoteMethodError            a method raised an exception that cannot be re-raised
    │                                as its own type (the original type is in the message)
    ├── ResourceError                no CPU/GPU slot became free within the bounded wait
    ├── FutureGetRepeatedlyError     `get()` on a future whose result was already taken
    ├── NotConnectedError            no cluster: call `parl.connect` first, or it was lost
    ├── SettingError                 a `PARL_*` environment variable holds a value it does not
    │                                accept (also a ValueError)
    └── ClusterError                 the cluster refused or failed a request
        ├── AuthenticationError      wrong or missing cluster token (refused on both ends)
        ├── MasterUnreachableError   the master cannot be reached now (stopped, restarting,
        │                            the network down); the client reconnects by itself
        └── ProtocolError            a peer sent bytes that break the protocol

An exception raised by a user's method is re-raised in the caller as its own type whenever it
can be pickled, with the remote traceback attached as a note; the actor stays alive.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "ClusterError",
    "FutureGetRepeatedlyError",
    "MasterUnreachableError",
    "NotConnectedError",
    "ProtocolError",
    "RemoteActorDiedError",
    "RemoteAttributeError",
    "RemoteError",
    "RemoteMethodError",
    "RemoteSerializeError",
    "ResourceError",
    "SettingError",
]


class RemoteError(Exception):
    """Base class of every failure of a remote operation."""

    actor_id: str = ""
    """The actor whose call failed, where a call on a known actor failed ("" otherwise)."""


class RemoteActorDiedError(RemoteError):
    """The actor's process is gone; the pending call and every later one raise this."""


class RemoteSerializeError(RemoteError):
    """An argument or a result could not be pickled or unpickled; the message names it."""


class RemoteAttributeError(RemoteError, AttributeError):
    """The remote object has no attribute of that name."""


class RemoteMethodError(RemoteError):
    """A remote method raised an exception that could not be re-raised as its own type."""


class ResourceError(RemoteError):
    """No free CPU (or GPU) slot appeared within the bounded wait stated in the message."""


class FutureGetRepeatedlyError(RemoteError):
    """`get()` was called again on a future whose result was already taken."""


class NotConnectedError(RemoteError):
    """There is no cluster to talk to: call `parl.connect(...)` first."""


class SettingError(RemoteError, ValueError):
    """A `PARL_*` environment variable holds a value it does not accept.

    The message names the variable, its value, what it accepts and what to do; processes and
    commands check the whole environment as they start (`check_env`).
    """


class ClusterError(RemoteError):
    """The cluster refused or failed a request."""


class AuthenticationError(ClusterError):
    """The peer does not know the cluster token (or we do not)."""


class MasterUnreachableError(ClusterError):
    """The master cannot be reached now: actors already made keep working.

    The client reconnects by itself; a request made again once it has can succeed.
    """


class ProtocolError(ClusterError):
    """A peer sent bytes that do not follow the protocol; that connection is closed."""

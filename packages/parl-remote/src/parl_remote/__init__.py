"""parl_remote: the cluster runtime behind `parl.remote_class`, `parl.connect` and `xparl`.

import parl

parl.connect("localhost:8010")      # or parl.connect() for a local cluster

@parl.remote_class
class Actor:
    def add(self, a, b):
        return a + b

actor = Actor()
actor.add(1, 2)                      # 3, computed in another process
await actor.aio.add(1, 2)            # the same, from async code
"""

from __future__ import annotations

from parl_remote._client import connect, disconnect
from parl_remote._drivers import RemoteFuture
from parl_remote._exceptions import (
    AuthenticationError,
    ClusterError,
    FutureGetRepeatedlyError,
    NotConnectedError,
    ProtocolError,
    RemoteActorDiedError,
    RemoteAttributeError,
    RemoteError,
    RemoteMethodError,
    RemoteSerializeError,
    ResourceError,
)
from parl_remote._remote_class import ActorHandle, AsyncActorHandle, remote_class

__all__ = [
    "ActorHandle",
    "AsyncActorHandle",
    "AuthenticationError",
    "ClusterError",
    "FutureGetRepeatedlyError",
    "NotConnectedError",
    "ProtocolError",
    "RemoteActorDiedError",
    "RemoteAttributeError",
    "RemoteError",
    "RemoteFuture",
    "RemoteMethodError",
    "RemoteSerializeError",
    "ResourceError",
    "connect",
    "disconnect",
    "remote_class",
]

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

`Registry` and the frozen status records (`ClusterStatus`, ...) are the reading side of the
master's registry, for apps the master serves (the dashboard; see the entry-point group
`parl_remote.master_apps`). `host_id()` names this host: processes whose ids are equal share
its memory (the actors' connections and the samplers move large arrays through it);
`parl_remote.shm` is that memory's API (segments, pools, a wake-up signal). Actors created
within `replacing(dead_actor_id)` are recorded as that dead actor's replacements.
`check_env()` checks the `PARL_*` settings of the environment (`SettingError` names a bad one);
`connect` calls it.
"""

from __future__ import annotations

from parl_remote._config import check_env
from parl_remote._exceptions import (
    AuthenticationError,
    ClusterError,
    FutureGetRepeatedlyError,
    MasterUnreachableError,
    NotConnectedError,
    ProtocolError,
    RemoteActorDiedError,
    RemoteAttributeError,
    RemoteError,
    RemoteMethodError,
    RemoteSerializeError,
    ResourceError,
    SettingError,
)
from parl_remote.client._connect import connect, disconnect
from parl_remote.client._future import RemoteFuture
from parl_remote.client._remote_class import ActorHandle, AsyncActorHandle, kill, remote_class
from parl_remote.client._replacing import replacing
from parl_remote.master._registry import Registry
from parl_remote.master._status import (
    ActorPage,
    ActorStatus,
    ClientStatus,
    ClusterStatus,
    ClusterTotals,
    LogPage,
    MasterStatus,
    WorkerStatus,
)
from parl_remote.wire._shm import host_id

__all__ = [
    "ActorHandle",
    "ActorPage",
    "ActorStatus",
    "AsyncActorHandle",
    "AuthenticationError",
    "ClientStatus",
    "ClusterError",
    "ClusterStatus",
    "ClusterTotals",
    "FutureGetRepeatedlyError",
    "LogPage",
    "MasterStatus",
    "MasterUnreachableError",
    "NotConnectedError",
    "ProtocolError",
    "Registry",
    "RemoteActorDiedError",
    "RemoteAttributeError",
    "RemoteError",
    "RemoteFuture",
    "RemoteMethodError",
    "RemoteSerializeError",
    "ResourceError",
    "SettingError",
    "WorkerStatus",
    "check_env",
    "connect",
    "disconnect",
    "host_id",
    "kill",
    "remote_class",
    "replacing",
]

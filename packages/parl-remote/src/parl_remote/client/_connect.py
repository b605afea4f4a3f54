"""This process's client: `parl.connect`, `parl.disconnect` and the one client per process.

A process has at most one client at a time, kept here: an xparl `Client`, or a `RayClient`
with `backend="ray"` (the engine that places actors on Ray). `connect()` makes it (joining a
cluster at an address, or starting an embedded one), `current_client()` returns it, and
`disconnect()` closes it. After `fork`, the child forgets the parent's client without touching
its sockets or threads, and its first `connect` (or actor) joins the same cluster afresh.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal, NoReturn, overload

from parl_remote._config import load_token
from parl_remote._exceptions import (
    AuthenticationError,
    ClusterError,
    NotConnectedError,
)
from parl_remote.engines.xparl._client import Client, _parse_address
from parl_remote.security import _tls_context, _tls_join

if TYPE_CHECKING:
    from parl_remote.engines.ray._client import RayClient

__all__ = ["connect", "current_client", "disconnect"]

logger = logging.getLogger(__name__)

BACKENDS = ("xparl", "ray")
_client: Client | RayClient | None = None
_client_lock = threading.Lock()
_inherited: tuple[str, bytes | None] | None = None  # after fork: the parent's cluster and token
_orphans: list[Client] = []  # clients inherited through fork: kept, never used or closed


def _after_fork_in_child() -> None:
    """In a child made by `fork`: forget the parent's client, remember its cluster."""
    global _client, _client_lock, _inherited
    _client_lock = threading.Lock()
    parent, _client = _client, None
    if parent is not None and not isinstance(parent, Client):
        parent.abandon()  # a Ray driver's state does not survive fork
    elif parent is not None and not parent._closed:
        _inherited = (parent.address, parent.token)
        parent.abandon()
        _orphans.append(parent)


os.register_at_fork(after_in_child=_after_fork_in_child)


def current_client() -> Client | RayClient:
    """The client of this process, or NotConnectedError saying to call `parl.connect`.

    In a child made by `fork` of a connected process, the first use connects a client of its
    own to the parent's cluster.
    """
    client = _client
    if (client is None or client._closed) and _inherited is not None:
        client = connect(_inherited[0])
    if client is None or client._closed:
        raise NotConnectedError(
            "not connected to a PARL cluster: call parl.connect('HOST:PORT') (or parl.connect() "
            "for a local cluster) before creating remote actors"
        )
    return client


@overload
def connect(
    address: str | None = None,
    *,
    distributed_files: Iterable[str] = (),
    log_to_driver: bool = True,
    cpu_num: int | None = None,
    tls: bool = False,
    backend: Literal["xparl"] = "xparl",
) -> Client | RayClient: ...


@overload
def connect(
    address: str | None = None,
    *,
    distributed_files: Iterable[str] = (),
    log_to_driver: bool = True,
    cpu_num: int | None = None,
    tls: bool = False,
    backend: Literal["ray"],
) -> RayClient: ...


def connect(
    address: str | None = None,
    *,
    distributed_files: Iterable[str] = (),
    log_to_driver: bool = True,
    cpu_num: int | None = None,
    tls: bool = False,
    backend: Literal["xparl", "ray"] = "xparl",
) -> Client | RayClient:
    """Join a PARL cluster (or a Ray cluster), or start a local one.

    Args:
        address: the master, "HOST:PORT" (as printed by `xparl start`). Without it, a local
            cluster (a master and a worker with `cpu_num` slots, all cores by default) starts,
            owned by this process and stopped when it exits. With `backend="ray"`: what
            `ray.init(address=...)` takes ("auto", "HOST:PORT", "ray://HOST:10001"); without
            it, a local Ray (or the one `RAY_ADDRESS` names).
        distributed_files: files every actor needs beside it (globs and folders, relative to
            the current directory); each pattern must match something. Your own modules are
            shipped without listing them.
        log_to_driver: also print what actors print here, prefixed with the actor's id.
        cpu_num: CPU slots of the local cluster (only without `address`). A local cluster this
            process already started with at least that many slots is reused; `connect()` with
            no arguments returns this process's client, whichever its backend.
        tls: speak TLS 1.3 to the cluster (start a local one with TLS), as `PARL_TLS=1` does;
            this process and those it starts then never speak plaintext.
        backend: "xparl" (PARL's own cluster) or "ray" (actors placed on Ray; needs
            `pip install "parl-remote[ray]"`). A Ray that `connect` starts is shut down when
            the process exits; one this process had already joined is left as it is.

    Raises:
        NotConnectedError: no master answers at `address`.
        AuthenticationError: the master refused our cluster token.
        ValueError: a bad address or backend, `tls` with Ray, or a `distributed_files` pattern
            that matches nothing.
        ImportError: `backend="ray"` without Ray installed.
    """
    if backend not in BACKENDS:
        raise ValueError(f"connect: {backend=} is not one of {', '.join(map(repr, BACKENDS))}")
    if backend == "ray":
        if tls:
            raise ValueError(
                "connect: tls=True applies to PARL's own clusters; a Ray cluster's traffic is "
                "secured by Ray's TLS settings (RAY_USE_TLS and its certificates)"
            )
        return _connect_ray(address, distributed_files, log_to_driver, cpu_num)
    global _client
    if tls:
        os.environ["PARL_TLS"] = "1"
    with _client_lock:
        current = _client
        if current is not None and not current._closed:
            if not isinstance(current, Client):
                if address is None and cpu_num is None and not distributed_files:
                    return current  # `parl.connect()`: this process's cluster, Ray too
                _already(current)
            if address is not None:
                same_cluster = _parse_address(address) == (current.host, current.port)
            else:  # no address: this process's cluster, if it is local and big enough
                same_cluster = cpu_num is None or (
                    current.cluster is not None and current.cluster.cpu_num >= cpu_num
                )
            if same_cluster and not distributed_files:
                return current
            raise ClusterError(
                f"already connected to {current.address}"
                + (
                    f" (a local cluster of {current.cluster.cpu_num} slots)"
                    if current.cluster
                    else ""
                )
                + "; call parl.disconnect() first to connect differently"
            )
        files = list(distributed_files)
        cluster = None
        token: bytes | None
        if address is None:
            from parl_remote.engines.xparl._cluster import EmbeddedCluster

            cluster = EmbeddedCluster.start(cpu_num=cpu_num)
            address, token = cluster.address, cluster.token
            logger.info("started a local PARL cluster at %s (%s)", address, cluster.describe())
            if cluster.dashboard_url:
                logger.info("PARL dashboard: %s", cluster.dashboard_url)
        else:
            if cpu_num is not None:
                raise ValueError("cpu_num sets the size of a local cluster; it needs address=None")
            _parse_address(address)
            token = load_token()
            if _inherited is not None and _parse_address(_inherited[0]) == _parse_address(address):
                token = _inherited[1]
            if token is None:
                raise AuthenticationError(
                    "no cluster token: set PARL_CLUSTER_TOKEN to the token of the cluster at "
                    f"{address} (on the master's machine: the file that `xparl start` created)"
                )
        try:
            host, port = _parse_address(address)
            _tls_join.trust(host, port, token)  # with TLS: the cluster CA, checked by the token
            client = Client(
                address,
                token=token,
                distributed_files=files,
                log_to_driver=log_to_driver,
                cluster=cluster,
            )
            client.start()
        except BaseException:
            if cluster is not None:
                cluster.stop()
            raise
        _client = client
        atexit.register(client.close)
        return client


def _already(client: Client | RayClient) -> NoReturn:
    raise ClusterError(
        f"already connected to {client.address} (backend={client.backend!r}); call "
        "parl.disconnect() first to connect differently"
    )


def _connect_ray(
    address: str | None, distributed_files: Iterable[str], log_to_driver: bool, cpu_num: int | None
) -> RayClient:
    from parl_remote.engines.ray._client import RayClient, import_ray

    import_ray()  # without Ray: the ImportError that names the install command, first
    global _client
    with _client_lock:
        if _client is not None and not _client._closed:
            if isinstance(_client, RayClient) and not distributed_files:
                return _client
            _already(_client)
        client = RayClient.start(
            address,
            distributed_files=distributed_files,
            log_to_driver=log_to_driver,
            cpu_num=cpu_num,
        )
        _client = client
        atexit.register(client.close)
        return client


def disconnect() -> None:
    """Leave the cluster: every actor of this process is freed (a local cluster stops)."""
    global _client
    with _client_lock:
        client, _client = _client, None
    if client is not None:
        client.close()
    _tls_context.forget()

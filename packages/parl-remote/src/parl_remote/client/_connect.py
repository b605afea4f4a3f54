"""This process's engine: `parl.connect`, `parl.disconnect` and the one engine per process.

A process is a member of at most one cluster at a time, through one engine (`_engine`): an
xparl `Client`, or, with `backend="ray"`, the Ray engine. `connect()` makes it (joining a
cluster at an address, or starting a local one), `current_client()` returns it, and
`disconnect()` closes it. After `fork`, the child forgets the parent's engine without touching
its sockets or threads, and its first `connect` (or actor) joins the same cluster afresh.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Iterable

from parl_remote._config import check_env
from parl_remote._exceptions import NotConnectedError
from parl_remote.actor._preload import preload_names
from parl_remote.client import _engine
from parl_remote.client._engine import Engine
from parl_remote.security import _tls_context

__all__ = ["connect", "current_client", "disconnect"]

_client: Engine | None = None
_client_lock = threading.Lock()
_inherited: tuple[str, bytes | None] | None = None  # after fork: the parent's cluster and token
_orphans: list[Engine] = []  # engines inherited through fork: kept, never used or closed


def _after_fork_in_child() -> None:
    """In a child made by `fork`: forget the parent's engine, remember its cluster."""
    global _client, _client_lock, _inherited
    _client_lock = threading.Lock()
    parent, _client = _client, None
    if parent is not None:
        rejoin = parent.after_fork()
        if rejoin is not None:
            _inherited = rejoin
        _orphans.append(parent)


os.register_at_fork(after_in_child=_after_fork_in_child)


def current_client() -> Engine:
    """The engine of this process, or NotConnectedError saying to call `parl.connect`.

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


def connect(
    address: str | None = None,
    *,
    distributed_files: Iterable[str] = (),
    log_to_driver: bool = True,
    cpu_num: int | None = None,
    tls: bool = False,
    backend: str = "xparl",
    preload: Iterable[str] = (),
) -> Engine:
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
        preload: installed modules (`["torch"]`) that the cluster's warm actor processes
            import now, ahead of any actor, so that the first actor of a class that imports
            them starts as fast as the later ones (xparl; as `xparl start --preload`).
        backend: "xparl" (PARL's own cluster), "ray" (actors placed on Ray; needs
            `pip install "parl-remote[ray]"`), or another installed engine's name. A Ray
            that `connect` starts is shut down when the process exits; one this process had
            already joined is left as it is.

    Raises:
        NotConnectedError: no master answers at `address`.
        AuthenticationError: the master refused our cluster token.
        SettingError: a `PARL_*` environment variable holds a value it does not accept (also
            a ValueError).
        ValueError: a bad address or backend, `tls` with Ray, or a `distributed_files` pattern
            that matches nothing.
        ImportError: `backend="ray"` without Ray installed.
    """
    check_env()
    engine = _engine.find(backend)
    modules = preload_names(preload)
    engine.prepare(address, tls=tls, cpu_num=cpu_num, preload=modules)
    client = _connect(engine, address, distributed_files, log_to_driver, cpu_num, backend)
    if modules:
        client.preload(modules)
    return client


def _connect(
    engine: _engine.EngineClass,
    address: str | None,
    distributed_files: Iterable[str],
    log_to_driver: bool,
    cpu_num: int | None,
    backend: str,
) -> Engine:
    global _client
    with _client_lock:
        current = _client
        if current is not None and not current._closed:
            if current.backend == backend:
                return current.reconnect(address, cpu_num, distributed_files)
            no_arguments = address is None and cpu_num is None and not distributed_files
            if backend == _engine.DEFAULT and no_arguments:
                return current  # `parl.connect()`: this process's cluster, whichever it is
            raise _engine.already_connected(current)
        client = engine.connect(
            address,
            distributed_files=distributed_files,
            log_to_driver=log_to_driver,
            cpu_num=cpu_num,
            inherited=_inherited,
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

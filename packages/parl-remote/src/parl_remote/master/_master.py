"""The master: the cluster's control plane, and its one source of truth.

Workers register their slots with it; clients ask it for actors. It places each actor on a
worker with a free slot (and the GPUs asked for; the decisions are `_placement`'s, this module
sends them and keeps their timer), hands the client the actor's address, and from then on stays
off the call path: calls go straight from client to actor. It watches heartbeats
both ways, frees the actors of clients that disappear, tells clients when their actors die and
why, keeps each actor's recent output, and answers `xparl status` (and serves the dashboard,
or whichever app is registered under the entry-point group `parl_remote.master_apps`, see
`_apps`) from the same registry.

A master killed without `xparl stop` can be started again on the same port: workers
re-register with the actors they kept, clients reconnect, and the registry is rebuilt.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterable
from typing import Any, ClassVar

from parl_remote._config import check_env, load_token, settings
from parl_remote._exceptions import ProtocolError, SettingError
from parl_remote._loop import run
from parl_remote._util import owner_alive, write_json_atomic
from parl_remote.actor._preload import learn, preload_names
from parl_remote.master._apps import serve_master_app
from parl_remote.master._collector import Collector
from parl_remote.master._placement import Placement, Send
from parl_remote.master._registry import ActorInfo, ClientInfo, Registry, WorkerInfo
from parl_remote.wire._transport import AsyncConnection, serve_async
from parl_remote.wire.protocol import messages as m

__all__ = ["Master", "main"]

logger = logging.getLogger(__name__)

_SWEEP_SLICE = 64  # peers the liveness sweep visits between two turns of the loop
_COLLECT_S = 1.0  # between two steps of the garbage collector (`_collector`)


class Master:
    """The master process's state; `run()` serves until `xparl stop` (or its owner exits).

    `preload` names installed modules that every warm process of the cluster imports before
    any actor asked for them (`xparl start --preload`), beside what actors import.
    `collect_garbage` runs the garbage collector in short steps (`_collector`), for a process
    that is only a master.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        token: bytes | None,
        owner_pid: int | None = None,
        ready_file: str | None = None,
        monitor_port: int | None = None,
        preload: Iterable[str] = (),
        collect_garbage: bool = False,
    ) -> None:
        self.host, self.port = host, port
        self.collect_garbage = collect_garbage
        self.token = token
        self.owner_pid = owner_pid
        self.ready_file = ready_file
        self.monitor_port = monitor_port
        self.registry = Registry(
            uuid.uuid4().hex[:12],
            settings.log_lines_per_actor,
            lost_for_s=settings.master_grace_s + settings.heartbeat_timeout_s,
        )
        self.placement = Placement(self.registry)
        self._deadline: asyncio.TimerHandle | None = None  # of the oldest waiting request
        self._adopted: dict[str, float] = {}  # actor id -> when its client must be back
        self._done: asyncio.Future[Any] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None
        self.dashboard_url: str | None = None
        self._dashboard: Any = None  # the dashboard's aiohttp AppRunner, while it serves
        self.preload: dict[str, None] = {}  # modules the cluster's actors imported (`_preload`)
        learn(self.preload, list(preload), "--preload")

    # -- life ------------------------------------------------------------------------------
    async def run(self) -> None:
        """Serve until stopped."""
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop, f"received {signal.Signals(sig).name}")
        self._server = await serve_async(
            self.host,
            self.port,
            token=self.token,
            role="master",
            on_message=self._on_message,
            on_close=self._on_close,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.registry.set_master_info(host=self.host, port=self.port, pid=os.getpid())
        self._spawn(self._liveness())
        if self.collect_garbage:
            self._spawn(self._collect())
        if self.owner_pid:
            self._spawn(self._watch_owner())
        logger.info("master listening on %s:%d", self.host, self.port)
        await self._start_dashboard()
        if self.ready_file:
            write_json_atomic(
                self.ready_file,
                {
                    "port": self.port,
                    "pid": os.getpid(),
                    "host": self.host,
                    "dashboard": self.dashboard_url,
                },
            )
        try:
            await self._done
        finally:
            self._server.close()
            for worker in list(self.registry.workers.values()):
                with contextlib.suppress(ConnectionError):
                    worker.conn.send(m.ShutdownWorker("the master stopped"))
            await asyncio.sleep(0.05)  # let the shutdown messages out
            if self._dashboard is not None:
                await self._dashboard.cleanup()

    async def _start_dashboard(self) -> None:
        """Serve the registered master app (the dashboard) on `monitor_port`, if one is."""
        if self.monitor_port is None:
            return
        served = await serve_master_app(self.registry, self.host, self.monitor_port, self.token)
        if served is not None:
            self._dashboard, self.dashboard_url = served.runner, served.url

    def stop(self, reason: str) -> None:
        """Stop serving (workers are told to stop only by `xparl stop`, see ShutdownCluster)."""
        logger.info("master stopping: %s", reason)
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch_owner(self) -> None:
        while True:
            if not owner_alive(self.owner_pid):
                self.stop(f"its owner process {self.owner_pid} exited")
                return
            await asyncio.sleep(0.5)

    async def _collect(self) -> None:
        collector = Collector()
        try:
            while True:
                await asyncio.sleep(_COLLECT_S)
                collector.step()
        finally:
            collector.close()

    async def _liveness(self) -> None:
        """Ping everyone; drop workers and clients that have been silent too long.

        A peer hears from the master at least every third of `PARL_HEARTBEAT_TIMEOUT_S`
        (and at most every `PARL_HEARTBEAT_S`): enough for it to tell a live master from a
        lost one, without a write to every worker every second, which is a large share of a
        large cluster's master. Each sweep hands the loop back every `_SWEEP_SLICE` peers, so
        that it never holds up the messages (heartbeats, requests) that arrive meanwhile.
        """
        while True:
            await asyncio.sleep(settings.heartbeat_s)
            peers: list[WorkerInfo | ClientInfo] = [*self.registry.workers.values()]
            peers += self.registry.clients.values()
            for i, peer in enumerate(peers):
                if i and i % _SWEEP_SLICE == 0:
                    await asyncio.sleep(0)
                self._check(peer, time.monotonic())
            now = time.monotonic()
            for actor_id, deadline in list(self._adopted.items()):
                actor = self.registry.actors.get(actor_id)
                if actor is None or actor.client_id in self.registry.clients:
                    del self._adopted[actor_id]
                elif now > deadline:
                    del self._adopted[actor_id]
                    self._release(actor, "its client did not come back after the master restarted")

    def _check(self, peer: WorkerInfo | ClientInfo, now: float) -> None:
        """Ping a peer that is still registered, or drop it if it has been silent too long."""
        silent = now - peer.last_seen
        if isinstance(peer, WorkerInfo):
            if self.registry.workers.get(peer.worker_id) is not peer:
                return  # dropped since the sweep began
            if silent > settings.heartbeat_timeout_s:
                self._drop_worker(
                    peer,
                    f"its worker {peer.hostname} stopped responding (silent for {silent:.0f} s)",
                )
                return
        else:
            if self.registry.clients.get(peer.client_id) is not peer:
                return
            if silent > settings.heartbeat_timeout_s:
                self._drop_client(
                    peer, f"its client stopped responding (silent for {silent:.0f} s)"
                )
                return
        # ping if the next sweep would come later than a third of the peer's timeout
        if now - peer.told_at + settings.heartbeat_s > settings.heartbeat_timeout_s / 3:
            self._send(peer.conn, m.Ping(), now)

    @staticmethod
    def _send(conn: AsyncConnection | None, msg: Any, now: float | None = None) -> None:
        """Send `msg` to a peer, if it is connected; any message tells it the master lives.

        So the sweep pings only the peers that were told nothing for a while (`told_at`):
        the busier the cluster, the fewer the pings.
        """
        if conn is not None:
            peer = conn.context
            if peer is not None:
                peer.told_at = time.monotonic() if now is None else now
            with contextlib.suppress(ConnectionError):
                conn.send(msg)

    def _apply(self, sends: list[Send]) -> None:
        """Send placement's messages, and keep its one timer at its next deadline."""
        for send in sends:
            self._send(send.to, send.message)
        deadline = self.placement.next_deadline()
        if self._deadline is not None and self._deadline.when() != deadline:
            self._deadline.cancel()
            self._deadline = None
        if deadline is not None and self._deadline is None:
            loop = asyncio.get_running_loop()
            self._deadline = loop.call_at(deadline, self._deadline_passed, deadline)

    def _deadline_passed(self, deadline: float) -> None:
        self._deadline = None
        self._apply(self.placement.expire(deadline))

    # -- dispatch --------------------------------------------------------------------------
    def _on_message(self, conn: AsyncConnection, msg: Any, buffers: tuple[Any, ...]) -> None:
        peer = conn.context
        if peer is not None:
            peer.last_seen = time.monotonic()
        handler = self._handlers.get(type(msg))
        if handler is None:
            raise ProtocolError(f"the master does not take {type(msg).__name__}")
        handler(self, conn, peer, msg)

    def _on_close(self, conn: AsyncConnection, exc: Exception | None) -> None:
        peer = conn.context
        if isinstance(peer, ClientInfo) and self.registry.clients.get(peer.client_id) is peer:
            self._drop_client(peer, "its client disconnected")
        elif isinstance(peer, WorkerInfo) and self.registry.workers.get(peer.worker_id) is peer:
            self._drop_worker(peer, f"its worker {peer.hostname} disconnected")

    def _require(self, peer: Any, kind: type, msg: Any) -> None:
        if not isinstance(peer, kind):
            raise ProtocolError(
                f"{type(msg).__name__} from a connection that is not a registered {kind.__name__}"
            )

    # -- clients ---------------------------------------------------------------------------
    def _register_client(self, conn: AsyncConnection, peer: Any, msg: m.RegisterClient) -> None:
        if peer is not None:
            raise ProtocolError("a connection registered twice")
        old = self.registry.clients.get(msg.client_id)
        if old is not None and old.conn is not None:
            old.conn.context = None
            old.conn.close()
        client = ClientInfo(msg.client_id, msg.hostname, msg.pid, msg.log_to_driver, conn=conn)
        conn.context = client
        self.registry.add_client(client, msg.actors)  # its handles: holds come back
        conn.send(m.Accepted(self.registry.cluster_id, settings.heartbeat_s))
        logger.info(
            "client %s (%s pid %d) connected", client.client_id, client.hostname, client.pid
        )

    def _drop_client(self, client: ClientInfo, reason: str) -> None:
        self.registry.remove_client(client)
        if client.conn is not None:
            client.conn.context = None
            client.conn.close()
        self.placement.client_gone(client)
        for actor_id in list(client.actors):
            actor = self.registry.actors.get(actor_id)
            if actor is not None:
                self._release(actor, reason)
        for actor_id in list(client.held):
            actor = self.registry.actors.get(actor_id)
            if actor is not None:
                self._unhold(actor, client)
        logger.info("client %s gone: %s", client.client_id, reason)

    def _create_actor(self, conn: AsyncConnection, peer: Any, msg: m.CreateActor) -> None:
        self._require(peer, ClientInfo, msg)
        now = asyncio.get_running_loop().time()
        self._apply(self.placement.request(conn, peer, msg, now))

    def _release_actor(self, conn: AsyncConnection, peer: Any, msg: m.ReleaseActor) -> None:
        self._require(peer, ClientInfo, msg)
        actor = self.registry.actors.get(msg.actor_id)
        if actor is None:
            return
        if actor.client_id == peer.client_id:
            if self.registry.let_go(actor):
                self._release(actor, "released by its client")
        elif peer.client_id in actor.holders:
            self._unhold(actor, peer)

    def _unhold(self, actor: ActorInfo, client: ClientInfo) -> None:
        """`client` no longer holds `actor`; the last holder of a let-go actor ends it."""
        if self.registry.unhold(actor, client):
            self._release(actor, "released by every process that held it")

    def _hold_actor(self, conn: AsyncConnection, peer: Any, msg: m.HoldActor) -> None:
        self._require(peer, ClientInfo, msg)
        actor = self.registry.actors.get(msg.actor_id)
        if actor is None or actor.released:
            ended = self.registry.find_actor(msg.actor_id)
            reason = ended.reason if ended is not None else "the master does not know it"
            conn.send(m.ActorState(msg.request_id, msg.actor_id, "dead", reason or "it ended"))
            return
        if actor.client_id != peer.client_id:
            self.registry.hold(actor, peer)
        conn.send(m.ActorState(msg.request_id, msg.actor_id, actor.state, actor.reason))

    def _tell_holders(self, actor: ActorInfo, reason: str) -> None:
        for holder in self.registry.drop_holders(actor):
            self._send(holder.conn, m.ActorDied(actor.actor_id, reason))

    def _kill_actor(self, conn: AsyncConnection, peer: Any, msg: m.KillActor) -> None:
        self._require(peer, ClientInfo, msg)
        actor = self.registry.actors.get(msg.actor_id)
        if actor is not None:
            # Released, its end is no news to its clients: tell them now, with the reason.
            self._send(conn, m.ActorDied(actor.actor_id, msg.reason))
            owner = self.registry.clients.get(actor.client_id)
            if owner is not None and owner is not peer:
                self._send(owner.conn, m.ActorDied(actor.actor_id, msg.reason))
            self._release(actor, msg.reason)
            logger.info("actor %s killed: %s", actor.actor_id, msg.reason)
        conn.send(m.Ack(msg.request_id))

    def _release(self, actor: ActorInfo, reason: str) -> None:
        """Stop an actor's process; its slot frees when the worker reports the exit."""
        self._tell_holders(actor, reason)
        self.registry.release_actor(actor, reason)
        worker = self.registry.workers.get(actor.worker_id)
        if worker is None:
            self.registry.end_actor(actor, reason)
            return
        self._send(worker.conn, m.StopActor(actor.actor_id, reason))

    def _query_actor(self, conn: AsyncConnection, peer: Any, msg: m.QueryActor) -> None:
        actor = self.registry.find_actor(msg.actor_id)
        if actor is None:
            conn.send(
                m.ActorState(
                    msg.request_id, msg.actor_id, "unknown", "the master does not know this actor"
                )
            )
        else:
            conn.send(m.ActorState(msg.request_id, msg.actor_id, actor.state, actor.reason))

    def _status(self, conn: AsyncConnection, peer: Any, msg: m.StatusRequest) -> None:
        status = self.registry.snapshot(offset=msg.offset, limit=msg.limit)
        conn.send(m.StatusReply(msg.request_id, status.as_dict()))

    def _shutdown_cluster(self, conn: AsyncConnection, peer: Any, msg: m.ShutdownCluster) -> None:
        for worker in list(self.registry.workers.values()):
            self._send(worker.conn, m.ShutdownWorker("the cluster is being stopped (xparl stop)"))
        conn.send(m.Ack(msg.request_id))
        asyncio.get_running_loop().call_later(0.2, self.stop, "xparl stop")

    def _ping(self, conn: AsyncConnection, peer: Any, msg: m.Ping) -> None:
        pass  # last_seen is updated for every message

    # -- workers ---------------------------------------------------------------------------
    def _register_worker(self, conn: AsyncConnection, peer: Any, msg: m.RegisterWorker) -> None:
        if peer is not None:
            raise ProtocolError("a connection registered twice")
        old = self.registry.workers.get(msg.worker_id)
        if old is not None:
            self._drop_worker(old, f"its worker {old.hostname} re-registered")
        worker = WorkerInfo(
            msg.worker_id,
            msg.hostname,
            msg.host,
            msg.pid,
            msg.cpu_num,
            list(msg.gpus),
            msg.mem_total,
            conn=conn,
        )
        worker.free_gpus = list(msg.gpus)
        conn.context = worker
        self.registry.add_worker(worker)
        conn.send(m.Accepted(self.registry.cluster_id, settings.heartbeat_s))
        if self.preload:  # what the actors of the cluster imported: its warm processes too
            conn.send(m.Preload(list(self.preload)))
        grace = time.monotonic() + settings.client_grace_s
        for record in msg.actors:
            if record.actor_id in self.registry.lost_ids or record.actor_id in self.registry.actors:
                # Declared dead while the worker was cut off: stop it, so no ghost keeps a slot.
                conn.send(m.StopActor(record.actor_id, "its worker was declared lost"))
                continue
            actor = ActorInfo.adopted(record, worker)
            self.registry.add_actor(actor)
            if actor.client_id not in self.registry.clients:
                self._adopted[actor.actor_id] = grace
        logger.info(
            "worker %s (%s, %d CPU slots, GPUs %s) registered with %d actors",
            worker.worker_id,
            worker.hostname,
            worker.cpu_num,
            worker.gpus or "none",
            len(worker.actors),
        )
        self._apply(self.placement.place_pending())

    def _drop_worker(self, worker: WorkerInfo, reason: str) -> None:
        self.registry.remove_worker(worker)
        if worker.conn is not None:
            worker.conn.context = None
            worker.conn.close()
        for actor_id in list(worker.actors):
            actor = self.registry.actors.get(actor_id)
            if actor is not None:
                self._actor_ended(actor, reason)
        logger.warning("worker %s dropped: %s", worker.worker_id, reason)

    def _heartbeat(self, conn: AsyncConnection, peer: Any, msg: m.WorkerHeartbeat) -> None:
        self._require(peer, WorkerInfo, msg)
        self.registry.worker_heartbeat(peer, msg)

    def _actor_started(self, conn: AsyncConnection, peer: Any, msg: m.ActorStarted) -> None:
        self._require(peer, WorkerInfo, msg)
        self._apply(self.placement.started(peer, msg.actor_id, msg.port, msg.pid))

    def _actor_start_failed(
        self, conn: AsyncConnection, peer: Any, msg: m.ActorStartFailed
    ) -> None:
        self._require(peer, WorkerInfo, msg)
        self._apply(self.placement.start_failed(msg.actor_id, msg.reason))

    def _actor_initialized(self, conn: AsyncConnection, peer: Any, msg: m.ActorInitialized) -> None:
        actor = self.registry.actors.get(msg.actor_id)
        if actor is not None and msg.ok:
            self.registry.actor_initialized(actor)

    def _actor_exited(self, conn: AsyncConnection, peer: Any, msg: m.ActorExited) -> None:
        self._require(peer, WorkerInfo, msg)
        actor = self.registry.actors.get(msg.actor_id)
        if actor is not None and actor.worker_id == peer.worker_id:
            self._actor_ended(actor, actor.reason if actor.released else msg.reason)
            self._apply(self.placement.place_pending())

    def _actor_ended(self, actor: ActorInfo, reason: str) -> None:
        self._apply(self.placement.actor_ended(actor, reason))
        client = self.registry.clients.get(actor.client_id)
        if client is not None and not actor.released:
            self._send(client.conn, m.ActorDied(actor.actor_id, reason))
        self._tell_holders(actor, reason)

    def _preload(self, conn: AsyncConnection, peer: Any, msg: m.Preload) -> None:
        """Modules a worker's actors imported, or a client named: every warm process imports them.

        A client names them with `parl.connect(preload=[...])`; the worker that reported them
        knows them already.
        """
        if isinstance(peer, ClientInfo):
            who = f"client {peer.client_id}"
        else:
            self._require(peer, WorkerInfo, msg)
            who = f"worker {peer.worker_id}"
        if news := learn(self.preload, msg.modules, who):
            for worker in self.registry.workers.values():
                if worker is not peer:
                    self._send(worker.conn, m.Preload(news))

    def _log_lines(self, conn: AsyncConnection, peer: Any, msg: m.LogLines) -> None:
        self._require(peer, WorkerInfo, msg)
        self.registry.add_logs(msg.lines)
        forward: dict[str, list[Any]] = {}
        for entry in msg.lines:
            actor_id, stream, _ = entry
            actor = self.registry.find_actor(actor_id)
            client = self.registry.clients.get(actor.client_id) if actor is not None else None
            if client is not None and client.log_to_driver and stream != "exception":
                forward.setdefault(client.client_id, []).append(entry)
        for client_id, lines in forward.items():
            self._send(self.registry.clients[client_id].conn, m.LogLines(lines))

    _handlers: ClassVar[dict[type, Any]] = {
        m.RegisterClient: _register_client,
        m.Ping: _ping,
        m.CreateActor: _create_actor,
        m.ReleaseActor: _release_actor,
        m.KillActor: _kill_actor,
        m.HoldActor: _hold_actor,
        m.QueryActor: _query_actor,
        m.StatusRequest: _status,
        m.ShutdownCluster: _shutdown_cluster,
        m.RegisterWorker: _register_worker,
        m.WorkerHeartbeat: _heartbeat,
        m.ActorStarted: _actor_started,
        m.ActorStartFailed: _actor_start_failed,
        m.ActorInitialized: _actor_initialized,
        m.ActorExited: _actor_exited,
        m.LogLines: _log_lines,
        m.Preload: _preload,
    }


def main(argv: list[str] | None = None) -> None:
    """Run a master in this process (what `xparl start` starts in the background)."""
    parser = argparse.ArgumentParser(prog="python -m parl_remote.master._master")
    parser.add_argument("--port", type=int, default=8010)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--monitor_port", type=int, default=None)
    parser.add_argument("--owner-pid", type=int, default=None)
    parser.add_argument("--ready-file", default=None)
    parser.add_argument("--preload", type=preload_names, default=[], metavar="MODULES")
    args = parser.parse_args(argv)
    try:
        check_env()
    except SettingError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    master = Master(
        args.host,
        args.port,
        token=load_token(),
        owner_pid=args.owner_pid,
        ready_file=args.ready_file,
        monitor_port=args.monitor_port,
        preload=args.preload,
        collect_garbage=True,
    )
    try:
        run(master.run())
    except OSError as exc:
        logger.error("the master could not listen on %s:%d: %s", args.host, args.port, exc)
        sys.exit(1)


if __name__ == "__main__":
    main()

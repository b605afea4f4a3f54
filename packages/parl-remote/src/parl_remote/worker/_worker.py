"""A worker: one per machine; offers its CPU (and GPU) slots to a master and runs actors.

The worker keeps one warm actor process (`actor/_host`) ready per vacant slot, and
`PARL_WARM_SPARES` more, so creating an actor costs a message, not a Python start-up, even
in the slot of an actor that just died. It is the parent of every actor process on its
machine: it sees each one exit the instant it does and reports why (exit code, signal, the
memory limit it enforced, `sys.exit`), captures their stdout and stderr line by line for the
master, and samples their CPU and memory for the dashboard. An actor's process is never reused:
when an actor ends, its slot gets a fresh warm process (how one is started and measured:
`_actor_process`). Messages from the master and from actor processes are dispatched by tables
from message type to handler, as in the master.

If the master goes away without `xparl stop`, the worker keeps its actors serving their clients
and keeps trying to re-register for `PARL_MASTER_GRACE_S` seconds; a restarted master gets the
cluster back, with the actors that are still alive.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import sys
import time
import uuid
from typing import Any, ClassVar, cast

import psutil

from parl_remote import _util
from parl_remote._config import check_env, load_token, settings
from parl_remote._exceptions import ClusterError, ProtocolError, SettingError
from parl_remote._loop import run
from parl_remote._util import available_cpus, describe_exit, owner_alive, write_json_atomic
from parl_remote.actor._preload import learn
from parl_remote.security import _tls_join
from parl_remote.wire._link import MasterLink
from parl_remote.wire._transport import AsyncConnection
from parl_remote.wire.protocol import messages as m
from parl_remote.wire.protocol.connection import Connection
from parl_remote.worker import _priority
from parl_remote.worker._actor_process import ActorProcess, PreloadPacer, spawn_host, tree_rss
from parl_remote.worker._logs import ActorLogs

__all__ = ["Worker", "main"]

logger = logging.getLogger(__name__)

_MEMORY_CHECK_S = 0.25
_PACE_S = 0.2  # how often the actors' CPU is sampled while warm processes have names to import
_RESTORE_TRIES, _RESTORE_WAIT_S = 20, 0.05  # a lowered session's share given back (`_priority`)


def _preload_nice(share_session: bool) -> int:
    """The autogroup nice value of a warm process preloading (`PreloadPacer`); 0: none.

    None where the warm processes share the worker's session (lowering it would lower the
    worker), or where the autogroup does not share the CPUs (`_priority.lowers_here`).
    `PARL_PRELOAD_NICE` is 0 to 19 (`Settings` refuses other values).
    """
    nice = settings.preload_nice
    return nice if nice and not share_session and _priority.lowers_here() else 0


class Worker:
    """The worker process's state and its event-loop tasks."""

    def __init__(
        self,
        master_host: str,
        master_port: int,
        *,
        cpu_num: int,
        gpus: list[str] | None = None,
        host: str | None = None,
        token: bytes | None,
        owner_pid: int | None = None,
        ready_file: str | None = None,
        share_session: bool = False,
    ) -> None:
        if cpu_num < 1:
            raise ValueError(f"a worker needs at least one CPU slot, got {cpu_num=}")
        self.master_host, self.master_port = master_host, master_port
        self.cpu_num = cpu_num
        self.gpus = list(gpus or [])
        self.host = host
        self.token = token
        self.owner_pid = owner_pid
        self.ready_file = ready_file
        self.share_session = share_session
        self.worker_id = uuid.uuid4().hex[:12]
        self.run_dir = _util.private_dir("worker")
        self.hosts: set[ActorProcess] = set()
        self._spawning = 0  # warm processes started and not yet in `hosts`
        self.link = MasterLink(
            master_host,
            master_port,
            token=token,
            role="worker",
            registration=self._registration,
            heartbeat=self._heartbeat,
            on_message=self._on_master,
            on_connected=self._registered,
        )
        self.logs = ActorLogs(self.link)
        self._warm_changed: asyncio.Condition = None  # type: ignore[assignment]  # made in run()
        self._stopping = False
        self._done: asyncio.Future[Any] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.preload: dict[str, None] = {}  # modules its actors imported, in order (a set)
        self.pacer = PreloadPacer(available_cpus(), nice=_preload_nice(share_session))

    # -- life ------------------------------------------------------------------------------
    async def run(self) -> None:
        """Register with the master, keep slots warm, and serve until stopped."""
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        self._warm_changed = asyncio.Condition()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop, f"received {signal.Signals(sig).name}")
        _util.sweep_dead_dirs("worker")
        try:
            await self.link.connect()
            self._refill()
            await self._announce_ready()
            self._spawn(self._master_loop())
            self._spawn(self._watch_memory())
            self._spawn(self._pace_preloads())
            if self.owner_pid:
                self._spawn(self._watch_owner())
            await self._done
        finally:
            await self._shutdown()

    async def _announce_ready(self) -> None:
        """Once every slot has a warm process (or 30 s passed), write the ready file."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (
            len(self.hosts) < self.cpu_num or not all(h.ready.done() for h in self.hosts)
        ):
            await asyncio.sleep(0.01)
        if self.ready_file:
            write_json_atomic(
                self.ready_file,
                {"worker_id": self.worker_id, "pid": os.getpid(), "host": self.host},
            )

    def stop(self, reason: str) -> None:
        """Stop every actor and exit."""
        if not self._stopping:
            logger.info("worker %s stopping: %s", self.worker_id, reason)
            self._stopping = True
            if self._done is not None and not self._done.done():
                self._done.set_result(None)

    async def _shutdown(self) -> None:
        for host in list(self.hosts):
            with contextlib.suppress(ProcessLookupError):
                host.proc.kill()
        for host in list(self.hosts):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(host.proc.wait(), 5)
        if self.link.conn is not None:
            self.link.conn.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("worker task failed", exc_info=task.exception())
            self.stop(f"internal error: {task.exception()!r}")

    async def _watch_owner(self) -> None:
        while not self._stopping:
            if not owner_alive(self.owner_pid):
                self.stop(f"its owner process {self.owner_pid} exited")
                return
            await asyncio.sleep(0.5)

    # -- the master ------------------------------------------------------------------------
    def _registration(self, conn: AsyncConnection) -> m.RegisterWorker:
        if self.host is None:  # actors listen on the address that reaches the master
            self.host = conn.transport.get_extra_info("sockname")[0]  # type: ignore[union-attr]  # open
        return m.RegisterWorker(
            worker_id=self.worker_id,
            hostname=socket.gethostname(),
            host=self.host,
            pid=os.getpid(),
            cpu_num=self.cpu_num,
            gpus=self.gpus,
            actors=[h.record() for h in self.hosts if h.actor_id is not None],
            mem_total=psutil.virtual_memory().total,
        )

    def _registered(self, conn: AsyncConnection) -> None:
        self.logs.schedule()  # what waited for the master
        if self.preload:  # a restarted master learns the cluster's preload set again
            self._to_master(m.Preload(list(self.preload)))
        logger.info("worker %s registered with the master at %s", self.worker_id, self.link.address)

    async def _master_loop(self) -> None:
        """Keep the link; after losing the master for the grace period, stop."""
        self.stop(await self.link.maintain(give_up_after=settings.master_grace_s))

    def _on_master(self, conn: AsyncConnection, msg: Any, buffers: tuple[Any, ...]) -> None:
        handler = self._master_handlers.get(type(msg))
        if handler is None:
            raise ProtocolError(f"a worker does not take {type(msg).__name__} from the master")
        handler(self, msg)

    def _start_actor_msg(self, msg: m.StartActor) -> None:
        self._spawn(self._start_actor(msg))

    def _stop_actor_msg(self, msg: m.StopActor) -> None:
        self._stop_actor(msg.actor_id, msg.reason)

    def _shutdown_msg(self, msg: m.ShutdownWorker) -> None:
        self.stop(msg.reason)

    def _master_preload(self, msg: m.Preload) -> None:
        """What the actors of other workers imported: warm processes here import it too."""
        if settings.preload and (news := learn(self.preload, msg.modules, "the master")):
            self.pacer.number(news)
            self._preload_next()

    _master_handlers: ClassVar[dict[type, Any]] = {
        m.StartActor: _start_actor_msg,
        m.StopActor: _stop_actor_msg,
        m.ShutdownWorker: _shutdown_msg,
        m.Preload: _master_preload,
    }

    def _to_master(self, msg: Any) -> None:
        self.link.send(msg)

    def _heartbeat(self) -> m.WorkerHeartbeat:
        vm = psutil.virtual_memory()
        stats = [s for s in (host.stats() for host in self.hosts) if s is not None]
        return m.WorkerHeartbeat(
            cpu_percent=psutil.cpu_percent(None),
            mem_used=vm.total - vm.available,
            mem_total=vm.total,
            load_avg=os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0,
            actors=stats,
        )

    # -- actor processes -------------------------------------------------------------------
    def _refill(self) -> None:
        """Start warm processes until every vacant slot has one, and the spares are there."""
        if self._stopping:
            return
        # A process that has exited counts no more, although it stays listed while its last
        # lines are read: its replacement starts at once.
        live = sum(1 for host in self.hosts if host.proc.returncode is None)
        missing = self.cpu_num + max(settings.warm_spares, 0) - live - self._spawning
        for _ in range(missing):
            self._spawning += 1
            self._spawn(self._start_host())

    async def _start_host(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            host, parent = await spawn_host(
                host=self.host or "127.0.0.1",
                token=self.token,
                run_dir=self.run_dir,
                own_session=not self.share_session,
            )
        finally:
            self._spawning -= 1
        self.hosts.add(host)
        _, host.ctl = await loop.create_connection(
            lambda: AsyncConnection(
                Connection("worker", is_server=True, token=None, trusted=True),
                lambda conn, msg, bufs: self._on_host(host, msg),
            ),
            sock=parent,
        )
        host.readers = [
            self._spawn(
                self.logs.read(host, cast(asyncio.StreamReader, host.proc.stdout), "stdout")
            ),
            self._spawn(
                self.logs.read(host, cast(asyncio.StreamReader, host.proc.stderr), "stderr")
            ),
        ]
        self._spawn(self._wait_exit(host))

    def _on_host(self, host: ActorProcess, msg: Any) -> None:
        handler = self._host_handlers.get(type(msg))
        if handler is None:
            raise ProtocolError(
                f"a worker does not take {type(msg).__name__} from an actor process"
            )
        handler(self, host, msg)

    def _host_ready(self, host: ActorProcess, msg: m.HostReady) -> None:
        host.port, host.ready_at = msg.port, time.monotonic()
        with contextlib.suppress(psutil.Error):
            host.ps = psutil.Process(msg.pid)
            host.ps.cpu_percent(None)
        if not host.ready.done():
            host.ready.set_result(None)
        self._preload_next()
        self._spawn(self._notify_warm())

    def _preload_next(self) -> None:
        self.pacer.pace(self.hosts, list(self.preload))

    async def _pace_preloads(self) -> None:
        """Sample the actors' CPU while warm processes have names to import; pace them."""
        while not self._stopping:
            await asyncio.sleep(_PACE_S)
            if self.pacer.pending(self.hosts, len(self.preload)):
                self.pacer.sample(self.hosts)
                self._preload_next()

    def _host_preloaded(self, host: ActorProcess, msg: m.Preloaded) -> None:
        host.preload_done = max(host.preload_done, msg.done)  # reports may cross
        self._preload_next()

    def _host_assigned(self, host: ActorProcess, msg: m.Assigned) -> None:
        if host.assigned is not None and not host.assigned.done():
            host.assigned.set_result(None)

    def _host_initialized(self, host: ActorProcess, msg: m.ActorInitialized) -> None:
        self._to_master(m.ActorInitialized(msg.actor_id, msg.ok))  # failed: the client releases it
        host.built = msg.ok
        if msg.ok and settings.preload:
            self._learn_imports(host, msg.imports)

    def _learn_imports(self, host: ActorProcess, imports: list[str]) -> None:
        """Add what an actor imported to the preload set; warm processes import the news.

        The master hears of them too, and tells the other workers (`_master_preload`).
        """
        news = learn(self.preload, imports, f"actor {host.actor_id}") if imports else []
        self.pacer.number(news)
        self.pacer.note(host.class_name, imports)
        if news:
            self._to_master(m.Preload(news))
            self._preload_next()

    def _host_stats(self, host: ActorProcess, msg: m.ActorStats) -> None:
        host.calls, host.errors, host.busy = msg.calls, msg.errors, msg.busy
        host.last_stats = time.monotonic()

    def _host_exiting(self, host: ActorProcess, msg: m.ActorExited) -> None:
        host.exit_reason = msg.reason

    def _host_log(self, host: ActorProcess, msg: m.LogLines) -> None:
        if host.actor_id is not None:  # an exception it raised, for its log
            self.logs.extend((host.actor_id, stream, text) for _, stream, text in msg.lines)

    _host_handlers: ClassVar[dict[type, Any]] = {
        m.HostReady: _host_ready,
        m.Assigned: _host_assigned,
        m.Preloaded: _host_preloaded,
        m.ActorInitialized: _host_initialized,
        m.ActorStats: _host_stats,
        m.ActorExited: _host_exiting,
        m.LogLines: _host_log,
    }

    async def _notify_warm(self) -> None:
        async with self._warm_changed:
            self._warm_changed.notify_all()

    async def _start_actor(self, msg: m.StartActor) -> None:
        deadline = time.monotonic() + settings.connect_timeout_s * 3
        host = self.pacer.pick(self.hosts, msg.class_name)
        while host is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stopping:
                self._to_master(
                    m.ActorStartFailed(
                        msg.actor_id, "no warm actor process became ready; see the worker's log"
                    )
                )
                return
            self._refill()
            async with self._warm_changed:
                with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                    await asyncio.wait_for(self._warm_changed.wait(), remaining)
            host = self.pacer.pick(self.hosts, msg.class_name)
        host.actor_id, host.client_id, host.class_name = msg.actor_id, msg.client_id, msg.class_name
        host.last_stats = time.monotonic()
        host.gpus, host.max_memory_mb, host.started_at = (
            list(msg.gpus),
            msg.max_memory_mb,
            time.time(),
        )
        host.workdir = os.path.join(self.run_dir, "actors", msg.actor_id)
        env = {"PARL_ACTOR_ID": msg.actor_id}
        if msg.gpus or self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(msg.gpus)
        host.assigned = asyncio.get_running_loop().create_future()
        if host.nice:
            await self._restore_share(host)
        own = not (self.share_session and host.keeps_session(self.hosts))
        try:
            host.ctl.send(  # type: ignore[union-attr]  # a warm host is connected
                m.Assign(
                    msg.actor_id, msg.client_id, msg.class_name, env, host.workdir, own_session=own
                )
            )
            # The client may connect at once: the process holds an `Init` that comes before
            # the `Assign` (and one that does not match it fails the client, not the process).
            self._to_master(m.ActorStarted(msg.actor_id, host.port, host.proc.pid))
            self._preload_next()  # the next warm process may preload, if this one did
            await asyncio.wait_for(host.assigned, settings.connect_timeout_s)
        except (ConnectionError, TimeoutError):
            self._stop_actor(msg.actor_id, "its process did not take the assignment")

    async def _restore_share(self, host: ActorProcess) -> None:
        """Set the session of `host`, lowered to preload, back to a normal CPU share.

        The kernel takes one change a tenth of a second from an unprivileged process: a change
        refused for that is tried again, for up to a second.
        """
        for _ in range(_RESTORE_TRIES):
            try:
                if host.set_nice(0):
                    return
            except OSError as exc:
                logger.warning("actor %s keeps a low CPU share: %s", host.actor_id, exc)
                return
            await asyncio.sleep(_RESTORE_WAIT_S)
        logger.warning(
            "actor %s keeps a low CPU share: its session's autogroup nice value could not be "
            "set back to 0 within a second",
            host.actor_id,
        )

    def _stop_actor(self, actor_id: str, reason: str) -> None:
        for host in self.hosts:
            if host.actor_id == actor_id:
                if host.exit_reason is None:
                    host.exit_reason = reason
                with contextlib.suppress(ProcessLookupError):
                    host.proc.kill()
                return
        self._to_master(m.ActorExited(actor_id, "its worker no longer had it"))

    async def _wait_exit(self, host: ActorProcess) -> None:
        code = await host.proc.wait()
        if host.actor_id is not None:
            self._refill()  # the actor's slot is free: its next process starts now
        # Let the last lines it printed reach the master before the news of its death.
        with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
            await asyncio.wait_for(asyncio.gather(*host.readers, return_exceptions=True), 0.5)
        self.logs.flush()
        self.hosts.discard(host)
        os.close(host.death_w)
        if host.ctl is not None:
            host.ctl.close()
        if host.actor_id is not None:
            reason = host.exit_reason or f"its process {describe_exit(code)}"
            self._to_master(m.ActorExited(host.actor_id, reason, code))
            if host.workdir:
                shutil.rmtree(host.workdir, ignore_errors=True)
        elif not self._stopping:
            logger.warning("a warm actor process %s %s", host.proc.pid, describe_exit(code))
            await asyncio.sleep(0.5)  # do not spin if processes fail to start
        self._refill()

    async def _watch_memory(self) -> None:
        while not self._stopping:
            for host in list(self.hosts):
                if (
                    host.actor_id is None
                    or not host.max_memory_mb
                    or host.ps is None
                    or host.exit_reason
                ):
                    continue
                try:
                    rss = tree_rss(host.ps)
                except psutil.Error:
                    continue
                if rss > host.max_memory_mb * 1e6:
                    self._stop_actor(
                        host.actor_id,
                        f"it exceeded its memory limit of {host.max_memory_mb:g} MB (RSS "
                        f"{rss / 1e6:.0f} MB)",
                    )
            await asyncio.sleep(_MEMORY_CHECK_S)


def main(argv: list[str] | None = None) -> None:
    """Run a worker in this process (what `xparl connect` starts in the background)."""
    parser = argparse.ArgumentParser(prog="python -m parl_remote.worker._worker")
    parser.add_argument("--address", required=True, help="the master, HOST:PORT")
    parser.add_argument("--cpu_num", type=int, default=None)
    parser.add_argument("--gpu", default="", help="GPU ids this worker offers, e.g. 0,1")
    parser.add_argument("--host", default=None, help="address clients use to reach this machine")
    parser.add_argument("--owner-pid", type=int, default=None)
    parser.add_argument("--ready-file", default=None)
    parser.add_argument("--share-session", action="store_true", help="a lone actor keeps it")
    args = parser.parse_args(argv)
    try:
        check_env()
    except SettingError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    host, _, port = args.address.rpartition(":")
    cpu_num = args.cpu_num or available_cpus()
    gpus = [g.strip() for g in args.gpu.split(",") if g.strip()]
    token = load_token()
    try:  # with TLS: the cluster CA and, on another machine, a certificate it signed
        _tls_join.join_as_worker(
            host or "127.0.0.1", int(port), token, [args.host] * bool(args.host)
        )
    except (OSError, ClusterError) as exc:
        sys.exit(f"worker could not join the TLS cluster at {args.address}: {exc}")
    worker = Worker(
        host or "127.0.0.1",
        int(port),
        cpu_num=cpu_num,
        gpus=gpus,
        host=args.host,
        token=token,
        owner_pid=args.owner_pid,
        ready_file=args.ready_file,
        share_session=args.share_session,
    )
    try:
        run(worker.run())
    except (OSError, ClusterError, TimeoutError) as exc:
        logger.error("worker could not join the master at %s: %s", args.address, exc)
        sys.exit(1)


if __name__ == "__main__":
    main()

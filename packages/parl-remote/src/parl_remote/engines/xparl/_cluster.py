"""Starting and stopping cluster processes: `xparl start/connect/stop` and `parl.connect()`.

Masters and workers run as background processes, each writing a log file: `xparl`'s in
sessions of their own, the local cluster of `parl.connect()` in its client's session but in
process groups of their own (a Ctrl-C in the user's terminal reaches neither), so that its
worker can keep a lone actor in the client's session (`ActorProcess.keeps_session`). A starter
waits for the process to write its ready file, so it returns only once the process serves; if
the process dies first, the error shows the end of its log. Processes are stopped by PID (checked
against their start time, so a reused PID is never hit), never by name.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from parl_remote._exceptions import ClusterError
from parl_remote._util import available_cpus, kill_pid, private_dir, read_json, sweep_dead_dirs

__all__ = ["EmbeddedCluster", "ProcessInfo", "spawn"]


@dataclass
class ProcessInfo:
    """A background process we started."""

    pid: int
    create_time: float
    log: str
    ready: dict[str, Any] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def alive(self) -> bool:
        """Whether this very process (not a reuse of its PID) still runs."""
        try:
            proc = psutil.Process(self.pid)
            alive: bool = (
                abs(proc.create_time() - self.create_time) < 1.0
                and proc.status() != psutil.STATUS_ZOMBIE
            )
            return alive
        except psutil.Error:
            return False

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop it (SIGTERM, then SIGKILL); return whether it is gone."""
        gone = kill_pid(self.pid, timeout=timeout, create_time=self.create_time)
        if self.popen is not None:  # our own child: collect its exit status
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        return gone

    def as_dict(self) -> dict[str, Any]:
        """For the state files of `xparl`."""
        return {"pid": self.pid, "create_time": self.create_time, "log": self.log}


def _tail(path: str, lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def spawn(
    module: str,
    args: list[str],
    *,
    log: str,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
    own_session: bool = True,
) -> ProcessInfo:
    """Start `python -m module args` in the background and wait until it writes its ready file.

    It runs in a session of its own, or with `own_session` False in this one (a process group
    of its own: a terminal's Ctrl-C still reaches only this process).
    """
    ready_dir = tempfile.mkdtemp(prefix="parl-ready-")
    ready_file = os.path.join(ready_dir, "ready.json")
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args, "--ready-file", ready_file],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=own_session,
            process_group=None if own_session else 0,
            close_fds=True,
        )
    try:
        info = ProcessInfo(proc.pid, psutil.Process(proc.pid).create_time(), log, popen=proc)
    except psutil.Error:
        info = ProcessInfo(proc.pid, time.time(), log, popen=proc)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready = read_json(ready_file)
            if ready is not None:
                info.ready = ready
                return info
            if proc.poll() is not None:
                raise ClusterError(
                    f"{module} exited with code {proc.returncode} before it was ready; the end "
                    "of its "
                    f"log ({log}):\n{_tail(log)}"
                )
            time.sleep(0.01)
        info.stop()
        raise ClusterError(
            f"{module} was not ready within {timeout:g} s; the end of its log "
            f"({log}):\n{_tail(log)}"
        )
    finally:
        if os.path.exists(ready_file):
            os.unlink(ready_file)
        os.rmdir(ready_dir)


@dataclass
class EmbeddedCluster:
    """A master and a worker owned by this process: what `parl.connect()` starts.

    While it runs, its token is this process's `PARL_CLUSTER_TOKEN`, so that child processes
    (started by fork, spawn or forkserver) can `parl.connect(address)` to it; it never appears
    on a command line.
    """

    address: str
    token: bytes
    master: ProcessInfo
    worker: ProcessInfo
    cpu_num: int
    logdir: str
    _env_before: str | None = None

    @classmethod
    def start(
        cls, cpu_num: int | None = None, host: str = "127.0.0.1", monitor_port: int | None = 0
    ) -> EmbeddedCluster:
        """Start a master on a free port and a worker with `cpu_num` slots (default: all cores).

        The master serves the dashboard on `monitor_port` (0: a free port; None: none) when
        parl-dashboard is installed.
        """
        cpu_num = cpu_num or available_cpus()
        token = secrets.token_hex(32)
        env = dict(os.environ, PARL_CLUSTER_TOKEN=token)
        # A user process that died without stop() left its cluster's logs: they stay for a
        # look until the next embedded cluster of this user starts.
        sweep_dead_dirs("cluster")
        logdir = private_dir("cluster")
        owner = ["--owner-pid", str(os.getpid())]
        monitor = [] if monitor_port is None else ["--monitor_port", str(monitor_port)]
        master = spawn(
            "parl_remote.master._master",
            ["--host", host, "--port", "0", *owner, *monitor],
            log=os.path.join(logdir, "master.log"),
            env=env,
            own_session=False,
        )
        address = f"{host}:{master.ready['port']}"
        try:
            worker = spawn(
                "parl_remote.worker._worker",
                ["--address", address, "--cpu_num", str(cpu_num), "--share-session", *owner],
                log=os.path.join(logdir, "worker.log"),
                env=env,
                own_session=False,
            )
        except BaseException:
            master.stop()
            raise
        cluster = cls(address, token.encode(), master, worker, cpu_num, logdir)
        cluster._env_before = os.environ.get("PARL_CLUSTER_TOKEN")
        os.environ["PARL_CLUSTER_TOKEN"] = token
        return cluster

    @property
    def dashboard_url(self) -> str | None:
        """Where the master serves the dashboard; None without one."""
        return self.master.ready.get("dashboard")

    def describe(self) -> str:
        """One line for the log."""
        return f"{self.cpu_num} CPU slots, logs in {self.logdir}"

    def stop(self) -> None:
        """Stop the worker (and with it every actor), then the master; remove their logs."""
        self.worker.stop()
        self.master.stop()
        shutil.rmtree(self.logdir, ignore_errors=True)
        if os.environ.get("PARL_CLUSTER_TOKEN") == self.token.decode():
            if self._env_before is None:
                del os.environ["PARL_CLUSTER_TOKEN"]
            else:
                os.environ["PARL_CLUSTER_TOKEN"] = self._env_before

"""A private cluster for the load and soak scripts: its own token, home and ports."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import tempfile

import psutil

from parl_remote.engines.xparl import _cluster


class BenchCluster:
    """A master and one worker started by PID, stopped by PID."""

    def __init__(self, cpu_num: int, **env: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="parl-bench-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.env = dict(
            os.environ, PARL_CLUSTER_TOKEN=secrets.token_hex(16), PARL_HOME=self.dir, **env
        )
        self.master = _cluster.spawn(
            "parl_remote.master._master",
            ["--port", str(self.port)],
            log=os.path.join(self.dir, "master.log"),
            env=self.env,
        )
        self.worker = _cluster.spawn(
            "parl_remote.worker._worker",
            ["--address", self.address, "--cpu_num", str(cpu_num)],
            log=os.path.join(self.dir, "worker.log"),
            env=self.env,
        )

    def processes(self) -> list[psutil.Process]:
        """Master, worker and every actor process under the worker."""
        procs = [psutil.Process(self.master.pid), psutil.Process(self.worker.pid)]
        return procs + procs[1].children(recursive=True)

    def fds(self) -> dict[str, int]:
        """Open file descriptors of master and worker."""
        return {
            "master": psutil.Process(self.master.pid).num_fds(),
            "worker": psutil.Process(self.worker.pid).num_fds(),
        }

    def stop(self) -> None:
        pids = []
        with contextlib.suppress(psutil.Error):
            pids = [p.pid for p in self.processes()]
        self.worker.stop()
        self.master.stop()
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()

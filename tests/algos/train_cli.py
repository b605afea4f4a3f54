"""`parl-train` runs for the tests, each a process of its own, forked from one warm process.

A short `parl-train` run spends most of its CPU time starting: the interpreter, then torch,
gymnasium, matplotlib and the zoo (about 4 s of a 5 s run on this kind of machine). The fast
suite makes about a hundred short runs, so each test process starts one *zygote* that imports
all that once, and forks it for every run: the child sets the run's environment, working
directory and output files, then calls the same `main` as the `parl-train` script and exits
through the interpreter as the script does (exit code, atexit handlers, signals and Ctrl-C
included). The tests that stop a run with a signal, and `--list`, still start the real
`parl-train` executable, so the script itself stays covered.

Each zygote is stopped by its PID when its test process exits; a run that outlives its timeout
is killed by its PID.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from typing import Any

__all__ = ["parl_train"]

# The zygote: imports what a run imports, then forks a child per request line (JSON: argv,
# env, cwd, stdout, stderr) and answers {"pid"} at once and {"pid", "status"} at its exit.
_ZYGOTE = r"""
import json, os, selectors, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot
import torch._dynamo  # imported by the first optimizer step
import parl_algos.train._cli, parl_algos.train._registry, parl_algos.train._skeleton


def reply(obj):
    os.write(1, json.dumps(obj).encode() + b"\n")  # one line: under PIPE_BUF, one write


def reap():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        reply({"pid": pid, "status": os.waitstatus_to_exitcode(status)})


selector = selectors.DefaultSelector()
selector.register(0, selectors.EVENT_READ)
pending = b""
while True:
    ready = selector.select(timeout=0.05)
    reap()
    if not ready:
        continue
    chunk = os.read(0, 1 << 16)
    if not chunk:
        break
    pending += chunk
    if b"\n" not in pending:
        continue
    line, pending = pending.split(b"\n", 1)  # one request at a time: the tests wait for each
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        selector.close()
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out, fd)
            os.close(out)
        os.close(null)
        sys.stdin = open(0, closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        sys.argv = ["parl-train", *request["argv"]]
        sys.exit(parl_algos.train._cli.main(request["argv"]))
    reply({"pid": pid})
"""


class _Zygote:
    """The warm process of this test process, and the exit codes it has reported."""

    def __init__(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.selector = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)
        self.exits: dict[int, int] = {}
        self.pending = b""  # what the zygote wrote past the last whole line
        self.running: set[int] = set()  # forked, exit not reported yet
        atexit.register(self.stop)

    def _read(self, deadline: float) -> dict[str, Any] | None:
        """The zygote's next reply (exits are also kept in `exits`), or None at the deadline."""
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            if b"\n" not in self.pending:
                if not self.selector.select(timeout=max(0.0, deadline - time.monotonic())):
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 1 << 16)  # raw: no hidden buffer
                if not chunk:
                    raise RuntimeError(f"the parl-train zygote {self.proc.pid} exited")
                self.pending += chunk
                continue
            line, self.pending = self.pending.split(b"\n", 1)
            reply: dict[str, Any] = json.loads(line)
            if "status" in reply:
                self.exits[reply["pid"]] = reply["status"]
                self.running.discard(reply["pid"])
            return reply
        return None

    def start(self, argv: list[str], env: dict[str, str], out: str, err: str) -> int:
        request = {"argv": argv, "env": env, "cwd": os.getcwd(), "stdout": out, "stderr": err}
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + 60
        reply = self._read(deadline)
        while reply is not None and "status" in reply:  # an earlier run's exit
            reply = self._read(deadline)
        if reply is None:
            raise RuntimeError("the parl-train zygote did not fork within 60 s")
        self.running.add(reply["pid"])
        return int(reply["pid"])

    def wait(self, pid: int, timeout: float) -> int | None:
        """The exit code of run `pid`, or None if it is still running after `timeout`."""
        deadline = time.monotonic() + timeout
        while pid not in self.exits:
            if self._read(deadline) is None:
                return None
        return self.exits.pop(pid)

    def stop(self) -> None:
        for pid in self.running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_zygote: _Zygote | None = None


def parl_train(
    *args: str, timeout: float = 240, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run `parl-train *args` to its end, as `subprocess.run(..., capture_output=True)` would.

    Raises `subprocess.TimeoutExpired` (after killing the run by its PID) past `timeout`.
    """
    global _zygote
    if _zygote is None or _zygote.proc.poll() is not None:
        _zygote = _Zygote()
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    with tempfile.TemporaryDirectory(prefix="parl-train-") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        pid = _zygote.start(list(args), env, out, err)
        code = _zygote.wait(pid, timeout)
        if code is None:
            os.kill(pid, 9)
            _zygote.wait(pid, 30)
            raise subprocess.TimeoutExpired(["parl-train", *args], timeout)
        with open(out, encoding="utf-8", errors="replace") as f:
            stdout = f.read()
        with open(err, encoding="utf-8", errors="replace") as f:
            stderr = f.read()
    return subprocess.CompletedProcess(["parl-train", *args], code, stdout, stderr)

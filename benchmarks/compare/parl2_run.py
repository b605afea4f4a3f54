"""PARL 2.x's side of W4, run from `remote_bench.py --w4 --parl2 PYTHON` in the same run, bounded.

`run_w4` starts a PARL 2.x cluster with the `xparl` of that virtual environment on a free
loopback port, in a session of its own, runs `parl2_bench.py --w4` against it within a time
limit, and then stops every process of that session by PID: never `xparl stop`, which kills
every xparl process of the machine by name, other people's clusters included. It returns
PARL's numbers, or None and why there are none.

Why earlier PARL runs never finished: with `remote_class(wait=False)` a PARL actor is never
freed by `del` (a thread of its proxy holds it until `destroy()`), so once every CPU of the
cluster held one, the next actor waited for a CPU that never came back (PARL retries for
300 s). `parl2_bench.py` now frees each actor it is done with. PARL's job processes also
re-import `parl` when an actor is created, which imports torch whenever torch is installed:
that is part of the time PARL takes to create any actor, also one that never uses torch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import time

__all__ = ["run_w4"]

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.2)
    return False


def _session(sid: int) -> list[int]:
    """The processes of session `sid` still running (there is no other way to list them)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    zombie = f.read().rpartition(")")[2].split()[0] == "Z"
                if os.getsid(int(name)) == sid and not zombie:  # a zombie waits for its parent
                    pids.append(int(name))
            except (OSError, IndexError):
                continue
    return pids


def _stop_session(sid: int, timeout: float = 10.0) -> list[int]:
    """SIGTERM, then SIGKILL, every process of session `sid`; return those that outlived it."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _session(sid):
            with contextlib.suppress(OSError):  # it ended meanwhile
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while _session(sid) and time.monotonic() < deadline:
            time.sleep(0.1)
    return _session(sid)


def run_w4(
    python: str, *, n: int, settle: float, cpu_num: int = 4, timeout: float = 600.0
) -> tuple[dict[str, float] | None, str]:
    """PARL 2.x's W4 times (`run_user_creation`'s keys, ms), and why some or all are missing.

    Stopped at `timeout`, it still returns the times of the actors created by then.
    """
    xparl = os.path.join(os.path.dirname(python), "xparl")
    port = _free_port()
    start = subprocess.Popen(
        [xparl, "start", "--port", str(port), "--cpu_num", str(cpu_num)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its master, worker and jobs: session `start.pid`
    )
    command = [python, "-u", os.path.join(HERE, "parl2_bench.py"), "--w4", "--address"]
    command += [f"localhost:{port}", "--n", str(n), "--settle", str(settle)]
    bench, why = None, ""
    out = ""
    try:  # `xparl start` itself may take minutes to return: the master's port is enough
        if not _wait_for_port(port, 180):
            return None, f"PARL 2.x's master did not listen on port {port} within 180 s"
        bench = subprocess.Popen(  # a session of its own too: PARL's client starts processes
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        out, _ = bench.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        why = f"PARL 2.x's W4 did not finish within {timeout:.0f} s"
    finally:
        for proc in (bench, start):
            if proc is not None:
                left = _stop_session(proc.pid)
                if proc is bench and why:
                    out = bench.communicate()[0]  # what it printed before it was stopped
                proc.wait(10)
                if left:
                    print(f"processes PARL 2.x started still run: {left}")
    times = _actor_times(out)
    if not times:  # what it printed last says where it stood
        return None, f"{why or 'PARL 2.x W4 failed'}; its last output:\n{out[-2000:]}"
    return times, why


def _actor_times(out: str) -> dict[str, float]:
    """W4's numbers from the actors `run_user_creation` printed (all, or those done in time)."""
    created: dict[str, list[float]] = {}
    for line in out.splitlines():
        words = line.split()  # "W4 numpy actor 3: 12.5 ms"
        if len(words) == 6 and words[0] == "W4" and words[2] == "actor":
            created.setdefault(words[1], []).append(float(words[4]))
    times = {}
    for name, ms in created.items():
        times[f"W4 {name} 1st ms"] = ms[0]
        if len(ms) > 1:
            times[f"W4 {name} later ms"] = statistics.median(ms[1:])
    return times

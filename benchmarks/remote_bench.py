"""Remote-call performance of parl-remote against the floor of this machine, in one run.

The baseline is built here: a uvloop + msgspec length-prefixed echo server (`_raw_echo.py`)
in its own process, driven the way each workload drives an actor. Ratios compare numbers taken
minutes apart on the same machine, so they survive a noisy, shared machine better than
absolute times do.

    W1  sync call latency, add(1, 2), serial: median and p99 us     target <= 1.5x raw echo
        (a blocking-socket client of the echo server), as the median ratio of 20 alternating
        blocks of 200 calls each; a second median row times the same client against an echo
        server in a session of its own, as an xparl worker runs its actors (under load the
        kernel schedules a process of another session later than one of the caller's own:
        1.14x for the same echo server at load 14; `parl.connect()`'s local cluster keeps a
        lone actor, as W1's, in the client's session); a third times the actor's small-call
        lane against the same calls without it, two actors in alternating blocks
    W2  4 actors, 1000 calls in flight (future and awaitable modes),  target >= 0.25x raw pipelined
        in calls/s, against two raw pipelines: one writing each wave of 1000 requests with
        one system call (the floor), one writing each request as it comes (a plain client);
        medians of rounds alternating with the raw ones, timed once each actor's connection
        is open and no process of the run is busy (the warm processes import in the
        background what earlier actors imported, which a first round would time)
    W3  numpy float32 argument + result round trip, 1/16/128 MB     target >= 0.5x raw socket
        (echo), argument only (sum) and result only (make): through shared memory, with it
        turned off (PARL_SHM_MIN_BYTES=0, the socket), a raw socket, and one memcpy of the
        same bytes (the ceiling: a round trip is at best two of them)
    W4  actor creation until its first answer, ms                   target <= 20 ms
        (a class of plain Python; a second row times one whose methods use numpy, which its
        process imports before it answers); then classes in user modules shipped as code
        (`w4_classes/`) that import numpy and torch: the first actor of each, and the later
        ones after `--settle` s, once warm processes have imported what the first one did
        (target <= 10 ms, and <= 0.5x PARL 2.2.1's time for the same class in the same run)
    W5  2 actors x a pure-Python loop vs the same work serially     target >= 1.8x on 2 cores

    python benchmarks/remote_bench.py            # about two minutes
    python benchmarks/remote_bench.py --quick    # fewer repetitions
    python benchmarks/remote_bench.py --w2       # the pipelined calls alone
    python benchmarks/remote_bench.py --w3       # the shared-memory table alone
    python benchmarks/remote_bench.py --w4       # the creation rows alone
    python benchmarks/remote_bench.py --lanes    # the actor's small-call lane on against off
    python benchmarks/remote_bench.py --w4 --preload torch,numpy
                                                 # the same, the warm processes told to
                                                 # import torch and numpy first (the first
                                                 # actor of each against one of a class of
                                                 # plain Python, in the same run)
    python benchmarks/remote_bench.py --w4 --parl2 /tmp/parl2-venv/bin/python
                                                 # and PARL 2.x's for the same classes, in
                                                 # the same run (compare/parl2_run.py)
    python benchmarks/remote_bench.py --w3 --ray /tmp/ray-venv/bin/python
                                                 # and Ray's object store on the same round
                                                 # trips, right after ours (compare/ray_w3.py)
    python benchmarks/remote_bench.py --tls      # W1 and W3 on a plaintext and a TLS cluster
                                                 # (runs tls_bench.py)

Reference figures measured on this kind of machine with the same workloads (see README.md in
this directory for how to reproduce them): PARL 2.2.1 W1 202 us, W2 6.0k calls/s, W3 159 MB/s,
W4 18 ms; Ray 2.60 W1 728 us, W2 2.9k calls/s, W3 3.8 GB/s (shared-memory object store),
W4 427 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import msgspec
import numpy as np
import psutil
import uvloop

import parl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import Row, command_line, record

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = struct.Struct("<I")


# -- the baseline ------------------------------------------------------------------------------
def start_raw_server(own_session: bool = False) -> tuple[subprocess.Popen, int, int]:
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "_raw_echo.py")],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=own_session,  # as a worker starts an actor process
    )
    echo_port, raw_port = (int(p) for p in proc.stdout.readline().split())
    return proc, echo_port, raw_port


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    while len(view):
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("closed")
        view = view[n:]


def raw_latency(port: int, n: int) -> list[float]:
    sock = _connect(port)
    body = msgspec.msgpack.encode(["add", [1, 2], {}])
    frame = HEADER.pack(len(body)) + body
    head = bytearray(4)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        sock.sendall(frame)
        _recv_exact(sock, memoryview(head))
        (size,) = HEADER.unpack(head)
        reply = bytearray(size)
        _recv_exact(sock, memoryview(reply))
        msgspec.msgpack.decode(reply)
        times.append(time.perf_counter() - t0)
    sock.close()
    return times


def raw_pipelined(port: int, total: int, depth: int, batched: bool = True) -> float:
    """Pipelined echo calls: `depth` requests in flight, written at once or one write each."""

    async def run() -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = msgspec.msgpack.encode(["add", [1, 2], {}])
        frame = HEADER.pack(len(body)) + body
        t0 = time.perf_counter()
        done = 0
        while done < total:
            if batched:
                writer.writelines([frame] * depth)
            else:
                for _ in range(depth):
                    writer.write(frame)
                    await writer.drain()
            for _ in range(depth):
                (size,) = HEADER.unpack(await reader.readexactly(4))
                msgspec.msgpack.decode(await reader.readexactly(size))
            done += depth
        elapsed = time.perf_counter() - t0
        writer.close()
        return done / elapsed

    return uvloop.run(run())


def raw_payload(port: int, size: int, reps: int) -> float:
    sock = _connect(port)
    data = np.ones(size // 4, dtype=np.float32)
    head = bytearray(8)
    back = bytearray(size)
    t0 = time.perf_counter()
    for _ in range(reps):
        sock.sendall(struct.pack("<Q", size))
        sock.sendall(memoryview(data).cast("B"))
        _recv_exact(sock, memoryview(head))
        _recv_exact(sock, memoryview(back))
    elapsed = time.perf_counter() - t0
    sock.close()
    return size * reps / elapsed / 1e6


# -- the project -------------------------------------------------------------------------------
@parl.remote_class
class Actor:
    def add(self, a, b):
        return a + b

    def echo(self, x):
        return x

    def sum(self, x):
        return float(x[0])

    def make(self, n):
        return np.ones(n, dtype=np.float32)

    def spin(self, n):
        total = 0
        for i in range(n):
            total += i
        return total


@parl.remote_class
class Adder:
    """W4's class: nothing beyond the standard library to import where it is built."""

    def add(self, a, b):
        return a + b


@parl.remote_class(wait=False)
class FutureActor:
    def add(self, a, b):
        return a + b


def parl_latency(actor, n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        actor.add(1, 2)
        times.append(time.perf_counter() - t0)
    return times


def w1_rows(
    actor, echo_port: int, blocks: int, n: int = 200, own_port: int | None = None
) -> list[tuple[str, ...]]:
    """W1: blocks of `n` calls, ours and the raw echo's in turn; the median of their ratios.

    Alternating blocks in one process see the same machine: a ratio survives CPU steal that
    swings within a run, where two long runs one after the other would not. With `own_port`
    (an echo server in a session of its own), each turn times that one too, for a second row.
    """
    parl_latency(actor, 200)  # warm up both paths
    raw_latency(echo_port, 200)
    ratios, own_ratios, ours, raw = [], [], [], []
    for _ in range(blocks):
        o, r = parl_latency(actor, n), raw_latency(echo_port, n)
        ratios.append(statistics.median(o) / statistics.median(r))
        if own_port is not None:
            own_ratios.append(statistics.median(o) / statistics.median(raw_latency(own_port, n)))
        ours += o
        raw += r
    record_w1(statistics.median(ours), statistics.median(raw), blocks * n)
    rows = []
    for name, q in (("median", 0.5), ("p99", 0.99)):
        o = sorted(ours)[int(q * (len(ours) - 1))]
        r = sorted(raw)[int(q * (len(raw) - 1))]
        ratio = statistics.median(ratios) if name == "median" else o / r
        target = "<= 1.5x" if name == "median" else ""
        rows.append((f"W1 sync call {name} (us)", us(o), us(r), f"{ratio:5.2f}x", target))
    if own_ratios:
        ratio = statistics.median(own_ratios)
        rows.append(("W1 median, echo in its own session", "", "", f"{ratio:5.2f}x", ""))
    return rows


@parl.remote_class
class LaneActor:
    """W1's class, whose process can make its next connections without the small-call lane."""

    def add(self, a, b):
        return a + b

    def set_lane(self, on):
        from parl_remote.actor._calls import CallConnection

        CallConnection.lane = on


def lane_rows(blocks: int, n: int = 200) -> list[tuple[str, ...]]:
    """The actor's small-call lane on against off, in alternating blocks of `n` calls.

    Two actors of one class, the second serving its calls on a connection made without the
    lane (`CallConnection.lane`): the median of the blocks' ratios, as W1's.
    """
    on, off = LaneActor(), LaneActor()
    off.set_lane(False)
    off._parl_ref.blocking.pool.clear()  # its next call opens a connection without the lane
    off.add(1, 2)
    off.set_lane(True)
    parl_latency(on, n), parl_latency(off, n)  # warm up both
    ratios, with_lane, without = [], [], []
    for _ in range(blocks):
        a, b = parl_latency(on, n), parl_latency(off, n)
        ratios.append(statistics.median(a) / statistics.median(b))
        with_lane += a
        without += b
    ratio = statistics.median(ratios)
    ours, peer = statistics.median(with_lane), statistics.median(without)
    record_latency(
        "blocking remote call, the actor's small-call lane",
        ours,
        "the same calls with the actor's lane off (its general path)",
        peer,
        f"{blocks * n} calls each, in alternating blocks; the median of the blocks' ratios "
        f"{ratio:.3f}",
    )
    return [("W1 actor's lane on vs off (us)", us(ours), us(peer), f"{ratio:5.2f}x", "")]


def record_w1(ours: float, raw: float, calls: int) -> None:
    """W1's medians as a result row (`benchmarks/results/remote-calls.json`)."""
    record_latency(
        "blocking remote call",
        ours,
        "raw uvloop + msgspec echo server, blocking-socket client",
        raw,
        f"{calls} calls each, in alternating blocks",
    )


def record_latency(algorithm: str, ours: float, peer: str, theirs: float, note: str) -> None:
    """A row of `add(1, 2)`'s median latency against a peer's, with the load now."""
    row = Row(
        task="add(1, 2)",
        algorithm=algorithm,
        metric="µs a call (median)",
        better="lower",
        ours=round(ours * 1e6, 1),
        peer=peer,
        peer_value=round(theirs * 1e6, 1),
        seeds=[],
        command=command_line(),
        note=f"{note}; load average " + "{:.2f} {:.2f} {:.2f}.".format(*os.getloadavg()),
    )
    record("remote-calls", [row])


def parl_future_throughput(actors, total: int, depth: int) -> float:
    t0 = time.perf_counter()
    done = 0
    while done < total:
        futures = [actors[i % len(actors)].add(i, 1) for i in range(depth)]
        for future in futures:
            future.get()
        done += depth
    return done / (time.perf_counter() - t0)


def parl_async_throughput(actors, total: int, depth: int) -> float:
    async def run() -> float:
        handles = [a.aio for a in actors]
        await asyncio.gather(*[h.add(0, 0) for h in handles])  # open the connections
        t0 = time.perf_counter()
        done = 0
        while done < total:
            await asyncio.gather(*[handles[i % len(handles)].add(i, 1) for i in range(depth)])
            done += depth
        return done / (time.perf_counter() - t0)

    return uvloop.run(run())


def w2_table(client, port: int, calls: int, rounds: int) -> list[tuple[str, ...]]:
    """W2: 4 actors of each mode (one mode's at a time), each mode against the raw pipelines."""
    futures = [FutureActor() for _ in range(4)]
    for future_actor in futures:  # its connection, opened outside the timed rounds
        future_actor.add(0, 0).get()
    rows = w2_rows(
        "future",
        functools.partial(parl_future_throughput, futures, calls, 1000),
        port,
        calls,
        rounds,
    )
    del futures, future_actor
    wait_for_vacant(client, 4)
    plain = [Actor() for _ in range(4)]
    rows += w2_rows(
        "awaitable",
        functools.partial(parl_async_throughput, plain, calls, 1000),
        port,
        calls,
        rounds,
    )
    return rows


def w2_rows(
    name: str, ours: Callable[[], float], port: int, calls: int, rounds: int
) -> list[tuple[str, ...]]:
    """W2's two rows for one mode: medians of `rounds` rounds, each of ours and the raw pair.

    Timed once no process of the run is busy, the rounds alternating so that the machine's
    swings reach both sides alike.
    """
    wait_for_quiet()
    rates: dict[str, list[float]] = {"ours": [], "each": [], "batched": []}
    for _ in range(rounds):
        rates["each"].append(raw_pipelined(port, calls, 1000, batched=False))
        rates["ours"].append(ours())
        rates["batched"].append(raw_pipelined(port, calls, 1000))
    value, each, batched = (statistics.median(rates[key]) for key in ("ours", "each", "batched"))
    return [
        (
            f"W2 {name} vs raw, {how}",
            f"{value:8.0f}",
            f"{raw:8.0f}",
            f"{value / raw:5.2f}x",
            ">= 0.25x",
        )
        for how, raw in (("a write each", each), ("batched writes", batched))
    ]


def parl_payload(actor, size: int, reps: int, way: str = "echo") -> float:
    x = np.ones(size // 4, dtype=np.float32)
    actor.echo(x[:10])
    call = {
        "echo": lambda: actor.echo(x),
        "sum": lambda: actor.sum(x),
        "make": lambda: actor.make(size // 4),
    }[way]
    for _ in range(2):  # the steady state: pages and segments of this size already at hand
        y = call()
    t0 = time.perf_counter()
    for _ in range(reps):
        y = call()
    elapsed = time.perf_counter() - t0
    assert way == "sum" or y.nbytes == size
    return size * reps / elapsed / 1e6


def memcpy_rate(size: int, reps: int) -> float:
    """One memcpy of `size` bytes into fresh memory, MB/s (what a receiver's copy costs)."""
    src = np.ones(size // 4, dtype=np.float32)
    t0 = time.perf_counter()
    for _ in range(reps):
        dst = np.empty_like(src)
        np.copyto(dst, src)
    return size * reps / (time.perf_counter() - t0) / 1e6


def shm_table(
    shared, plain, raw_port: int, scale: float, rates: dict[str, float] | None = None
) -> list[tuple[str, ...]]:
    """W3: shared memory, the socket, a raw socket and memcpy, in MB/s, one run.

    `rates`, when given, receives the shared-memory rates by `"<mb> <way>"`.
    """
    rows = []
    for mb, reps in ((1, 200), (16, 20), (128, 4)):
        reps = max(2, int(reps * scale))
        size = mb * 1024 * 1024
        raw = raw_payload(raw_port, size, reps)
        copy = memcpy_rate(size, reps)
        for way in ("echo", "sum", "make"):
            on = parl_payload(shared, size, reps, way)
            off = parl_payload(plain, size, reps, way)
            if rates is not None:
                rates[f"{mb} {way}"] = on
            # A round trip moves the bytes twice: its ceiling is half a single memcpy's rate.
            ceiling = copy / 2 if way == "echo" else copy
            base = raw if way == "echo" else 2 * raw
            rows.append(
                (
                    f"W3 {mb:3d} MB {way}",
                    f"{on:8.0f}",
                    f"{off:8.0f}",
                    f"{base:8.0f}",
                    f"{ceiling:8.0f}",
                    f"{on / off:5.2f}x",
                    f"{on / ceiling:5.2f}x",
                )
            )
    return rows


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )


def parl_creation(client, n: int, cls=None) -> list[float]:
    times = []
    for _ in range(n):
        wait_for_vacant(client, 1)
        t0 = time.perf_counter()
        actor = (cls or Adder)()
        actor.add(1, 2)
        times.append(time.perf_counter() - t0)
        del actor
    return times


def user_class_creation(client, cls, n: int, settle: float) -> tuple[float, list[float]]:
    """The first actor of a user's class, then `n` more, each `settle` s after the last."""
    remote = parl.remote_class(cls)
    first = parl_creation(client, 1, remote)[0]
    later = []
    for _ in range(n):
        time.sleep(settle)  # the freed slot's fresh process imports what the last one did
        later += parl_creation(client, 1, remote)
    return first, later


def user_class_times(client, n: int, settle: float) -> dict[str, float]:
    """W4 for classes whose modules import numpy and torch, shipped as the user's code, in ms.

    The keys are those of `compare/_workloads.run_user_creation`, PARL 2.x's side.
    """
    sys.path.insert(0, os.path.join(HERE, "w4_classes"))  # as a user's own modules
    from numpy_actor import NumpyBench

    classes = [("numpy", NumpyBench)]
    try:
        from torch_actor import TorchBench
    except ImportError:
        print("torch is not installed: no torch rows")
    else:
        classes.append(("torch", TorchBench))
    times = {}
    for name, cls in classes:
        first, later = user_class_creation(client, cls, n, settle)
        times[f"W4 {name} 1st ms"] = first * 1e3
        times[f"W4 {name} later ms"] = statistics.median(later) * 1e3
    return times


def user_class_rows(
    ours: dict[str, float], parl2: dict[str, float] | None
) -> list[tuple[str, ...]]:
    """W4's user-module rows, with PARL 2.x's time for the same class beside ours if it ran."""
    rows = []
    for key, ms in ours.items():
        _, name, which, _ = key.split()
        theirs = (parl2 or {}).get(key)
        later = which == "later"
        rows.append(
            (
                f"W4 {name} module, {'later' if later else '1st actor'} (ms)",
                f"{ms:8.1f}",
                "" if theirs is None else f"{theirs:8.1f}",
                "" if theirs is None else f"{ms / theirs:5.2f}x",
                "<= 10 ms, <= 0.5x" if later else "",
            )
        )
    return rows


def record_preloaded(times: dict[str, float], plain_ms: float, preload: list[str]) -> None:
    """The first actor of each user-module class whose module was preloaded, as a result row.

    Its peer: an actor of a class of plain Python (nothing to import), created in the same run
    (`plain_ms`, the median of several): the most that preloading can give the first actor.
    """
    load = "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    rows = [
        Row(
            task=f"the first actor of a class whose module imports {name}",
            algorithm=f"actor creation, {name} preloaded (parl.connect(preload=...))",
            metric="ms until its first answer",
            better="lower",
            ours=round(times[f"W4 {name} 1st ms"], 1),
            peer="an actor of a class of plain Python in the same run (median)",
            peer_value=round(plain_ms, 1),
            seeds=[],
            command=command_line(),
            note=(
                f"Target: 20 ms; preloaded {', '.join(preload)}; later actors of the same class "
                f"{times[f'W4 {name} later ms']:.1f} ms; {load}."
            ),
        )
        for name in ("numpy", "torch")
        if name in preload and f"W4 {name} 1st ms" in times
    ]
    record("remote-calls", rows)


def parl2_times(python: str | None, n: int, settle: float) -> dict[str, float] | None:
    """PARL 2.x's W4 for the same classes, on a cluster of its own (`compare/parl2_run.py`)."""
    if python is None:
        return None
    sys.path.insert(0, os.path.join(HERE, "compare"))
    from parl2_run import run_w4

    print(f"PARL 2.x's W4 ({python})...", flush=True)
    times, why = run_w4(python, n=n, settle=settle)
    if why:
        print(why)
    return times


def wait_for_vacant(client, slots: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = client.status()
        # A freed slot is vacant once its fresh warm process is up; give it that moment.
        if status["totals"]["cpu_vacant"] >= slots:
            time.sleep(0.3)
            return
        time.sleep(0.05)
    raise TimeoutError("no vacant slot")


def _cpu_seconds(proc: psutil.Process) -> float:
    try:
        return sum(proc.cpu_times()[:2])
    except psutil.Error:  # gone meanwhile
        return 0.0


def wait_for_quiet(limit_s: float = 90.0, busy: float = 0.05) -> None:
    """Wait (at most `limit_s`) until no process of this run works more than `busy` of a CPU.

    After W4 the warm processes import in the background what its actors imported (torch
    takes seconds of CPU each); a latency measured meanwhile would time that, not calls.
    """
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = {p: _cpu_seconds(p) for p in psutil.Process().children(recursive=True)}
        time.sleep(1.0)
        if all(_cpu_seconds(p) - cpu < busy for p, cpu in before.items()):
            return


def parl_parallelism(actors, n: int, rounds: int = 3) -> float:
    """Serial (one actor, twice) vs parallel (two actors at once): best times of `rounds`."""
    serial, parallel = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        actors[0].spin(n)
        actors[0].spin(n)
        serial.append(time.perf_counter() - t0)
        threads = [threading.Thread(target=a.spin, args=(n,)) for a in actors[:2]]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        parallel.append(time.perf_counter() - t0)
    return min(serial) / min(parallel)


def us(seconds: float) -> str:
    return f"{seconds * 1e6:8.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--w3", action="store_true", help="only the shared-memory table (W3)")
    parser.add_argument("--w2", action="store_true", help="only the pipelined calls (W2)")
    parser.add_argument("--w4", action="store_true", help="only the actor-creation rows (W4)")
    parser.add_argument(
        "--lanes", action="store_true", help="only the actor's small-call lane on against off"
    )
    parser.add_argument(
        "--settle", type=float, default=8.0, help="seconds between W4's user-module actors"
    )
    parser.add_argument(
        "--parl2",
        metavar="PYTHON",
        default=None,
        help="with --w4: the python of a PARL 2.x virtual environment, to time PARL's W4 too",
    )
    parser.add_argument(
        "--ray",
        metavar="PYTHON",
        default=None,
        help="with --w3: the python of a Ray virtual environment, to time Ray's object store "
        "on the same round trips right after ours (compare/ray_w3.py)",
    )
    parser.add_argument("--n", type=int, default=0, help="W4's later user-module actors")
    parser.add_argument(
        "--preload",
        default="",
        metavar="MODULES",
        help="parl.connect(preload=...): modules the warm processes import before W4's first "
        "actors, which come once every warm process has imported them",
    )
    parser.add_argument(
        "--tls", action="store_true", help="only what TLS costs W1 and W3 (tls_bench.py)"
    )
    args = parser.parse_args()
    if args.tls:  # each mode in a process of its own: TLS is a setting of the whole process
        here = os.path.dirname(os.path.abspath(__file__))
        quick = ["--quick"] if args.quick else []
        sys.exit(subprocess.call([sys.executable, os.path.join(here, "tls_bench.py"), *quick]))
    scale = 0.2 if args.quick else 1.0
    n_blocks = max(5, int(20 * scale))
    n_calls = int(40000 * scale)
    rows: list[tuple[str, str, str, str, str]] = []
    w3: list[tuple[str, ...]] = []
    ours: dict[str, float] = {}
    ray_rates: dict[str, float] = {}

    server, echo_port, raw_port = start_raw_server()
    own_server, own_port, _ = start_raw_server(own_session=True)
    preload = [name for name in args.preload.split(",") if name]
    warm = {"preload": preload} if preload else {}  # (a tree from before preloading: none)
    client = parl.connect(cpu_num=6, log_to_driver=False, **warm)
    try:
        wait_for_vacant(client, 6)
        if preload:  # then until every warm process has imported them (on a busy machine
            # one import of torch takes many seconds)
            print(f"warm processes preloading {', '.join(preload)}; W4 once they are done")
            time.sleep(args.settle)
            wait_for_quiet(limit_s=300)
        w4_user: list[tuple[str, ...]] = []
        w4_plain: list[tuple[str, ...]] = []
        n_w4 = args.n or max(3, int(10 * scale))
        if not (
            args.w2 or args.w3 or args.lanes
        ):  # first, while no actor has imported numpy or torch yet
            w4_times = user_class_times(client, n_w4, args.settle)
            w4_user = user_class_rows(w4_times, None)
            if preload:  # the first actors' peer, in the same run
                plain_ms = statistics.median(parl_creation(client, n_w4)) * 1e3
                w4_plain = [("W4 plain class (ms, median)", f"{plain_ms:8.1f}", "", "", "")]
                record_preloaded(w4_times, plain_ms, preload)
        if args.w4:
            parl.disconnect()  # PARL's run gets the machine to itself
            rows += user_class_rows(w4_times, parl2_times(args.parl2, n_w4, args.settle))
            rows += w4_plain
        elif args.lanes:
            rows += lane_rows(n_blocks)
        elif args.w2:
            rows += w2_table(client, echo_port, n_calls, 3 if args.quick else 5)
        elif args.w3:
            w3 = shm_table(Actor(), socket_only_actor(), raw_port, scale, ours)
            if args.ray:
                ray_rates = ray_w3(args.ray, scale)
        else:
            one = Actor()
            wait_for_quiet()
            rows += w1_rows(one, echo_port, n_blocks, own_port=own_port)
            rows += lane_rows(n_blocks)

            rows += w2_table(client, echo_port, n_calls, 3 if args.quick else 5)

            for mb, reps in ((1, 200), (16, 20), (128, 4)):
                reps = max(2, int(reps * scale))
                size = mb * 1024 * 1024
                raw_mbs = raw_payload(raw_port, size, reps)
                ours_mbs = parl_payload(one, size, reps)
                rows.append(
                    (
                        f"W3 {mb} MB round trip (MB/s)",
                        f"{ours_mbs:8.0f}",
                        f"{raw_mbs:8.0f}",
                        f"{ours_mbs / raw_mbs:5.2f}x",
                        ">= 0.5x",
                    )
                )
            socket_only = socket_only_actor()
            w3 = shm_table(one, socket_only, raw_port, scale)
            del one, socket_only

            creation = parl_creation(client, max(5, int(20 * scale)))
            rows.append(
                (
                    "W4 actor creation (ms, median)",
                    f"{statistics.median(creation) * 1e3:8.1f}",
                    "",
                    "",
                    "<= 20 ms",
                )
            )
            # The same with a class whose methods use numpy: its process imports numpy first.
            creation = parl_creation(client, max(5, int(20 * scale)), Actor)
            rows.append(
                (
                    "W4 creation, a numpy class (ms)",
                    f"{statistics.median(creation) * 1e3:8.1f}",
                    "",
                    "",
                    "",
                )
            )
            rows += w4_user + w4_plain

            wait_for_vacant(client, 2)
            spinners = [Actor(), Actor()]
            speedup = parl_parallelism(spinners, int(3_000_000 * max(scale, 0.5)))
            rows.append(
                ("W5 2 actors vs serial (speedup)", f"{speedup:8.2f}", "1.00", "", ">= 1.8x")
            )
    finally:
        parl.disconnect()
        for proc in (server, own_server):
            proc.kill()
            proc.wait()
    load = "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    if rows:
        baseline = "PARL 2.x" if args.w4 else "raw baseline"
        against = "PARL 2.x, the same classes" if args.w4 else "the raw uvloop+msgspec baseline"
        print(
            f"\nparl-remote vs {against} ({os.cpu_count()} CPUs, {sys.version.split()[0]}, {load})"
        )
        print_table(("workload", "parl-remote", baseline, "ratio", "target"), rows)
    if w3:
        print_w3(w3, load)
    if ray_rates:
        print_ray_w3(ours, ray_rates, load)


def socket_only_actor() -> Actor:
    """An actor whose connections from this client never use shared memory."""
    old = os.environ.get("PARL_SHM_MIN_BYTES")
    os.environ["PARL_SHM_MIN_BYTES"] = "0"  # read when a connection opens: the socket only
    try:
        return Actor()
    finally:
        if old is None:
            os.environ.pop("PARL_SHM_MIN_BYTES")
        else:
            os.environ["PARL_SHM_MIN_BYTES"] = old


def ray_w3(python: str, scale: float) -> dict[str, float]:
    """Ray's rates on W3's round trips, from `compare/ray_w3.py` run by `python`."""
    sizes = ((1, 200), (16, 20), (128, 4))
    here = os.path.dirname(os.path.abspath(__file__))
    command = [
        python,
        os.path.join(here, "compare", "ray_w3.py"),
        "--sizes",
        ",".join(str(mb) for mb, _ in sizes),
        "--reps",
        ",".join(str(max(2, int(reps * scale))) for _, reps in sizes),
    ]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_ray_w3(ours: dict[str, float], ray_rates: dict[str, float], load: str) -> None:
    print(
        "\nW3 against Ray's shared-memory object store, MB/s, the same round trips right after "
        f"ours (what Ray's get returns is a read-only view; ours are writable arrays; {load})"
    )
    rows = [
        (
            f"W3 {key.split()[0]:>3} MB {key.split()[1]}",
            f"{on:8.0f}",
            f"{ray_rates[key]:8.0f}",
            f"{on / ray_rates[key]:5.2f}x",
        )
        for key, on in ours.items()
        if key in ray_rates
    ]
    print_table(("workload", "parl-remote", "Ray", "ratio"), rows)
    results = [
        Row(
            task=f"{key.split()[0]} MB numpy round trip",
            algorithm="remote call through shared memory",
            metric="GB/s",
            better="higher",
            ours=round(on / 1000, 2),
            peer="Ray 2.60 object store",
            peer_value=round(ray_rates[key] / 1000, 2),
            seeds=[],
            command=command_line(),
            note=f"The same round trips right after ours; {load}.",
        )
        for key, on in ours.items()
        if key in ray_rates and key.split()[1] == "echo"
    ]
    record("remote-calls", results)


def print_w3(w3: list[tuple[str, ...]], load: str) -> None:
    print(
        "\nW3 in MB/s (sum: the argument only, make: the result only; raw socket: the same "
        f"bytes one way at a time, memcpy: one copy, halved for a round trip; {load})"
    )
    print_table(
        ("workload", "shared mem", "socket", "raw socket", "memcpy", "vs socket", "vs memcpy"),
        w3,
    )


if __name__ == "__main__":
    main()

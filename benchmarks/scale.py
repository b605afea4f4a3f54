"""What one master sustains: a real master against simulated workers and clients.

One real master (`python -m parl_remote.master._master`, with its dashboard) on loopback, and
simulated peers in a few processes (`--procs`): each an asyncio loop of real connections that
run the token handshake and speak the real messages. A simulated worker registers its CPU
slots, reports its load every `PARL_HEARTBEAT_S` (`WorkerHeartbeat`), and answers the actor
lifecycle as a worker does (`StartActor` -> `ActorStarted`, `StopActor` -> `ActorExited`), with
no process behind it. A simulated client registers, pings, and creates and frees actors in a
loop (`CreateActor` -> `ActorAssigned` -> `ReleaseActor`). For each number of workers N (each
declaring `--cpus` slots) and of clients C, over a steady window of `--seconds`:

- the master's CPU share (its CPU seconds over the wall seconds: cores) and resident memory;
- heartbeat lag: a sampled worker sends a heartbeat and, right after it on the same
  connection, a `QueryActor`; the master handles a connection's messages in order, so the
  reply's round trip bounds the heartbeat's processing lag from above (p50, p99);
- placement latency (`CreateActor` to `ActorAssigned`) and throughput (actors placed a second);
- `xparl status` latency (a `StatusRequest` for the summary and the first page, on a new
  connection, as the CLI sends it) and the dashboard API's (a random page of `/api/cluster`
  and the first of `/api/actors`, p99 over both), requested while the load runs, the
  dashboard's from a thread of their own, one after another;
- what the machine gave the master: the share of the window it waited for a CPU while it had
  work (its threads' run-queue delay, from `/proc/PID/task/*/schedstat`), and the CPU its
  simulated peers took beside it. On a machine shared with the simulators (and whatever else
  runs), latencies are the master's work plus that wait.

The smallest N is the baseline of the run: the growth per worker is the slope from it to the
largest. The master's CPU per heartbeat and per placement come from a fit over every run
(`_costs`), and with them what one core has room for: the heartbeats of how many workers, or,
beside the heartbeats of the largest N, how many placements a second. The last line, for the
largest N: `scale: workers=N master_cpu=C master_rss_mb=M
heartbeat_p99_s=H placements_per_s=P dashboard_p99_ms=D`. Result rows (`_results.record`)
compare the largest N with the smallest.

    nice python benchmarks/scale.py --workers 100,1000 --clients 1,100
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _results import Row, command_line, record

from parl_dashboard._data import PER_PAGE
from parl_remote._config import settings
from parl_remote.engines.xparl import _cluster
from parl_remote.wire.protocol import messages as m

_OPEN_AT_ONCE = 64  # handshakes a simulator runs at once
_SATURATED = 0.9  # a master busy or waiting for a CPU this share of a run's window: never idle


def _pct(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- a simulator process ---------------------------------------------------------------------------
async def _simulate(args: argparse.Namespace) -> dict:
    from parl_remote.wire._transport import open_async

    host, port = args.address.rsplit(":", 1)
    token = os.environ["PARL_CLUSTER_TOKEN"].encode()
    loop = asyncio.get_running_loop()
    start, end = args.start, args.end  # the window, in time.time()
    lag: list[float] = []
    placed: list[float] = []
    probes: dict[int, float] = {}
    asked: dict[int, float] = {}
    failed = [0]
    rid = iter(range(1, 1 << 62))
    hostname = f"sim-{os.getpid()}"

    def in_window() -> bool:
        return start <= time.time() <= end

    def worker_message(conn, msg, buffers) -> None:
        kind = type(msg)
        if kind is m.StartActor:
            conn.send(m.ActorStarted(msg.actor_id, 1, os.getpid()), batch=True)
        elif kind is m.StopActor:
            conn.send(m.ActorExited(msg.actor_id, msg.reason, 0), batch=True)
        elif kind is m.ActorState and msg.request_id in probes:
            sent = probes.pop(msg.request_id)
            if in_window():
                lag.append(time.perf_counter() - sent)

    def client_message(conn, msg, buffers) -> None:
        kind = type(msg)
        if kind is m.ActorAssigned:
            sent = asked.pop(msg.request_id, None)
            if sent is not None and in_window():
                placed.append(time.perf_counter() - sent)
            conn.send(m.ReleaseActor(msg.actor_id))
            ask(conn)
        elif kind is m.CreateFailed:
            asked.pop(msg.request_id, None)
            failed[0] += 1
            loop.call_later(0.05, ask, conn)

    def ask(conn) -> None:
        if conn.closed:
            return
        request_id = next(rid)
        asked[request_id] = time.perf_counter()
        conn.send(m.CreateActor(request_id, "Simulated", wait_s=10.0))

    gate = asyncio.Semaphore(_OPEN_AT_ONCE)

    async def open_one(role: str, on_message) -> object:
        async with gate:
            return await open_async(
                host, int(port), token=token, role=role, on_message=on_message, timeout=60
            )

    workers: list = []
    clients: list = []

    async def open_worker(i: int) -> None:
        conn = await open_one("worker", worker_message)
        conn.send(
            m.RegisterWorker(
                f"{hostname}-{i}", hostname, "127.0.0.1", os.getpid(), args.cpus, [], [], 8 << 30
            )
        )
        workers.append(conn)  # it heartbeats from now on

    async def open_client(i: int) -> None:
        conn = await open_one("client", client_message)
        conn.send(m.RegisterClient(f"{hostname}-c{i}", hostname, os.getpid(), False))
        clients.append(conn)

    async def beats() -> None:
        beat = m.WorkerHeartbeat(12.5, 2 << 30, 8 << 30, 0.5)
        period, steps = settings.heartbeat_s, 20
        next_probe, asking = 0.0, False
        while time.time() < end:
            for k in range(steps):  # every worker once a period, spread over it
                for conn in workers[k::steps]:
                    if not conn.closed:
                        conn.send(beat, batch=True)
                now = time.perf_counter()  # the loop's clock counts whole milliseconds (uvloop)
                live = [conn for conn in workers[k::steps] if not conn.closed]
                if now >= next_probe and live:
                    conn = random.choice(live)
                    request_id = next(rid)
                    probes[request_id] = now
                    conn.send(beat)
                    conn.send(m.QueryActor(request_id, "none"))
                    next_probe = now + 0.02
                if k % 5 == 0:
                    for conn in clients:
                        if not conn.closed:
                            conn.send(m.Ping(), batch=True)
                if not asking and time.time() >= args.go:
                    asking = True
                    for conn in clients:
                        ask(conn)
                await asyncio.sleep(period / steps)

    beating = asyncio.ensure_future(beats())
    await asyncio.gather(*(open_worker(i) for i in range(args.sim_workers)))
    await asyncio.gather(*(open_client(i) for i in range(args.sim_clients)))
    await beating
    for conn in (*workers, *clients):
        conn.close()
    return {"lag": lag, "placed": placed, "failed": failed[0]}


def _simulator_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    for name in ("--address", "--out"):
        parser.add_argument(name, required=True)
    for name in ("--sim-workers", "--sim-clients", "--cpus"):
        parser.add_argument(name, type=int, required=True)
    for name in ("--go", "--start", "--end"):
        parser.add_argument(name, type=float, required=True)
    args = parser.parse_args(argv)
    import uvloop

    result = uvloop.run(_simulate(args))
    with open(args.out, "w") as f:
        json.dump(result, f)


# -- one measurement -------------------------------------------------------------------------------
def _status_ms(address: str, token: bytes) -> float:
    """An `xparl status` request's milliseconds (summary, first page); infinite on a timeout."""
    from parl_remote.cli import STATUS_PAGE, _request

    t0 = time.perf_counter()
    try:
        _request(address, lambda rid: m.StatusRequest(rid, 0, STATUS_PAGE), token=token)
    except (OSError, TimeoutError):
        return math.inf
    return (time.perf_counter() - t0) * 1e3


def _run_delay_s(pid: int) -> float:
    """Seconds the threads of `pid` have waited on a run queue while runnable (0 if unknown)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else ():
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def _cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            total += sum(proc.cpu_times()[:2])
    return total


def _get_ms(url: str) -> float:
    """A dashboard API request's milliseconds; infinite if it timed out."""
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            reply.read()
    except (OSError, TimeoutError):
        return math.inf
    return (time.perf_counter() - t0) * 1e3


def measure(n: int, c: int, args: argparse.Namespace) -> dict:
    """One master, `n` simulated workers and `c` clients: the figures of the steady window."""
    home = tempfile.mkdtemp(prefix="parl-scale-")
    token = secrets.token_hex(16)
    env = dict(
        os.environ,
        PARL_CLUSTER_TOKEN=token,
        PARL_HOME=home,
        PARL_MAX_CONNECTIONS=str(n + c + 1000),
    )
    master = _cluster.spawn(
        "parl_remote.master._master",
        ["--host", "127.0.0.1", "--port", "0", "--monitor_port", "0"],
        log=os.path.join(home, "master.log"),
        env=env,
    )
    address = f"127.0.0.1:{master.ready['port']}"
    dashboard = master.ready["dashboard"].rstrip("/")
    procs = max(1, min(args.procs, n))
    now = time.time()
    connect_s = 10 + n / 150  # handshakes of every simulated peer, with margin
    go = now + connect_s
    start = go + args.warmup
    end = start + args.seconds
    sims = []
    try:
        for i in range(procs):
            out = os.path.join(home, f"sim-{i}.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--simulate", "--address", address]
            cmd += ["--out", out, "--cpus", str(args.cpus)]
            cmd += ["--sim-workers", str(n // procs + (i < n % procs))]
            cmd += ["--sim-clients", str(c // procs + (i < c % procs))]
            cmd += ["--go", str(go), "--start", str(start), "--end", str(end)]
            sims.append((subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL), out))
        proc = psutil.Process(master.pid)
        peers = [psutil.Process(sim.pid) for sim, _ in sims]
        while time.time() < start:
            time.sleep(0.05)
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        wait0, sim0 = _run_delay_s(master.pid), _cpu_s(peers)
        status_ms, dash_ms = [], []
        pages = max(1, math.ceil(n / PER_PAGE))

        def browse() -> None:  # a person paging, beside the status requests: once at least
            while True:
                for path in (f"/api/cluster?page={random.randint(1, pages)}", "/api/actors"):
                    dash_ms.append(_get_ms(dashboard + path))
                if time.time() >= end - 0.3:
                    return
                time.sleep(0.1)

        browsing = threading.Thread(target=browse)
        browsing.start()
        while True:  # once at least, however long one takes
            status_ms.append(_status_ms(address, token.encode()))
            if time.time() >= end - 0.3:
                break
            time.sleep(0.2)
        browsing.join()
        cpu1, t1 = sum(proc.cpu_times()[:2]), time.monotonic()
        wait1, sim1 = _run_delay_s(master.pid), _cpu_s(peers)
        rss_mb = proc.memory_info().rss / 1e6
        results = []
        for sim, out in sims:
            sim.wait(60 + connect_s)
            with open(out) as f:
                results.append(json.load(f))
    finally:
        for sim, _ in sims:
            if sim.poll() is None:
                sim.kill()
                sim.wait(10)
        master.stop(timeout=10)
    registered = _registered(os.path.join(home, "master.log"))
    assert registered >= n, f"{registered} of {n} workers registered (see {home}/master.log)"
    shutil.rmtree(home, ignore_errors=True)
    lag = [x for r in results for x in r["lag"]]
    placed = [x for r in results for x in r["placed"]]
    return {
        "workers": n,
        "clients": c,
        "master_cpu": (cpu1 - cpu0) / (t1 - t0),
        "master_wait": (wait1 - wait0) / (t1 - t0),
        "peers_cpu": (sim1 - sim0) / (t1 - t0),
        "master_rss_mb": rss_mb,
        "heartbeat_p50_s": _pct(lag, 0.5),
        "heartbeat_p99_s": _pct(lag, 0.99),
        "placement_p50_ms": _pct(placed, 0.5) * 1e3,
        "placement_p99_ms": _pct(placed, 0.99) * 1e3,
        "placements_per_s": len(placed) / args.seconds,
        "status_p99_ms": _pct(status_ms, 0.99),
        "dashboard_p99_ms": _pct(dash_ms, 0.99),
        "failed": sum(r["failed"] for r in results),
    }


def _registered(log: str) -> int:
    """How many workers the master's log says registered."""
    with open(log, errors="replace") as f:
        return sum(" registered with " in line for line in f)


# -- the run -------------------------------------------------------------------------------------
_COLUMNS = (
    ("workers", "{:>7}"),
    ("clients", "{:>7}"),
    ("master_cpu", "{:>10.2f}"),
    ("master_wait", "{:>11.2f}"),
    ("peers_cpu", "{:>9.2f}"),
    ("master_rss_mb", "{:>13.0f}"),
    ("heartbeat_p50_s", "{:>15.4f}"),
    ("heartbeat_p99_s", "{:>15.4f}"),
    ("placement_p50_ms", "{:>16.1f}"),
    ("placement_p99_ms", "{:>16.1f}"),
    ("placements_per_s", "{:>16.0f}"),
    ("status_p99_ms", "{:>13.1f}"),
    ("dashboard_p99_ms", "{:>16.1f}"),
)


def main() -> None:
    if sys.argv[1:2] == ["--simulate"]:
        _simulator_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="100,1000", help="numbers of simulated workers")
    parser.add_argument("--clients", default="1,100", help="numbers of concurrent clients")
    parser.add_argument("--cpus", type=int, default=10, help="CPU slots each worker declares")
    parser.add_argument("--procs", type=int, default=2, help="simulator processes")
    parser.add_argument("--seconds", type=float, default=8.0, help="the steady window")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--results", default=None, help="where result files go")
    args = parser.parse_args()
    ns = [int(x) for x in args.workers.split(",")]
    cs = [int(x) for x in args.clients.split(",")]
    load = os.getloadavg()[0]
    print(" ".join(name.rjust(len(fmt.format(0))) for name, fmt in _COLUMNS), flush=True)
    rows = []
    for n in ns:
        for c in cs:
            row = measure(n, c, args)
            rows.append(row)
            print(" ".join(fmt.format(row[name]) for name, fmt in _COLUMNS), flush=True)
    load = (load + os.getloadavg()[0]) / 2
    top_c = max(cs)
    by_n = {r["workers"]: r for r in rows if r["clients"] == top_c}
    small, large = by_n[min(ns)], by_n[max(ns)]
    span = large["workers"] - small["workers"]
    if span:
        cpu_slope = (large["master_cpu"] - small["master_cpu"]) / span
        rss_slope = (large["master_rss_mb"] - small["master_rss_mb"]) / span
        print(
            f"growth per worker ({small['workers']} -> {large['workers']}, {top_c} clients): "
            f"{cpu_slope * 1e3:.3f} cores per 1,000 workers, {rss_slope * 1e3:.3f} KB each"
        )
    saturated = [r for r in rows if _saturated(r)]
    if saturated:
        shares = ", ".join(f"{r['master_cpu']:.2f}+{r['master_wait']:.2f}" for r in saturated)
        print(
            f"the master was never idle in {len(saturated)} of the {len(rows)} runs (busy, or "
            f"waiting for a CPU, {_SATURATED:.0%} of the window or more: {shares}): "
            "there it did what the machine gave it a CPU for, and its costs are fitted over "
            "the other runs only"
        )
    costs = _costs(rows)
    if costs is not None:
        beat, placement, fixed = costs
        beats, room = _room(costs, large["workers"])
        print(
            f"the master's CPU, fitted over the {len(rows)} runs: {beat * 1e6:.1f} us a "
            f"heartbeat (with its share of the pings), {placement * 1e6:.1f} us a placement "
            f"(create, start, free), {fixed:.2f} cores besides"
        )
        print(
            f"one core: the heartbeats of about {(1.0 - fixed) / beat * settings.heartbeat_s:,.0f}"
            f" workers (a heartbeat each every {settings.heartbeat_s:g} s), or at "
            f"{large['workers']:,} workers ({beats:.2f} cores of heartbeats) room for "
            f"{room:,.0f} placements a second"
        )
    busy, wait = large["master_cpu"], large["master_wait"]
    print(
        f"the master at {large['workers']} workers, of the window: busy {busy:.2f}, waiting "
        f"for a CPU {wait:.2f}, idle {max(1.0 - busy - wait, 0.0):.2f} (its simulated peers "
        f"took {large['peers_cpu']:.2f} cores; load average {load:.1f} on {os.cpu_count()} cores)"
    )
    _record(small, large, rows, args, load)
    print(
        f"scale: workers={large['workers']} master_cpu={large['master_cpu']:.2f} "
        f"master_rss_mb={large['master_rss_mb']:.0f} "
        f"heartbeat_p99_s={large['heartbeat_p99_s']:.4f} "
        f"placements_per_s={large['placements_per_s']:.0f} "
        f"dashboard_p99_ms={large['dashboard_p99_ms']:.1f}"
    )


def _saturated(row: dict) -> bool:
    """Whether the master was never idle in a run: busy, or waiting for a CPU, all its window.

    Such a run's CPU is what the machine gave the master, not what its work cost (and the more
    it waits, the more messages each turn of its loop handles, the less each costs).
    """
    return bool(row["master_cpu"] + row["master_wait"] >= _SATURATED)


def _costs(rows: list[dict]) -> tuple[float, float, float] | None:
    """The master's CPU seconds a heartbeat and a placement, and its cores besides.

    A least-squares fit of `master_cpu = beat x heartbeats/s + placement x placements/s +
    fixed` over the runs (workers and clients varied) in which the master was idle a while;
    None without runs enough to tell the three apart.
    """
    import numpy as np

    rows = [r for r in rows if not _saturated(r)]
    a = np.array([[r["workers"] / settings.heartbeat_s, r["placements_per_s"], 1.0] for r in rows])
    b = np.array([r["master_cpu"] for r in rows])
    if len(rows) < 3 or np.linalg.matrix_rank(a) < 3:
        return None
    (beat, placement, fixed), *_ = np.linalg.lstsq(a, b, rcond=None)
    if beat <= 0 or placement <= 0:  # the runs' noise is larger than what they varied
        return None
    return float(beat), float(placement), float(fixed)


def _room(costs: tuple[float, float, float], workers: int) -> tuple[float, float]:
    """The cores the heartbeats of `workers` take, and the placements a second one core has
    room for beside them."""
    beat, placement, fixed = costs
    beats = beat * workers / settings.heartbeat_s
    return beats, (1.0 - fixed - beats) / placement


def _record(
    small: dict, large: dict, runs: list[dict], args: argparse.Namespace, load: float
) -> None:
    if small is large:
        return
    task = f"{large['workers']} simulated workers of {args.cpus} slots, {large['clients']} clients"
    peer = f"the same master with {small['workers']} workers"
    figures = [
        ("master CPU (cores)", "lower", "master_cpu", 3),
        ("master waiting for a CPU (share of the window)", "lower", "master_wait", 3),
        ("master resident memory (MB)", "lower", "master_rss_mb", 1),
        ("heartbeat lag p99 (ms)", "lower", "heartbeat_p99_s", 3),
        ("actors placed per second", "higher", "placements_per_s", 1),
        ("dashboard API p99 (ms)", "lower", "dashboard_p99_ms", 2),
    ]
    note = f"{args.procs} simulator processes on the same machine; load {load:.1f}."
    claims = []  # metric, better, ours, peer, peer's figure, note
    for metric, better, key, digits in figures:
        scale = 1e3 if key == "heartbeat_p99_s" else 1
        ours = round(large[key] * scale, digits)
        base = round(small[key] * scale, digits)
        claims.append((metric, better, ours, peer, base, note))
    costs = _costs(runs)
    if costs is not None:  # what one core has room for, fitted over the runs
        beat, placement, fixed = costs
        beats, room = _room(costs, large["workers"])
        fitted = (
            f"Fitted over {sum(not _saturated(r) for r in runs)} runs: {beat * 1e6:.1f} us a "
            f"heartbeat, {placement * 1e6:.1f} us a placement, {fixed:.2f} cores besides; "
            f"load {load:.1f}."
        )
        claims.append(
            ("cores the heartbeats take", "lower", round(beats, 3), "one core", 1.0, fitted)
        )
        claims.append(
            (
                "placements a second one core has room for",
                "higher",
                round(room, 1),
                "the target",
                1000.0,
                fitted,
            )
        )
    rows = [
        Row(
            task=task,
            algorithm="xparl master",
            metric=metric,
            better=better,
            ours=ours,
            peer=peer_name,
            peer_value=base,
            seeds=[],
            command=command_line(),
            note=why,
        )
        for metric, better, ours, peer_name, base, why in claims
        if 0 < ours < math.inf and 0 < base < math.inf  # unmeasured, or timed out: left out
    ]
    record("scale", rows, title="One master at scale", directory=args.results)


if __name__ == "__main__":
    main()

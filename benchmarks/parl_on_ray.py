"""What the parl layer costs on Ray: a `@parl.remote_class` actor against a plain Ray actor.

One local Ray, started here; the same class runs as a parl actor (`parl.connect(backend="ray")`)
and as a plain Ray actor (`ray.remote(cls)`), and each workload runs on both in the same run:

    W1  sync call latency, add(1, 2), serial: median us            target <= 1.10x plain Ray
    W2  2 actors, 1000 calls in flight: calls/s                    target >= 0.9x plain Ray
        (parl: futures of @parl.remote_class(wait=False); Ray: ObjectRefs, one ray.get)

W1 and W2 time parl and Ray in turns (W1: 100 calls of each, W2: one wave of each, the first
side alternating), so that both see the same share of a busy machine's load.
    W3  numpy float32 argument + result round trip, 16 MB: MB/s
    W4  actor creation until its first answer: ms, median

    python benchmarks/parl_on_ray.py            # about a minute
    python benchmarks/parl_on_ray.py --quick    # fewer repetitions

The table goes to the result file `parl-on-ray` (`benchmarks/results/parl-on-ray.json`, see
`_results.py`; `--quick` runs write none).

Ray's own options: a private temp directory, no dashboard, 4 CPUs, and no token file written
to `~/.ray` (`RAY_AUTH_MODE=disabled` unless set: the Ray is local and lives for the run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import ray
from _results import Row, command_line, record

import parl_remote

# The workloads' rows: (task, metric, which way is better) by the table's name.
_CLAIMS = {
    "W1": ("add(1, 2), serial", "µs a sync call (median)", "lower"),
    "W2": ("1000 calls in flight over 2 actors", "calls per second (median of waves)", "higher"),
    "W3": ("16 MB numpy round trip", "MB/s (median)", "higher"),
    "W4": ("actor creation until its first answer", "ms (median)", "lower"),
}


class Adder:
    """The workload's class: the same code on both sides."""

    def add(self, a, b):
        return a + b

    def echo(self, x):
        return x


def _timed(fn, n):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _alternating(parl_fn, ray_fn, n, chunk=100):
    """`n` timings of each, taken in turns of `chunk` (parl first, then Ray first, ...).

    The machine's load drifts; taking turns gives both sides the same share of it.
    """
    parl_times: list[float] = []
    ray_times: list[float] = []
    turn = 0
    while len(parl_times) < n:
        size = min(chunk, n - len(parl_times))
        pairs = [(parl_fn, parl_times), (ray_fn, ray_times)]
        for fn, times in pairs if turn % 2 == 0 else pairs[::-1]:
            times += _timed(fn, size)
        turn += 1
    return parl_times, ray_times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    n1, n2, n3, n4 = (300, 3, 3, 3) if args.quick else (2000, 10, 8, 6)
    tmp = tempfile.mkdtemp(prefix="pb", dir="/tmp")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # 4 CPUs: W2 keeps two parl and two Ray actors, to time them in turns.
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, _temp_dir=f"{tmp}/ray")
    load_before = os.getloadavg()[0]
    try:
        parl_remote.connect(backend="ray")
        rows = run(n1, n2, n3, n4)
    finally:
        parl_remote.disconnect()
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{'workload':<44}{'parl on Ray':>14}{'plain Ray':>14}{'ratio':>8}  target")
    for name, parl_value, ray_value, target in rows:
        ratio = parl_value / ray_value
        print(f"{name:<44}{parl_value:>14.1f}{ray_value:>14.1f}{ratio:>7.2f}x  {target}")
    if not args.quick:
        load = f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
        path = record_rows(rows, load)
        if path:
            print(f"\nresult rows: {path}")


def record_rows(rows: list[tuple[str, float, float, str]], note: str) -> str | None:
    """The table as result rows of `parl-on-ray`."""
    results = []
    for name, parl_value, ray_value, _ in rows:
        task, metric, better = _CLAIMS[name.split()[0]]
        results.append(
            Row(
                task=task,
                algorithm="@parl.remote_class actor on Ray",
                metric=metric,
                better=better,
                ours=round(parl_value, 1),
                peer=f"a plain Ray {ray.__version__} actor",
                peer_value=round(ray_value, 1),
                seeds=[],
                command=command_line(),
                note=note,
            )
        )
    return record("parl-on-ray", results)


def run(n1: int, n2: int, n3: int, n4: int) -> list[tuple[str, float, float, str]]:
    """The four workloads, parl first then plain Ray each time; rows of the table."""
    parl_cls = parl_remote.remote_class(Adder)
    ray_cls = ray.remote(num_cpus=1)(Adder)
    rows = latency_and_arrays(parl_cls, ray_cls, n1, n3)
    rows.append(throughput(parl_remote.remote_class(Adder, wait=False), ray_cls, n2))
    rows.append(creation(parl_cls, ray_cls, n4))
    return rows


def latency_and_arrays(parl_cls, ray_cls, n1, n3):
    """W1 and W3 on one actor of each kind."""
    parl_actor = parl_cls()
    ray_actor = ray_cls.remote()
    ray.get(ray_actor.add.remote(1, 2))
    for _ in range(50):  # warm both
        parl_actor.add(1, 2)
        ray.get(ray_actor.add.remote(1, 2))
    parl_times, ray_times = _alternating(
        lambda: parl_actor.add(1, 2), lambda: ray.get(ray_actor.add.remote(1, 2)), n1
    )
    parl_us, ray_us = statistics.median(parl_times) * 1e6, statistics.median(ray_times) * 1e6
    array = np.ones(4 << 20, dtype=np.float32)  # 16 MB
    parl_s = statistics.median(_timed(lambda: parl_actor.echo(array), n3))
    ray_s = statistics.median(_timed(lambda: ray.get(ray_actor.echo.remote(array)), n3))
    return [
        ("W1 sync call add(1, 2), median (us)", parl_us, ray_us, "<= 1.10x"),
        ("W3 16 MB round trip (MB/s)", 32 / parl_s, 32 / ray_s, ""),
    ]


def throughput(future_cls, ray_cls, n2):
    """W2: 1000 calls in flight over 2 actors, parl's futures against Ray's ObjectRefs."""
    parl_actors = [future_cls(), future_cls()]
    for actor in parl_actors:
        actor.add(1, 2).get()
    ray_actors = [ray_cls.remote(), ray_cls.remote()]
    ray.get([a.add.remote(1, 2) for a in ray_actors])

    def parl_wave():
        pending = [parl_actors[i % 2].add(i, 1) for i in range(1000)]
        for future in pending:
            future.get()

    def ray_wave():
        ray.get([ray_actors[i % 2].add.remote(i, 1) for i in range(1000)])

    parl_times, ray_times = _alternating(parl_wave, ray_wave, n2, chunk=1)
    parl_s, ray_s = statistics.median(parl_times), statistics.median(ray_times)
    for actor in parl_actors:
        parl_remote.kill(actor)
    for actor in ray_actors:
        ray.kill(actor)
    return ("W2 2 actors, 1000 in flight (calls/s)", 1000 / parl_s, 1000 / ray_s, ">= 0.9x")


def creation(parl_cls, ray_cls, n4):
    """W4: a new actor until its first answer, then killed."""

    def parl_create():
        actor = parl_cls()
        actor.add(1, 2)
        parl_remote.kill(actor)

    def ray_create():
        actor = ray_cls.remote()
        ray.get(actor.add.remote(1, 2))
        ray.kill(actor)

    parl_ms = statistics.median(_timed(parl_create, n4)) * 1e3
    ray_ms = statistics.median(_timed(ray_create, n4)) * 1e3
    return ("W4 actor creation, median (ms)", parl_ms, ray_ms, "")


if __name__ == "__main__":
    main()

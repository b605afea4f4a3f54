"""The W1-W5 workloads, written once against a tiny adapter, for other frameworks.

`remote_bench.py` measures parl-remote; the scripts beside this file run the same workloads
on PARL 2.x and Ray in their own virtual environments (see ../README.md), so the numbers can
be put side by side. An adapter supplies: `make(cls, wait=True)` -> a factory of actors,
`call(actor, name, *args)` -> a pending result, and `get(pending)` -> its value.
`run_user_creation` times W4's classes of user modules (numpy, torch) on their own.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time

import numpy as np


class Worker:
    def add(self, a, b):
        return a + b

    def echo(self, x):
        return x

    def spin(self, n):
        total = 0
        for i in range(n):
            total += i
        return total


def run_all(
    make, call, get, *, n_lat: int = 5000, n_calls: int = 40000, release=lambda a: None
) -> dict:
    """Run W1-W5; return {workload: value}."""
    results = {}
    new = make(Worker)
    one = new()
    for _ in range(200):
        get(call(one, "add", 1, 2))
    times = []
    for _ in range(n_lat):
        t0 = time.perf_counter()
        get(call(one, "add", 1, 2))
        times.append(time.perf_counter() - t0)
    times.sort()
    results["W1 median us"] = statistics.median(times) * 1e6
    results["W1 p99 us"] = times[int(0.99 * (len(times) - 1))] * 1e6

    four = [new() for _ in range(4)]
    t0 = time.perf_counter()
    done = 0
    while done < n_calls:
        pending = [call(four[i % 4], "add", i, 1) for i in range(1000)]
        for p in pending:
            get(p)
        done += 1000
    results["W2 calls/s"] = done / (time.perf_counter() - t0)
    for actor in four:
        release(actor)

    for mb, reps in ((1, 100), (16, 10), (128, 3)):
        x = np.ones(mb * 1024 * 1024 // 4, dtype=np.float32)
        get(call(one, "echo", x[:10]))
        t0 = time.perf_counter()
        for _ in range(reps):
            get(call(one, "echo", x))
        results[f"W3 {mb} MB MB/s"] = mb * 1.048576 * reps / (time.perf_counter() - t0)

    created = []
    for _ in range(10):
        t0 = time.perf_counter()
        actor = new()
        get(call(actor, "add", 1, 2))
        created.append(time.perf_counter() - t0)
        release(actor)
        time.sleep(0.5)
    results["W4 creation ms"] = statistics.median(created) * 1e3

    pair = [new(), new()]
    n = 3_000_000
    t0 = time.perf_counter()
    get(call(pair[0], "spin", n))
    get(call(pair[0], "spin", n))
    serial = time.perf_counter() - t0
    threads = [threading.Thread(target=lambda a=a: get(call(a, "spin", n))) for a in pair]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results["W5 speedup"] = serial / (time.perf_counter() - t0)
    return results


def user_classes() -> list[tuple[str, type]]:
    """W4's classes in user modules (`../w4_classes/`): one imports numpy, one torch."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(os.path.dirname(here), "w4_classes"))  # a user's modules
    from numpy_actor import NumpyBench

    classes: list[tuple[str, type]] = [("numpy", NumpyBench)]
    try:
        from torch_actor import TorchBench
    except ImportError:
        print("torch is not installed: no torch rows")
    else:
        classes.append(("torch", TorchBench))
    return classes


def run_user_creation(
    make, call, get, *, n: int = 10, settle: float = 3.0, release=lambda a: None
) -> dict:
    """W4 for the user-module classes: the first actor of each, then `n` more `settle` s apart."""
    results = {}
    for name, cls in user_classes():
        new = make(cls)
        created = []
        for _ in range(n + 1):
            t0 = time.perf_counter()
            actor = new()
            get(call(actor, "add", 1, 2))
            created.append(time.perf_counter() - t0)
            print(f"  W4 {name} actor {len(created)}: {created[-1] * 1e3:.1f} ms", flush=True)
            release(actor)
            del actor
            time.sleep(settle)
        results[f"W4 {name} 1st ms"] = created[0] * 1e3
        results[f"W4 {name} later ms"] = statistics.median(created[1:]) * 1e3
    return results


def report(name: str, results: dict) -> None:
    """Print one framework's numbers."""
    print(f"\n{name}")
    for key, value in results.items():
        print(f"  {key:18s} {value:12.1f}")

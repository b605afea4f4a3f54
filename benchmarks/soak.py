"""Soak: a million calls from 4 threads over 4 actors; memory must stay flat, no call may fail.

Each thread cycles over all four actors (so every actor is shared by every thread). The RSS of
the master, the worker and each actor is sampled throughout; growth is reported from the end of
the warm-up (the first tenth of the calls) to the end, in percent.

    python benchmarks/soak.py [--calls 1000000]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import psutil
from _cluster_util import BenchCluster

import parl


@parl.remote_class
class Worker:
    def __init__(self):
        self.total = 0

    def add(self, a, b):
        self.total += 1
        return a + b

    def pid(self):
        return os.getpid()


def last_calls(samples: list[dict]) -> int:
    return samples[-1]["calls"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=1_000_000)
    args = parser.parse_args()
    cluster = BenchCluster(4)
    os.environ["PARL_CLUSTER_TOKEN"] = cluster.env["PARL_CLUSTER_TOKEN"]
    errors: list[BaseException] = []
    try:
        parl.connect(cluster.address, log_to_driver=False)
        actors = [Worker() for _ in range(4)]
        procs = {
            "master": psutil.Process(cluster.master.pid),
            "worker": psutil.Process(cluster.worker.pid),
        }
        procs.update({f"actor{i}": psutil.Process(a.pid()) for i, a in enumerate(actors)})
        procs["client"] = psutil.Process()
        per_thread = args.calls // 4
        done = [0] * 4
        samples: list[dict] = []

        def work(t: int) -> None:
            try:
                for i in range(per_thread):
                    actor = actors[(t + i) % 4]
                    if actor.add(i, t) != i + t:
                        raise AssertionError("wrong result")
                    done[t] = i + 1
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        start = time.monotonic()
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            time.sleep(1)
            samples.append(
                {"calls": sum(done), **{k: p.memory_info().rss for k, p in procs.items()}}
            )
        for t in threads:
            t.join()
        elapsed = time.monotonic() - start
        samples.append({"calls": sum(done), **{k: p.memory_info().rss for k, p in procs.items()}})
        served = sum(a.total for a in actors)
        if served != last_calls(samples):
            errors.append(AssertionError(f"the actors counted {served} calls"))
    finally:
        parl.disconnect()
        cluster.stop()

    warm = next(s for s in samples if s["calls"] >= args.calls // 10)
    last = samples[-1]
    print(
        f"\nsoak: {last['calls']} calls from 4 threads over 4 actors in {elapsed:.0f} s "
        f"({last['calls'] / elapsed:.0f} calls/s), errors: {len(errors)}"
    )
    print(f"  {'process':8s} {'RSS after warm-up':>18s} {'RSS at the end':>15s} {'growth':>8s}")
    for key in procs:
        growth = (last[key] - warm[key]) / warm[key] * 100
        print(
            f"  {key:8s} {warm[key] / 2**20:15.1f} MB {last[key] / 2**20:12.1f} MB {growth:7.2f}%"
        )
    for error in errors[:3]:
        print("  error:", repr(error))


if __name__ == "__main__":
    main()

"""W3 on Ray's shared-memory object store: numpy round trips, timed as `remote_bench.py` times ours.

Run by `remote_bench.py --w3 --ray PYTHON` in a virtual environment with Ray installed; prints
one JSON object, `{"<mb> <way>": MB/s}`, on its last line. The same three ways as ours: `echo`
(argument and result), `sum` (the argument only) and `make` (the result only), each after two
warm-up calls of the same size, `size * reps / seconds`. Arrays of this size travel through
Ray's object store (plasma) both ways; what `ray.get` returns is a read-only view of it.

    /tmp/ray-venv/bin/python benchmarks/compare/ray_w3.py --sizes 1,16,128 --reps 200,20,4
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import ray


class Store:
    def echo(self, x):
        return x

    def sum(self, x):
        return float(x[:1].sum())

    def make(self, n):
        return np.ones(n, dtype=np.float32)


def rate(actor, size: int, reps: int, way: str) -> float:
    x = np.ones(size // 4, dtype=np.float32)
    call = {
        "echo": lambda: ray.get(actor.echo.remote(x)),
        "sum": lambda: ray.get(actor.sum.remote(x)),
        "make": lambda: ray.get(actor.make.remote(size // 4)),
    }[way]
    for _ in range(2):  # the steady state, as remote_bench.py's parl_payload
        call()
    t0 = time.perf_counter()
    for _ in range(reps):
        y = call()
    elapsed = time.perf_counter() - t0
    assert way == "sum" or y.nbytes == size
    return size * reps / elapsed / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,16,128", help="MB, comma-separated")
    parser.add_argument("--reps", default="200,20,4", help="repetitions per size")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    reps = [int(r) for r in args.reps.split(",")]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actor = ray.remote(Store).remote()
        ray.get(actor.sum.remote(np.ones(4, dtype=np.float32)))
        results = {}
        for mb, n in zip(sizes, reps, strict=True):
            for way in ("echo", "sum", "make"):
                results[f"{mb} {way}"] = rate(actor, mb * 1024 * 1024, n, way)
    finally:
        ray.shutdown()
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main()

"""What TLS costs a remote call: W1 and W3 of `remote_bench.py` on a plaintext and a TLS cluster.

Each mode runs in a process of its own (TLS is a setting of the whole process), one after the
other in one run, against a local cluster of one slot. W3 goes through the socket
(`PARL_SHM_MIN_BYTES=0`): the path between machines, the one TLS encrypts (on one machine,
large payloads bypass the socket through shared memory, TLS or not).

    python benchmarks/tls_bench.py            # about a minute
    python benchmarks/tls_bench.py --quick

The table goes to the result file `tls` (`benchmarks/results/tls.json`, see `_results.py`;
`--quick` runs write none).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from _results import Row, command_line, record

import parl


@parl.remote_class
class Echo:
    def add(self, a, b):
        return a + b

    def echo(self, x):
        return x


def measure(calls: int, reps: int) -> dict[str, float]:
    """In this process: W1 median/p99 latency (us) and the 16 MB round trip (MB/s)."""
    parl.connect(cpu_num=1)
    actor = Echo()
    for _ in range(200):
        actor.add(1, 2)
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        actor.add(1, 2)
        times.append(time.perf_counter() - t)
    times.sort()
    array = np.ones(4 << 20, dtype=np.float32)  # 16 MB
    actor.echo(array)
    t = time.perf_counter()
    for _ in range(reps):
        actor.echo(array)
    rate = reps * 2 * array.nbytes / (time.perf_counter() - t) / 1e6
    parl.disconnect()
    return {
        "w1_median_us": statistics.median(times) * 1e6,
        "w1_p99_us": times[int(len(times) * 0.99)] * 1e6,
        "w3_16mb_mb_s": rate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", choices=("plain", "tls"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    calls, reps = (500, 5) if args.quick else (3000, 20)
    if args.child:
        print(json.dumps(measure(calls, reps)))
        return
    results = {}
    with tempfile.TemporaryDirectory() as home:
        for mode in ("plain", "tls"):
            env = dict(os.environ, PARL_SHM_MIN_BYTES="0", PARL_HOME=home)
            env.pop("PARL_TLS", None)
            if mode == "tls":
                env["PARL_TLS"] = "1"
            cmd = [sys.executable, __file__, "--child", mode, *(["--quick"] if args.quick else [])]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    plain, tls = results["plain"], results["tls"]
    print(f"{'':28}{'plaintext':>12}{'TLS 1.3':>12}{'TLS/plain':>11}")
    rows = []
    for key, label, task, metric, better in _CLAIMS:
        print(f"{label:28}{plain[key]:12.1f}{tls[key]:12.1f}{tls[key] / plain[key]:10.2f}x")
        rows.append(
            Row(
                task=task,
                algorithm="remote call on a TLS 1.3 cluster",
                metric=metric,
                better=better,
                ours=round(tls[key], 1),
                peer="the same call on a plaintext cluster",
                peer_value=round(plain[key], 1),
                seeds=[],
                command=command_line(),
            )
        )
    path = None if args.quick else record("tls", rows, title=_TITLE)
    if path:
        print(f"\nresult rows: {path}")


_TITLE = "TLS: what encryption costs a remote call"
# (the measurement's key, its label in the table, the row's task, metric and better)
_CLAIMS = (
    ("w1_median_us", "W1 add(1, 2) median (us)", "add(1, 2)", "µs a call (median)", "lower"),
    ("w1_p99_us", "W1 add(1, 2) p99 (us)", "add(1, 2)", "µs a call (99th percentile)", "lower"),
    (
        "w3_16mb_mb_s",
        "W3 16 MB round trip (MB/s)",
        "16 MB numpy round trip through the socket",
        "MB/s",
        "higher",
    ),
)


if __name__ == "__main__":
    main()

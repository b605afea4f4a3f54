"""Load: many client processes creating, calling and deleting actors over few slots.

16 client processes share 8 CPU slots for 2 minutes; each loops: create an actor (waiting for
a slot, or getting ResourceError when none frees in time -- expected under this contention),
call it a few hundred times, delete it. Afterwards every slot must be vacant again, and the
master, worker and actor processes and their file descriptors must be what they were before:
no leaked slot, process or descriptor. Prints the counts side by side.

    python benchmarks/load.py [--clients 16] [--slots 8] [--seconds 120]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cluster_util import BenchCluster

CLIENT = """
import json, sys, time
import parl
parl.connect(sys.argv[1], log_to_driver=False)

@parl.remote_class
class Worker:
    def add(self, a, b):
        return a + b

deadline = time.monotonic() + float(sys.argv[2])
created = calls = waits = 0
errors = []
while time.monotonic() < deadline:
    try:
        w = Worker()
    except parl.ResourceError:
        waits += 1
        continue
    created += 1
    try:
        for i in range(300):
            assert w.add(i, 1) == i + 1
            calls += 1
    except Exception as exc:
        errors.append(repr(exc))
    del w
print(json.dumps({"created": created, "calls": calls, "resource_waits": waits, "errors": errors}))
"""


def snapshot(cluster: BenchCluster) -> dict:
    from parl_remote.cli import _request
    from parl_remote.wire.protocol import messages as m

    status = _request(
        cluster.address,
        lambda rid: m.StatusRequest(rid),
        token=cluster.env["PARL_CLUSTER_TOKEN"].encode(),
    ).status
    return {
        "slots_used": status["totals"]["cpu_used"],
        "actors": status["totals"]["actors"],
        "processes": len(cluster.processes()),
        **{f"fds_{k}": v for k, v in cluster.fds().items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=120)
    args = parser.parse_args()
    cluster = BenchCluster(args.slots, PARL_RESOURCE_WAIT_S="2")
    try:
        time.sleep(1)
        before = snapshot(cluster)
        started = time.monotonic()
        clients = [
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(CLIENT), cluster.address, str(args.seconds)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=cluster.env,
            )
            for _ in range(args.clients)
        ]
        results = []
        for proc in clients:
            out, err = proc.communicate(timeout=args.seconds + 120)
            if proc.returncode != 0:
                results.append(
                    {"created": 0, "calls": 0, "resource_waits": 0, "errors": [err[-500:]]}
                )
            else:
                results.append(json.loads(out.strip().splitlines()[-1]))
        elapsed = time.monotonic() - started
        deadline = time.monotonic() + 30
        after = snapshot(cluster)
        while (
            after["slots_used"] or after["processes"] != before["processes"]
        ) and time.monotonic() < deadline:
            time.sleep(0.5)
            after = snapshot(cluster)
        time.sleep(2)  # let the last warm processes settle before counting descriptors
        after = snapshot(cluster)
    finally:
        cluster.stop()

    created = sum(r["created"] for r in results)
    calls = sum(r["calls"] for r in results)
    errors = [e for r in results for e in r["errors"]]
    print(f"\nload: {args.clients} clients over {args.slots} slots for {elapsed:.0f} s")
    print(
        f"  actors created {created}, calls {calls} ({calls / elapsed:.0f}/s), "
        f"resource waits {sum(r['resource_waits'] for r in results)}, errors {len(errors)}"
    )
    print(f"  {'':12s} {'before':>8s} {'after':>8s}")
    for key in before:
        flag = "   <-- more than before" if after[key] > before[key] else ""
        print(f"  {key:12s} {before[key]:8d} {after[key]:8d}{flag}")
    for error in errors[:5]:
        print("  error:", error)
    leaked = {k: after[k] - before[k] for k in before if after[k] > before[k]}
    print(
        "  leaks: none"
        if not leaked and not errors
        else f"  LEAKS/ERRORS: {leaked} {len(errors)} errors"
    )


if __name__ == "__main__":
    main()

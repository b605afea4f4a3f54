"""W1-W5 on PARL 2.x (Baidu's), for the table in ../README.md.

Run in a virtual environment where `parl` is PARL 2.x, against a cluster it started on a
loopback port (../README.md has the whole recipe, with how to stop it by PID):

    /tmp/parl2-venv/bin/python benchmarks/compare/parl2_bench.py --address localhost:8037
    /tmp/parl2-venv/bin/python benchmarks/compare/parl2_bench.py --w4 --settle 8   # W4 alone

`--w4` times only W4's classes of user modules (numpy, torch; see `_workloads.user_classes`),
with the blocking proxies, which free their actor on `del`: a `wait=False` proxy holds its actor
until `destroy()` (see `parl2_run.py`, which runs this for `remote_bench.py --w4 --parl2`).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workloads import report, run_all, run_user_creation

import parl


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default="localhost:8037")
    parser.add_argument("--w4", action="store_true", help="only W4 of the user-module classes")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds between those actors")
    parser.add_argument("--n", type=int, default=10, help="how many after the first")
    args = parser.parse_args()
    parl.connect(args.address)
    adapter = {
        "make": lambda cls: parl.remote_class(wait=False)(cls),
        "call": lambda actor, name, *a: getattr(actor, name)(*a),
        "get": lambda future: future.get(),
        "release": lambda actor: actor.destroy(),  # `del` alone never frees it
    }
    blocking = {
        "make": parl.remote_class,
        "call": lambda actor, name, *a: getattr(actor, name)(*a),
        "get": lambda value: value,
    }
    results = {} if args.w4 else run_all(**adapter, n_lat=2000, n_calls=10000)
    results.update(run_user_creation(**blocking, n=args.n, settle=args.settle))
    report(f"PARL {parl.__version__}", results)


if __name__ == "__main__":
    main()

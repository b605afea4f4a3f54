"""W1-W5 on PARL 2.x (Baidu's), for the table in ../README.md.

Run in a virtual environment where `parl` is PARL 2.x, against a cluster it started:

    python -m venv /tmp/parl2-venv && /tmp/parl2-venv/bin/pip install "parl==2.2.1" numpy
    /tmp/parl2-venv/bin/xparl start --port 8037 --cpu_num 6
    /tmp/parl2-venv/bin/python benchmarks/compare/parl2_bench.py --address localhost:8037
    /tmp/parl2-venv/bin/xparl stop
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _workloads import report, run_all

import parl


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", default="localhost:8037")
    args = parser.parse_args()
    parl.connect(args.address)
    results = run_all(
        make=lambda cls: parl.remote_class(wait=False)(cls),
        call=lambda actor, name, *a: getattr(actor, name)(*a),
        get=lambda future: future.get(),
        n_lat=2000,
        n_calls=10000,
    )
    report(f"PARL {parl.__version__}", results)


if __name__ == "__main__":
    main()

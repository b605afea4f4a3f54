"""W1-W5 on Ray, for the table in ../README.md. Run in a virtual environment with Ray installed.

python -m venv /tmp/ray-venv && /tmp/ray-venv/bin/pip install "ray==2.60.*" numpy
/tmp/ray-venv/bin/python benchmarks/compare/ray_bench.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ray
from _workloads import report, run_all


def main() -> None:
    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False)
    try:
        results = run_all(
            make=lambda cls: ray.remote(cls).remote,
            call=lambda actor, name, *args: getattr(actor, name).remote(*args),
            get=ray.get,
            release=ray.kill,
        )
    finally:
        ray.shutdown()
    report(f"Ray {ray.__version__}", results)


if __name__ == "__main__":
    main()

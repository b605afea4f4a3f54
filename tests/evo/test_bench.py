"""The ES benchmark runs end to end (a quick run), so that it cannot rot unnoticed."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_es_bench_quick_run():
    script = os.path.join(REPO_ROOT, "benchmarks", "es_bench.py")
    result = subprocess.run(
        [sys.executable, script, "--quick"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "table slice (view)" in out and "RandomState(seed).randn" in out
    assert "parl.evo CMAES: median" in out and "2/2 runs reached the target" in out
    assert "2 actors vs 1:" in out and "(target >= 1.7x on 2 cores)" in out
    assert "played the same episodes and ended at the same weights: True" in out

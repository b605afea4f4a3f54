"""The examples without their optional packages: fail before training, or run with a warning."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO_ROOT

QUICKSTART = os.path.join(REPO_ROOT, "examples", "quickstart", "train.py")


def _quickstart_without(modules: list[str], tmp_path, *flags: str) -> subprocess.CompletedProcess:
    """Run the quickstart in a fresh interpreter where importing `modules` fails as if absent."""
    code = (
        "import runpy, sys\n"
        f"for name in {modules!r}:\n"
        "    sys.modules[name] = None\n"
        f"sys.argv = [{QUICKSTART!r}, *{list(flags)!r}]\n"
        f"runpy.run_path({QUICKSTART!r}, run_name='__main__')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )


def test_quickstart_without_matplotlib_fails_before_training(tmp_path):
    result = _quickstart_without(["matplotlib"], tmp_path, "--logdir", str(tmp_path / "out"))
    assert result.returncode != 0
    assert "pip install matplotlib" in result.stderr
    assert "evaluation mean return" not in result.stderr + result.stdout  # no training ran
    assert not (tmp_path / "out" / "agent.ckpt").exists()


def test_quickstart_without_tqdm_runs_with_one_warning(tmp_path):
    flags = ["--train-episodes", "2", "--eval-every", "2", "--eval-episodes", "1"]
    result = _quickstart_without(["tqdm"], tmp_path, *flags, "--logdir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert output.count("the progress bar is off") == 1
    assert "pip install tqdm" in output
    assert (tmp_path / "out" / "agent.ckpt").exists()

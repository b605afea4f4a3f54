"""examples/quickstart/train.py runs end to end, and (slow) learns CartPole-v1."""

from __future__ import annotations

import glob
import os

import pytest

from tests.e2e.example_runner import run_example


def _run(tmp_path, *flags: str, timeout: float) -> dict:
    return run_example("quickstart", tmp_path, *flags, timeout=timeout)


def test_quickstart_writes_its_outputs(tmp_path):
    logdir = tmp_path / "out"
    result = _run(
        tmp_path,
        "--train-episodes",
        "6",
        "--eval-every",
        "3",
        "--eval-episodes",
        "1",
        "--logdir",
        str(logdir),
        timeout=120,
    )
    assert result["episodes"] == 6 and result["env_steps"] > 0
    assert os.path.getsize(logdir / "agent.ckpt") > 0
    with open(logdir / "learning_curve.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert glob.glob(str(logdir / "events.out.tfevents.*"))
    assert "evaluation mean return" in (logdir / "log.log").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_quickstart_learns_cartpole(tmp_path, seed):
    # Measured over seeds 1-5: the greedy policy first averages >= 475 at episode 125-275.
    result = _run(
        tmp_path,
        "--seed",
        str(seed),
        "--train-episodes",
        "600",
        "--target-return",
        "475",
        "--logdir",
        str(tmp_path / "out"),
        timeout=600,
    )
    assert result["reached_target_at_episode"] is not None, result
    assert result["best_eval_return"] >= 475

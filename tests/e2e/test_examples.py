"""The algorithm examples run end to end, and (slow) learn their tasks inside the step caps."""

from __future__ import annotations

import glob
import os

import pytest

from tests.e2e.example_runner import run_example

# Short runs: a few hundred updates, one evaluation.
SHORT = {
    "dqn": [
        "--total-steps",
        "1500",
        "--learning-starts",
        "500",
        "--train-freq",
        "64",
        "--gradient-steps",
        "16",
        "--hidden-size",
        "64",
    ],
    "a2c": ["--total-steps", "2000", "--num-envs", "4"],
    "ppo": ["--total-steps", "1024", "--update-epochs", "2"],
    "ddpg": ["--total-steps", "700", "--learning-starts", "400", "--hidden-size", "64"],
    "td3": ["--total-steps", "700", "--learning-starts", "400", "--hidden-size", "64"],
    "sac": ["--total-steps", "700", "--learning-starts", "400", "--hidden-size", "64"],
}


@pytest.mark.parametrize("name", list(SHORT))
def test_example_writes_its_outputs(name, tmp_path):
    logdir = tmp_path / "out"
    flags = [*SHORT[name], "--eval-every", "500", "--eval-episodes", "1", "--logdir", str(logdir)]
    result = run_example(name, tmp_path, *flags, timeout=240)
    assert result["env_steps"] >= 700 and result["episodes"] > 0
    assert result["best_eval_return"] is not None
    assert os.path.getsize(logdir / "agent.ckpt") > 0
    with open(logdir / "learning_curve.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert glob.glob(str(logdir / "events.out.tfevents.*"))
    log = (logdir / "log.log").read_text()
    assert "evaluation mean return" in log and "done:" in log


def test_dqn_example_with_prioritized_replay_and_dueling(tmp_path):
    result = run_example(
        "dqn",
        tmp_path,
        *SHORT["dqn"],
        "--prioritized",
        "--dueling",
        "--no-double",
        "--logdir",
        str(tmp_path / "out"),
        timeout=240,
    )
    assert result["env_steps"] == 1500


def test_dqn_atari_example_runs_a_few_hundred_steps(tmp_path):
    logdir = tmp_path / "out"
    flags = ["--total-steps", "700", "--learning-starts", "500", "--buffer-size", "1000"]
    result = run_example(
        "dqn_atari", tmp_path, *flags, "--eval-every", "0", "--logdir", str(logdir), timeout=240
    )
    assert result["env_steps"] == 700 and result["episodes"] >= 1
    assert os.path.getsize(logdir / "agent.ckpt") > 0


# The learning thresholds of the issue: mean return of the last 10 training episodes, and for
# DQN a greedy evaluation's (5 episodes every 5k env steps). DQN's training mean reached 475
# within 100k on seeds 1-3 (52-78k) on one kind of CPU and on none of them on a second, whose
# float kernels make the runs part ways (the means peaked at 440, 219 and 438; seed 1's fell
# from 440 to 22 within 1k steps). The greedy policy reached 500 on seed 1 at 40k there.
EVAL_TARGET = ("--target-on", "eval", "--eval-every", "5000", "--eval-episodes", "5")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "cap", "target", "flags"),
    [
        ("dqn", 100_000, 475.0, EVAL_TARGET),
        ("ppo", 100_000, 475.0, ("--eval-every", "0")),
        ("sac", 20_000, -200.0, ("--eval-every", "0")),
    ],
)
def test_example_reaches_its_threshold_inside_the_cap(name, cap, target, flags, tmp_path):
    result = run_example(
        name,
        tmp_path,
        "--total-steps",
        str(cap),
        "--target-return",
        str(target),
        "--stop-at-target",
        *flags,
        "--logdir",
        str(tmp_path / "out"),
        timeout=280,
    )
    assert result["reached_at"] is not None and result["reached_at"] <= cap, result
    if "eval" in flags:
        assert result["best_eval_return"] >= target
    else:
        assert result["final_mean_return"] >= target

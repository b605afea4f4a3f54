"""The examples on remote workers run on a local cluster, and (slow) learn CartPole-v1.

`examples/a2c_parallel` (synchronous A2C on `ParallelSampler`: every round waits for all
workers) and `examples/impala` (asynchronous, on `AsyncSampler`: the learner takes
trajectories as they come) each start a local cluster of 2 CPU slots in a fresh interpreter,
as a user's run would.
"""

from __future__ import annotations

import glob
import json
import math
import os

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import REPO_ROOT, run_python
from tests.e2e.example_runner import run_example

SHORT = ["--eval-episodes", "1", "--target-return", "none"]


def _check_outputs(logdir, result: dict, total_steps: int) -> None:
    assert result["env_steps"] >= total_steps and result["episodes"] > 0, result
    assert result["best_eval_return"] is not None and result["final_mean_return"] > 0
    assert os.path.getsize(logdir / "agent.ckpt") > 0
    with open(logdir / "learning_curve.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    log = (logdir / "log.log").read_text()
    assert "2 actors ready" in log and "evaluation mean return" in log and "done:" in log
    assert glob.glob(str(logdir / "events.out.tfevents.*"))
    events = EventAccumulator(os.fspath(logdir), size_guidance={"scalars": 0})
    events.Reload()
    train = [tag for tag in events.Tags()["scalars"] if tag.startswith("train/")]
    assert "train/policy_loss" in train and "rollout/episode_return" in events.Tags()["scalars"]
    for tag in train:
        for event in events.Scalars(tag):
            assert math.isfinite(event.value), (tag, event)


def test_a2c_parallel_runs_rounds_on_two_actors_and_repeats_itself(tmp_path):
    # Synchronous rounds: the same seed gives the same run, to the bit, on a fresh cluster.
    script = os.path.join(REPO_ROOT, "examples", "a2c_parallel", "train.py")
    flags = ["--total-steps", "800", "--eval-every", "400", *SHORT]  # 10 rounds of 2 x 8 x 5
    code = (
        "import json, runpy\n"
        f"mod = runpy.run_path({script!r}, run_name='a2c_parallel')\n"
        "agents = []\n"
        "for run in ('one', 'two'):\n"
        f"    args = mod['parse_args'](mod['Args'], [*{flags!r}, '--logdir', run])\n"
        "    result = mod['main'](args)\n"
        "    print('RESULT', json.dumps(result), flush=True)\n"
        "    env = mod['gym'].make(args.env_id)\n"
        "    agent = mod['make_agent'](args, env.observation_space, env.action_space)\n"
        "    agent.restore(run + '/agent.ckpt')\n"
        "    agents.append(agent.get_weights())\n"
        "same = all((agents[0][k] == agents[1][k]).all() for k in agents[0])\n"
        "print('SAME', json.dumps(bool(same)))\n"
    )
    out = run_python(code, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    results = [
        json.loads(line.removeprefix("RESULT "))
        for line in out.stdout.splitlines()
        if line.startswith("RESULT ")
    ]
    assert len(results) == 2
    _check_outputs(tmp_path / "one", results[0], 800)
    assert results[0]["env_steps"] == 800  # whole rounds: 2 actors x 8 envs x 5 steps
    for key in ("env_steps", "episodes", "final_mean_return", "best_eval_return"):
        assert results[0][key] == results[1][key], key
    assert "SAME true" in out.stdout  # the learner's weights after the two runs


def test_impala_learns_from_trajectories_of_two_actors(tmp_path):
    logdir = tmp_path / "out"
    flags = ["--total-steps", "1600", "--num-envs", "4", "--n-steps", "10", "--eval-every", "800"]
    result = run_example("impala", tmp_path, *flags, *SHORT, "--logdir", str(logdir), timeout=240)
    _check_outputs(logdir, result, 1600)
    events = EventAccumulator(os.fspath(logdir), size_guidance={"scalars": 0})
    events.Reload()
    assert events.Scalars("train/mean_rho")  # V-trace's importance weights were logged


def test_ppo_atari_acts_centrally_for_workers_stepping_pong(tmp_path):
    # Alternating central inference, 2 workers x 2 Pong games, 4 rollouts of 16 steps.
    logdir = tmp_path / "out"
    flags = ["--total-steps", "256", "--num-envs", "2", "--n-steps", "16", "--alternating"]
    flags += ["--minibatch-size", "32", "--update-epochs", "1", "--eval-every", "256"]
    result = run_example(
        "ppo_atari", tmp_path, *flags, *SHORT, "--logdir", str(logdir), timeout=240
    )
    assert result["env_steps"] == 256, result
    assert os.path.getsize(logdir / "agent.ckpt") > 0
    log = (logdir / "log.log").read_text()
    assert "2 workers ready" in log and "evaluation mean return" in log
    events = EventAccumulator(os.fspath(logdir), size_guidance={"scalars": 0})
    events.Reload()
    assert all(math.isfinite(e.value) for e in events.Scalars("train/policy_loss"))


# The threshold: mean return of the last 10 training episodes >= 475, inside 300k steps
# (measured over seeds 1-10: A2C parallel 37k-89k steps, IMPALA 40k-170k). The defaults are
# 2 actors, the 300k cap and stopping at 475: seed 1 is the README's main command.
@pytest.mark.slow
@pytest.mark.parametrize("name", ["a2c_parallel", "impala"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_parallel_example_reaches_475_on_two_actors(name, seed, tmp_path):
    flags = ["--seed", str(seed), "--logdir", str(tmp_path / "out")]
    result = run_example(name, tmp_path, *flags, timeout=280)
    assert result["reached_at"] is not None and result["reached_at"] <= 300_000, result
    # It stopped there: at the end of the batch in which the episode that reached it ended
    # (episodes are dated by the step they ended at; a batch is 2 x 8 x 5 or 8 x 20 steps).
    batch = 80 if name == "a2c_parallel" else 160
    assert result["reached_at"] <= result["env_steps"] < result["reached_at"] + batch
    # The last 10 episodes at the stop include those that ended after the one that reached 475
    # in the same batch, so their mean can sit a little below it; a policy that collapsed would not.
    assert result["final_mean_return"] >= 400, result

"""(slow) The DQN family's shipped configs through `parl-train` to a threshold, and Ape-X.

QR-DQN's and Rainbow's CartPole configs as they are (single process), and Ape-X: DQN in `async`
mode with 2 actors of their own epsilons streaming n-step transitions with initial priorities
into a prioritized replay memory, on the light schedule of those configs. Each run stops at
its target; the thresholds are low enough to keep each run within a minute or two on 2 quiet
cores (the timeouts allow for a machine loaded many times over).
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import numpy as np
import pytest

from parl.utils import PrioritizedReplayMemory
from parl_algos.train import latest_checkpoint, load_config
from tests.algos.test_train_runs import parl_train

pytestmark = pytest.mark.slow

TO_TARGET = ["--train.stop_at_target", "true", "--train.eval_every", "0", "--no-progress"]


def reached_at(logdir: Path) -> int | None:
    found = re.search(r"reached [-\d.]+ at env step (\d+)", (logdir / "log.log").read_text())
    return None if found is None else int(found.group(1))


@pytest.mark.timeout(700)
@pytest.mark.parametrize("name", ["qrdqn/cartpole", "rainbow/cartpole"])
def test_the_qrdqn_and_rainbow_configs_reach_195_on_cartpole(name, tmp_path):
    """Seed 1 (the configs' own): QR-DQN reached 195 at 14.1k env steps, Rainbow at 5.4k.

    About a minute each on 2 quiet cores; 6 minutes each under a load average of 22.
    """
    config = load_config(name)
    assert config.train.target_return == 195.0 and config.train.total_steps == 30_000
    logdir = tmp_path / "run"
    proc = parl_train(name, *TO_TARGET, "--logdir", str(logdir), timeout=660)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reached = reached_at(logdir)
    assert reached is not None and reached <= 30_000


# Ape-X's learner: Dueling DQN's config (double Q, a dueling network) with 3-step returns and
# prioritized replay, on the light schedule of the QR-DQN and Rainbow configs (64-unit layers,
# 16 updates every 64 env steps).
APEX = ["--agent.n_step", "3", "--agent.prioritized", "true"]
APEX += ["--agent.hidden_size", "64", "--agent.learning_starts", "500"]
APEX += ["--agent.train_freq", "64", "--agent.gradient_steps", "16"]


@pytest.mark.timeout(900)
def test_apex_with_2_actors_reaches_150_on_cartpole(tmp_path):
    """Ape-X in `async` mode: the actors' epsilons are 0.4 and 0.4 ** 8. Seed 1 reached 150 at
    4.7k env steps in benchmarks/dqn_peers.py; the test passed in 3.1 minutes under a load
    average of 15 on 2 cores. Async runs are not repeatable (how many
    updates the learner makes per env step depends on when the batches arrive), so a miss
    gets one more try on seed 2.
    """
    for seed in ("1", "2"):
        logdir = tmp_path / f"run-{seed}"
        proc = parl_train(
            "duelingdqn/cartpole",
            "--mode",
            "async",
            "--actors",
            "2",
            *APEX,
            "--train.seed",
            seed,
            "--train.total_steps",
            "30000",
            "--train.target_return",
            "150",
            "--train.checkpoint_every",
            "5000",
            *TO_TARGET,
            "--logdir",
            str(logdir),
            timeout=420,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        reached = reached_at(logdir)
        if reached is not None:
            break
    assert reached is not None and reached <= 30_000, "seeds 1 and 2 missed 150 within 30k"
    # The replay memory of the last checkpoint is prioritized, with the actors' initial
    # priorities and the learner's updates: they differ from one transition to the next.
    with open(Path(latest_checkpoint(str(logdir))) / "state.pkl", "rb") as f:
        memory = pickle.load(f)["trainer"]["memory"]
    assert isinstance(memory, PrioritizedReplayMemory)
    priorities = memory.priorities()
    assert len(np.unique(priorities)) > len(memory) // 2

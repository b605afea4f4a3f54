"""`AsyncSampler`'s slots and its workers' priority, on a real local cluster.

The slots bound how many batches made with older weights can still come after
`sync_weights()`; `worker_nice` lowers the workers' processes, never the caller's.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import parl
from parl.samplers import AsyncSampler
from parl_algos.train import SPECS, apply_override, load_config
from parl_algos.train._envs import ASYNC_WORKER_NICE, async_options
from tests.algos.test_samplers import ENV_FN, LinearAgent

SIZES = {"num_workers": 2, "envs_per_worker": 2, "horizon": 6, "seed": 3}


class NiceAgent(LinearAgent):
    """`LinearAgent` that reports the niceness of the process it acts in, with each action."""

    def sample(self, obs: np.ndarray):
        actions, extras = super().sample(obs)
        return actions, {**extras, "nice": np.full(len(obs), os.getpriority(os.PRIO_PROCESS, 0))}


@pytest.fixture(scope="module")
def cluster():
    client = parl.connect(cpu_num=3, log_to_driver=False)
    try:
        yield client
    finally:
        parl.disconnect()


@pytest.mark.parametrize("slots", [1, 2])
def test_old_weights_come_in_at_most_workers_times_slots_batches_after_a_sync(cluster, slots):
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    learner = NiceAgent()
    with AsyncSampler(ENV_FN, learner, **SIZES, slots=slots, worker_nice=nice + 2) as sampler:
        for _ in range(4):
            batch = sampler.collect()
            assert batch.weights_version == 0
            assert np.all(batch.extras["nice"] >= nice + 2)  # the workers, lowered
        learner.set_weights({"w": -learner.w})
        sampler.sync_weights()
        batches = [sampler.collect() for _ in range(2 * slots + 2)]
    versions = [b.weights_version for b in batches]
    # Only each worker's queued or finished rollouts were begun before the new weights came;
    # batches of the workers interleave, but each worker's versions only go up.
    assert versions.count(0) <= SIZES["num_workers"] * slots, versions
    for w in range(SIZES["num_workers"]):
        mine = [b.weights_version for b in batches if b.worker == w]
        assert mine == sorted(mine), versions
    assert os.getpriority(os.PRIO_PROCESS, 0) == nice  # the caller is left as it was


def test_slots_must_be_at_least_one():
    with pytest.raises(ValueError, match="slots=0 must be at least 1"):
        AsyncSampler(ENV_FN, LinearAgent(), slots=0)


def test_lower_priority_lowers_the_process_and_the_autogroup_of_its_own_session():
    code = (
        "import os\n"
        "from parl_algos.samplers._async import lower_priority\n"
        "lower_priority(os.getpriority(os.PRIO_PROCESS, 0) + 3)\n"
        "lower_priority(1)\n"  # never raises a priority back
        "print(os.getpriority(os.PRIO_PROCESS, 0))\n"
        "try:\n"
        "    print(open('/proc/self/autogroup').read().split()[-1])\n"
        "except OSError:\n"
        "    print('none')\n"
    )
    before = os.getpriority(os.PRIO_PROCESS, 0)
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        start_new_session=True,  # an autogroup of its own, as an actor's process has
    ).stdout.split()
    assert int(out[0]) == before + 3
    if out[1] != "none":  # autogroups: the session's is lowered as far
        assert int(out[1]) >= 3


def test_parl_train_async_on_policy_uses_one_slot_a_worker_and_lowered_workers():
    config = load_config("ppo/cartpole")
    apply_override(config, "train.mode", "async")
    assert async_options(config, SPECS["PPO"]) == {"slots": 1, "worker_nice": ASYNC_WORKER_NICE}
    apply_override(config, "train.actors", "1")  # one worker: two slots keep the learner fed
    assert async_options(config, SPECS["PPO"])["slots"] == 2
    dqn = load_config("dqn/cartpole")
    apply_override(dqn, "train.mode", "async")
    assert async_options(dqn, SPECS["DQN"]) == {}  # Ape-X's small batches keep their two slots

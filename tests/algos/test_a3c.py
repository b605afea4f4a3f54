"""A3C: gradients computed on actors' copies, applied by the learner as they arrive.

The split loss makes the very update `A2C.learn` makes; `A3CLearner` applies gradients from
actors in threads of this process and from actors on a real local cluster, pulls weights
into them, and hands an actor's failure to the caller; (slow) A3C learns CartPole-v1.
"""

from __future__ import annotations

import copy
import functools
import math
import os

import gymnasium as gym
import numpy as np
import pytest
import torch

import parl
from parl.algorithms import A2C, A3C
from parl_algos.a3c import A3CActor, A3CLearner, RemoteA3CActor
from parl_algos.agents import ActorCriticAgent
from parl_algos.nets import ActorCriticMLP

ENV_FN = functools.partial(gym.make, "CartPole-v1")


def _agent(cls=A3C, seed: int = 0) -> ActorCriticAgent:
    torch.manual_seed(seed)
    return ActorCriticAgent(cls(ActorCriticMLP(4, 2), lr=1e-2), gamma=0.99, gae_lambda=1.0)


def _batch():
    g = torch.Generator().manual_seed(1)
    obs = torch.randn(16, 4, generator=g)
    return obs, torch.randint(0, 2, (16,), generator=g), torch.randn(16, generator=g), obs[:, 0]


def test_gradients_sent_and_applied_make_a2cs_update():
    a2c, learner, actor = _agent(A2C), _agent(), _agent()
    for _ in range(3):  # the optimizer's state carries over between steps too
        expected = a2c.alg.learn(*_batch())
        grads, stats = actor.alg.compute_gradients(*_batch())
        learner.alg.apply_gradients(grads)
        actor.set_weights(learner.get_weights())
        assert stats == expected
    for name, value in a2c.get_weights().items():
        np.testing.assert_allclose(learner.get_weights()[name], value, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="2 gradients for a model of"):
        learner.alg.apply_gradients(grads[:2])
    with pytest.raises(ValueError, match="a gradient of shape"):
        learner.alg.apply_gradients([g.T for g in grads])
    with pytest.raises(TypeError, match="A3CActor needs an agent of A3C"):
        A3CActor(ENV_FN, _agent(A2C))


def _check_updates(learner: A3CLearner, agent: ActorCriticAgent, n: int, batch: int):
    initial = agent.get_weights()
    updates = [learner.step() for _ in range(n)]
    # Gradients are applied as they arrive: one actor may be quicker to start, so go on (a
    # bounded number of steps) until the other's first gradient arrives too.
    while {u.actor for u in updates} != {0, 1} and len(updates) < 20 * n:
        updates.append(learner.step())
    n = len(updates)
    assert learner.version == n
    assert [u.env_steps for u in updates] == [batch * (k + 1) for k in range(n)]
    assert {u.actor for u in updates} == {0, 1}  # both actors' gradients arrived
    assert all(u.staleness >= 0 for u in updates)
    for u in updates:
        assert math.isfinite(u.stats.policy_loss) and math.isfinite(u.stats.value_loss)
    assert any(not np.array_equal(initial[k], v) for k, v in agent.get_weights().items())
    return updates


def test_learner_applies_gradients_of_actors_in_threads_and_pulls_weights():
    agent = _agent()
    actors = [
        A3CActor(ENV_FN, copy.deepcopy(agent), num_envs=2, n_steps=5, seed=i) for i in range(2)
    ]
    with A3CLearner(agent, actors, pull_every=1, timeout=60) as learner:
        _check_updates(learner, agent, 12, batch=10)
    # Every rollout began with a pull: an actor's last weights are a version past the first.
    for actor in actors:
        assert 0 < actor.weights_version <= learner.version
        actor.close()
    with pytest.raises(RuntimeError, match="closed"):
        learner.step()


class _Failing(A3CActor):
    def gradients(self):
        raise ValueError("the environment broke")


def test_an_actors_failure_reaches_the_learner():
    agent = _agent()
    actors = [_Failing(ENV_FN, copy.deepcopy(agent), num_envs=1, n_steps=2)]
    learner = A3CLearner(agent, actors, timeout=60)
    with pytest.raises(ValueError, match="the environment broke"):
        learner.step()
    learner.close()


@pytest.fixture(scope="module")
def cluster():
    client = parl.connect(cpu_num=2, log_to_driver=False)
    try:
        yield client
    finally:
        parl.disconnect()


def test_remote_actors_send_gradients(cluster):
    agent = _agent()
    actors = [RemoteA3CActor(ENV_FN, agent, num_envs=2, n_steps=5, seed=i) for i in range(2)]
    with A3CLearner(agent, actors, pull_every=2, timeout=60) as learner:
        _check_updates(learner, agent, 8, batch=10)
    del actors


# Learning: `examples/a3c` on 2 remote actors of 8 environments each, seed 1: the mean return
# of the last 10 training episodes reaches 475 on CartPole-v1 within 150k env steps (37k
# measured, 20 s of training with the machine's load average at 28).
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a3c_reaches_475_on_cartpole(tmp_path):
    from tests.e2e.example_runner import run_example

    result = run_example(
        "a3c",
        tmp_path,
        "--seed",
        "1",
        "--total-steps",
        "150000",
        "--eval-every",
        "0",
        "--logdir",
        str(tmp_path / "out"),
        timeout=580,
    )
    assert result["reached_at"] is not None and result["reached_at"] <= 150_000, result


def test_example_runs_with_actors_in_threads_and_writes_its_outputs(tmp_path):
    from tests.e2e.example_runner import run_example

    logdir = tmp_path / "out"
    flags = ["--actors", "0", "--total-steps", "1000", "--eval-every", "500"]
    flags += ["--eval-episodes", "1", "--target-return", "none", "--logdir", str(logdir)]
    result = run_example("a3c", tmp_path, *flags, timeout=240)
    assert result["env_steps"] >= 1000 and result["episodes"] > 0
    assert result["best_eval_return"] is not None
    assert os.path.getsize(logdir / "agent.ckpt") > 0
    assert "done:" in (logdir / "log.log").read_text()

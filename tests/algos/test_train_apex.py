"""The DQN family on actors: who explores how (sync schedule, Ape-X epsilons), replay writes.

The policy copies go through pickle as they do to the samplers' workers; priorities are
checked against values computed by hand.
"""

from __future__ import annotations

import dataclasses
import pickle
import random

import numpy as np
import pytest
import torch

from parl.utils import PrioritizedReplayMemory, ReplayMemory
from parl_algos.agents import DQNAgent
from parl_algos.dqn import DQN
from parl_algos.nets import QNetwork
from parl_algos.r2d2 import apex_epsilons
from parl_algos.rollout import Trajectory
from parl_algos.train._apex import QActing, ReplayWriter


def make_agent(eps_decay_steps: int = 100) -> DQNAgent:
    torch.manual_seed(0)
    return DQNAgent(DQN(QNetwork(4, 2, (8,))), 2, eps_end=0.1, eps_decay_steps=eps_decay_steps)


def copy_on_worker(acting: QActing, seed: int) -> QActing:
    """What a worker holds: a pickled copy, drawing its id from the worker's seeded generator."""
    random.seed(seed)
    return pickle.loads(pickle.dumps(acting))


def test_ape_x_epsilons_follow_the_paper():
    assert list(apex_epsilons(1)) == [0.4]
    eps = list(apex_epsilons(8, 0.4, 7.0))
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4**8)
    assert eps[3] == pytest.approx(0.4 ** (1 + 7.0 * 3 / 7))
    assert eps == sorted(eps, reverse=True)
    with pytest.raises(ValueError, match="n=0"):
        apex_epsilons(0)


def test_sync_copies_all_act_with_the_learners_scheduled_epsilon():
    learner = QActing(make_agent(100), mode="sync", actors=2, learning_starts=50)
    copies = [copy_on_worker(learner, seed) for seed in (1, 2)]
    schedule = [(0, 1.0), (49, 1.0), (50, 1.0), (100, 0.55), (150, 0.1), (999, 0.1)]
    for env_steps, expected in schedule:
        learner.env_steps = env_steps
        weights = learner.get_weights()
        for copy in copies:
            copy.set_weights(weights)
            assert copy.epsilon == pytest.approx(expected)


def test_async_copies_get_ape_x_epsilons_by_the_order_their_rollouts_came():
    learner = QActing(make_agent(), mode="async", actors=3, learning_starts=10)
    copies = [copy_on_worker(learner, seed) for seed in (1, 2, 3)]
    obs = np.zeros((2, 4), dtype=np.float32)
    ids = []
    for copy in (copies[2], copies[0], copies[1]):  # the order their first rollouts arrive
        _, extras = copy.sample(obs)
        ids.append(int(extras["actor"][0]))
        learner.observe(trajectory(extras={"actor": extras["actor"][None]}))
    assert len(set(ids)) == 3
    learner.env_steps = 5  # warm-up: everyone random
    for copy in copies:
        copy.set_weights(learner.get_weights())
        assert copy.epsilon == 1.0
    learner.env_steps = 10
    weights = learner.get_weights()
    for copy in copies:
        copy.set_weights(weights)
    expected = list(apex_epsilons(3))
    assert [copies[2].epsilon, copies[0].epsilon, copies[1].epsilon] == pytest.approx(expected)


def test_a_copy_acts_greedily_at_epsilon_zero_and_reports_its_q_values():
    agent = make_agent()
    learner = QActing(agent, mode="sync", actors=1, learning_starts=0)
    learner.env_steps = 10_000
    copy = copy_on_worker(learner, 7)
    copy.set_weights(learner.get_weights())
    assert copy.epsilon == pytest.approx(0.1)
    copy.epsilon = 0.0
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    actions, extras = copy.sample(obs)
    q = agent.alg.predict(torch.as_tensor(obs)).numpy()
    np.testing.assert_allclose(extras["q"], q, rtol=1e-6)
    np.testing.assert_array_equal(actions, q.argmax(axis=1))


def trajectory(
    *,
    horizon: int = 1,
    width: int = 1,
    reward=None,
    terminated=None,
    truncated=None,
    final_index=(),
    extras=None,
) -> Trajectory:
    shape = (horizon, width)
    obs = np.arange((horizon + 1) * width * 4, dtype=np.float32).reshape(horizon + 1, width, 4)
    return Trajectory(
        obs=obs,
        action=np.zeros(shape, dtype=np.int64),
        reward=np.ones(shape, np.float32) if reward is None else np.asarray(reward, np.float32),
        terminated=np.zeros(shape, bool) if terminated is None else np.asarray(terminated),
        truncated=np.zeros(shape, bool) if truncated is None else np.asarray(truncated),
        final_obs=np.full((len(final_index), 4), -1.0, dtype=np.float32),
        final_index=np.array(final_index, dtype=np.int64).reshape(-1, 2),
        extras=extras or {},
    )


def test_initial_priorities_are_one_step_td_errors_of_the_actors_q_values():
    memory = PrioritizedReplayMemory(100, 4, 0, alpha=1.0, eps=1e-9)
    bootstrapped = []

    def learner_q(obs):
        bootstrapped.append(obs.copy())
        return np.full((len(obs), 2), 10.0)

    writer = ReplayWriter(memory, gamma=0.5, bootstrap_q=learner_q)
    # One column, 4 steps: step 1 terminates, step 2 is truncated (final obs -1), step 3 last.
    q = np.array([[[1.0, 2.0]], [[3.0, 0.0]], [[4.0, 6.0]], [[0.0, 1.0]]], dtype=np.float32)
    t = trajectory(
        horizon=4,
        reward=[[1.0], [2.0], [3.0], [4.0]],
        terminated=[[False], [True], [False], [False]],
        truncated=[[False], [False], [True], [False]],
        final_index=[(2, 0)],
        extras={"q": q, "actor": np.full((4, 1), 5, np.int64)},
    )
    writer.store(t)
    expected = [
        abs(1.0 + 0.5 * 3.0 - 1.0),  # bootstrap: the actor's max Q at step 1
        abs(2.0 - 3.0),  # terminated: no bootstrap
        abs(3.0 + 0.5 * 10.0 - 4.0),  # truncated: the learner's Q of the final observation
        abs(4.0 + 0.5 * 10.0 - 0.0),  # the rollout's last step: the learner's Q of next_obs
    ]
    np.testing.assert_allclose(memory.priorities(), expected, rtol=1e-6)
    (seen,) = bootstrapped
    np.testing.assert_array_equal(seen, [np.full(4, -1.0), t.obs[4, 0]])
    np.testing.assert_array_equal(memory.next_obs[2], np.full(4, -1.0))
    np.testing.assert_array_equal(memory.terminal[:4], [0, 1, 0, 0])
    assert writer.written == 4


def test_priorities_follow_the_memorys_positions_when_it_wraps():
    memory = PrioritizedReplayMemory(3, 4, 0, alpha=1.0, eps=1e-9)
    writer = ReplayWriter(memory, gamma=0.0, bootstrap_q=lambda obs: np.zeros((len(obs), 2)))
    q = np.zeros((5, 1, 2), dtype=np.float32)
    writer.store(trajectory(horizon=5, reward=[[1.0], [2.0], [3.0], [4.0], [5.0]], extras={"q": q}))
    # Positions 0..2 hold steps 3, 4 and 2.
    np.testing.assert_allclose(memory.priorities(), [4.0, 5.0, 3.0], rtol=1e-6)


def test_n_step_transitions_are_folded_column_by_column():
    memory = ReplayMemory(100, 4, 0)
    writer = ReplayWriter(memory, n_step=2, gamma=0.5)
    rewards = [[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]]
    writer.store(trajectory(horizon=3, width=2, reward=rewards))
    assert len(memory) == 4  # two 2-step transitions a column; one step of each still pending
    np.testing.assert_allclose(memory.reward[:4], [2.0, 3.5, 20.0, 35.0])
    writer.store(trajectory(horizon=1, width=2, reward=[[4.0, 40.0]]))
    np.testing.assert_allclose(memory.reward[4:6], [3.0 + 0.5 * 4.0, 30.0 + 0.5 * 40.0])


def test_frames_are_stored_as_uint8_and_rewards_as_the_writer_clips_them():
    frames = np.random.default_rng(0).integers(0, 256, (4, 2, 4, 6, 6), dtype=np.uint8)
    memory = ReplayMemory(100, (4, 6, 6), 0, obs_dtype=np.uint8)
    writer = ReplayWriter(memory, n_step=2, gamma=0.5, reward_fn=np.sign)
    scores = np.array([[100.0, -5.0], [0.0, 7.0], [3.0, 0.0]], np.float32)
    t = trajectory(horizon=3, width=2, reward=scores)
    writer.store(dataclasses.replace(t, obs=frames, final_obs=np.zeros((0, 4, 6, 6), np.uint8)))
    assert memory.obs.dtype == np.uint8 and len(memory) == 4
    np.testing.assert_allclose(memory.reward[:4], [1.0, 0.5, -0.5, 1.0])  # sign, then 2 steps
    np.testing.assert_array_equal(memory.obs[:4], frames[[0, 1, 0, 1], [0, 0, 1, 1]])
    np.testing.assert_array_equal(memory.next_obs[:4], frames[[2, 3, 2, 3], [0, 0, 1, 1]])
    np.testing.assert_array_equal(t.reward, scores)  # what the returns are counted from


def test_n_step_priorities_span_rollouts_with_the_first_steps_q_values():
    memory = PrioritizedReplayMemory(100, 4, 0, alpha=1.0, eps=1e-9)
    writer = ReplayWriter(
        memory, n_step=2, gamma=0.5, bootstrap_q=lambda obs: np.full((len(obs), 2), 10.0)
    )
    q = np.array([[[1.0, 2.0]], [[3.0, 0.0]]], dtype=np.float32)
    writer.store(trajectory(horizon=2, reward=[[1.0], [2.0]], extras={"q": q}))
    # The second rollout's step 1 terminates: both steps of the window are written.
    q = np.array([[[4.0, 6.0]], [[0.0, 1.0]]], dtype=np.float32)
    terminated = [[False], [True]]
    writer.store(
        trajectory(horizon=2, reward=[[3.0], [4.0]], terminated=terminated, extras={"q": q})
    )
    expected = [
        abs(1.0 + 0.5 * 2.0 + 0.25 * 10.0 - 1.0),  # bootstraps from the learner (rollout's end)
        abs(2.0 + 0.5 * 3.0 + 0.25 * 1.0 - 3.0),  # Q(s, a) from the first rollout
        abs(3.0 + 0.5 * 4.0 - 4.0),  # terminated: no bootstrap
        abs(4.0 - 0.0),  # the window's last step, terminated
    ]
    np.testing.assert_allclose(memory.priorities(), expected, rtol=1e-6)


def test_a_truncated_episodes_last_window_bootstraps_from_its_final_observation():
    memory = PrioritizedReplayMemory(100, 4, 0, alpha=1.0, eps=1e-9)
    writer = ReplayWriter(
        memory, n_step=2, gamma=0.5, bootstrap_q=lambda obs: np.full((len(obs), 2), 10.0)
    )
    q = np.array([[[1.0, 2.0]], [[3.0, 0.0]], [[4.0, 6.0]]], dtype=np.float32)
    t = trajectory(
        horizon=3,
        reward=[[1.0], [2.0], [5.0]],
        truncated=[[False], [True], [False]],
        final_index=[(1, 0)],
        extras={"q": q},
    )
    writer.store(t)
    writer.store(trajectory(horizon=1, reward=[[4.0]], extras={"q": q[:1]}))
    expected = [
        abs(1.0 + 0.5 * 2.0 + 0.25 * 10.0 - 1.0),  # bootstraps from the final observation
        abs(2.0 + 0.5 * 10.0 - 3.0),  # the last step alone: from it too, discounted once
        abs(5.0 + 0.5 * 4.0 + 0.25 * 10.0 - 4.0),  # the step after the truncation
    ]
    np.testing.assert_allclose(memory.priorities(), expected, rtol=1e-6)
    np.testing.assert_allclose(memory.discount[:3], [0.25, 0.5, 0.25])
    assert writer.written == 3


def distributional_agent(kind: str, n_atoms: int, **kwargs) -> DQNAgent:
    torch.manual_seed(0)
    model = QNetwork(4, 2, (8,), n_atoms=n_atoms)
    return DQNAgent(DQN(model, distributional=kind, n_atoms=n_atoms, **kwargs), 2)


def test_c51_priorities_are_the_kl_loss_of_the_actors_distributions():
    alg = distributional_agent("c51", 3, gamma=0.5, n_step=2, v_min=0.0, v_max=2.0).alg
    memory = PrioritizedReplayMemory(100, 4, 0, alpha=1.0, eps=1e-9)
    at_zero = np.log([[1.0, 1e-20, 1e-20]] * 2)  # the learner's: every atom's mass on 0

    def priority(*arrays):
        return alg.priority(*(torch.as_tensor(np.asarray(a, np.float32)) for a in arrays)).numpy()

    writer = ReplayWriter(
        memory,
        n_step=2,
        gamma=0.5,
        bootstrap_q=lambda obs: np.stack([at_zero] * len(obs)),
        priority=priority,
    )
    out = np.log(
        [
            [[0.2, 0.3, 0.5], [1.0, 1.0, 1.0]],
            [[1 / 3, 1 / 3, 1 / 3], [1.0, 1.0, 1.0]],
            [[1.0, 1e-20, 1e-20], [1e-20, 1e-20, 1.0]],  # greedy: action 1, all on atom 2
        ]
    )[:, None].astype(np.float32)
    writer.store(trajectory(horizon=3, reward=[[0.5], [1.0], [1.0]], extras={"out": out}))
    # G = 0.5 + 0.5 * 1 = 1 and 1 + 0.5 * 1 = 1.5, bootstraps 0.25 * 2 (the actor's at step 2)
    # and 0.25 * 0 (the learner's): both targets are 1.5, projected to m = (0, 0.5, 0.5).
    expected = [0.5 * np.log(0.5 / 0.3), np.log(1.5)]
    np.testing.assert_allclose(memory.priorities(), expected, rtol=1e-5)


def test_qr_dqn_priority_is_the_quantile_huber_loss():
    alg = distributional_agent("qr", 2, gamma=0.5, n_step=2).alg
    theta = torch.tensor([[0.0, 1.0]])
    next_theta = torch.tensor([[[0.0, 0.0], [2.0, 4.0]]])  # greedy: action 1
    priority = alg.priority(theta, torch.tensor([1.0]), torch.tensor([0.25]), next_theta)
    # Targets 1 + 0.25 * (2, 4) = (1.5, 2); quantile midpoints 0.25, 0.75; kappa 1.
    low = 0.25 * ((1.5 - 0.5) + (2.0 - 0.5)) / 2  # theta 0: both errors above kappa
    high = 0.75 * (0.5 * 0.5**2 + 0.5 * 1.0**2) / 2  # theta 1: both within kappa
    np.testing.assert_allclose(priority.numpy(), [low + high], rtol=1e-6)


def test_a_distributional_copy_reports_its_networks_outputs():
    agent = distributional_agent("c51", 5)
    copy = copy_on_worker(QActing(agent, mode="sync", actors=1, learning_starts=0), 3)
    obs = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    copy.agent.set_weights(agent.get_weights())
    _, extras = copy.sample(obs)
    out = agent.alg.model(torch.as_tensor(obs)).detach().numpy()
    assert extras["out"].shape == (6, 2, 5)
    np.testing.assert_allclose(extras["out"], out, rtol=1e-5)
    np.testing.assert_allclose(extras["q"], agent.alg.q_values(torch.as_tensor(out)), rtol=1e-5)

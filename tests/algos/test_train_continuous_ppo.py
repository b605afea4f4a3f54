"""PPO on Box actions in `parl-train`: a Gaussian policy, its draws clipped by the environment."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from parl_algos.nets import GaussianActorCriticMLP
from parl_algos.rollout import Trajectory
from parl_algos.train import SPECS, apply_override, load_config
from parl_algos.train._envs import make_env
from tests.algos.test_dqn_thresholds import reached_at
from tests.algos.train_cli import parl_train


def build(mode: str = "async"):
    config = load_config("ppo/cartpole")
    apply_override(config, "env.id", "Pendulum-v1")
    apply_override(config, "train.mode", mode)
    apply_override(config, "agent.update_epochs", "2")
    env = make_env(config.env.id)
    torch.manual_seed(0)
    return SPECS["PPO"].build(config, env.observation_space, env.action_space).agent


def test_box_actions_get_a_gaussian_policy_whose_log_probs_sum_the_dimensions():
    agent = build()
    model = agent.alg.model
    assert isinstance(model, GaussianActorCriticMLP)
    obs = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    action, extras = agent.sample(obs)
    assert action.shape == (8, 1) and extras["log_prob"].shape == (8,)
    with torch.no_grad():
        mean = model.actor(torch.as_tensor(obs)).numpy()
    # A standard deviation of exp(0) = 1 at the start: the normal log-density, one dimension.
    expected = -0.5 * (action - mean) ** 2 - 0.5 * math.log(2 * math.pi)
    np.testing.assert_allclose(extras["log_prob"], expected.sum(axis=1), rtol=1e-5)


def test_ppo_learns_from_the_draws_of_a_gaussian_policy():
    agent = build()
    rng = np.random.default_rng(0)
    horizon, width = 16, 4
    obs = rng.normal(size=(horizon + 1, width, 3)).astype(np.float32)
    actions, log_probs = zip(*(agent.sample(o) for o in obs[:-1]), strict=True)
    t = Trajectory(
        obs=obs,
        action=np.stack(actions),
        reward=rng.normal(size=(horizon, width)).astype(np.float32),
        terminated=np.zeros((horizon, width), bool),
        truncated=np.zeros((horizon, width), bool),
        final_obs=np.zeros((0, 3), np.float32),
        final_index=np.zeros((0, 2), np.int64),
        extras={"log_prob": np.stack([e["log_prob"] for e in log_probs])},
    )
    before = agent.alg.model.log_std.detach().clone()
    stats = agent.learn(t)
    assert math.isfinite(stats.policy_loss) and math.isfinite(stats.value_loss)
    assert not torch.equal(agent.alg.model.log_std.detach(), before)


def test_the_environment_clips_the_actions_and_gives_float32_observations():
    env = make_env("Pendulum-v1")
    env.reset(seed=0)
    env.step(np.array([5.0], np.float32))  # clipped to 1, rescaled to Pendulum's 2
    assert env.unwrapped.last_u == pytest.approx(2.0)
    hopper = make_env("Hopper-v5")
    obs, _ = hopper.reset(seed=0)
    assert hopper.observation_space.dtype == np.float32 and obs.dtype == np.float32
    assert isinstance(hopper.action_space, gym.spaces.Box)


def test_the_gaussian_policy_gives_independent_normals_numbers_to_the_bit():
    from parl_algos._distributions import DiagonalNormal

    torch.manual_seed(0)
    loc = torch.randn(32, 3, requires_grad=True)
    log_std = torch.randn(3, requires_grad=True)
    action = torch.randn(32, 3)
    scale = log_std.exp().expand_as(loc)
    normal = torch.distributions.Normal(loc, scale, validate_args=False)
    reference = torch.distributions.Independent(normal, 1, validate_args=False)
    light = DiagonalNormal(loc, scale)
    assert light.batch_shape == reference.batch_shape and light.event_shape == (3,)
    for name in ("log_prob", "entropy"):
        args = (action,) if name == "log_prob" else ()
        a, b = getattr(light, name)(*args), getattr(reference, name)(*args)
        assert torch.equal(a, b)
        grads = [
            torch.autograd.grad(x.sum(), (loc, log_std), retain_graph=True, allow_unused=True)
            for x in (a, b)
        ]
        for g, h in zip(*grads, strict=True):
            assert (g is None and h is None) or torch.equal(g, h)
    for draw in ("sample", "rsample"):
        torch.manual_seed(1)
        a = getattr(light, draw)((2,))
        torch.manual_seed(1)
        assert torch.equal(a, getattr(reference, draw)((2,))) and a.shape == (2, 32, 3)
    assert torch.equal(light.mode, reference.mode)
    with pytest.raises(ValueError, match="one shape"):
        DiagonalNormal(loc, log_std.exp())


HOPPER_SEEDS = ("1", "2", "3")


@pytest.mark.slow
@pytest.mark.timeout(2400)  # three runs of 110-190k steps: 10 minutes under load average 9
def test_ppo_on_hopper_passes_800_within_300k_steps_in_the_median_over_seeds(tmp_path):
    """`ppo/hopper` as shipped (the PPO paper's hyperparameters), seeds 1-3, each stopped where
    the mean of its last 10 training episodes passes 800, or at 300k env steps.

    Measured seed by seed: 800 passed at 125k / 186k / 113k env steps (median 125k); 1000, the
    config's target, at 174k / 261k / not within 300k (seed 3 peaked at 860): too close to the
    budget to hold in the median.
    """
    reached = []
    for seed in HOPPER_SEEDS:
        logdir = tmp_path / f"seed-{seed}"
        proc = parl_train(
            "ppo/hopper",
            *("--train.seed", seed, "--train.total_steps", "300000"),
            *("--train.target_return", "800", "--train.stop_at_target", "true"),
            *("--train.eval_every", "0", "--train.checkpoint_every", "1000000"),
            *("--no-progress", "--logdir", str(logdir)),
            timeout=720,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        step = reached_at(logdir)
        reached.append(math.inf if step is None else step)
    assert np.median(reached) <= 300_000, reached

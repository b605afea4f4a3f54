"""`parl-train` on Atari frames: the DQN family with `env.atari = true` (ale-py's games).

The configs build the Nature CNN under the family's heads, with uint8 frames in the replay
memory, and the samplers' frames (the layout of the workers' shared memory) reach it as uint8;
learning sees rewards clipped to their sign while the returns reported stay the game's scores;
evaluations explore with `agent.eval_epsilon`. Ape-X (`async`, 2 actors) on the frames runs in
the slow suite.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import pickle
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import parl_algos.train._envs as envs
import parl_algos.train._off_policy as off_policy
from parl.utils import PrioritizedReplayMemory, ReplayMemory
from parl_algos.nets import AtariActorCritic, NatureQNetwork
from parl_algos.rollout import FireOnLifeStart, Trajectory, compute_advantages
from parl_algos.train import (
    SPECS,
    ConfigError,
    apply_override,
    latest_checkpoint,
    load_config,
    main,
    run,
)
from parl_algos.train._evaluator import EpsilonGreedy
from tests.algos.train_cli import parl_train

pytest.importorskip("ale_py")

ATARI = ("dqn/roadrunner", "rainbow/roadrunner")
# A few hundred steps on a small memory: rows, a checkpoint and an evaluation.
SMALL = ["--train.log_every", "100", "--train.checkpoint_every", "200"]
SMALL += ["--train.eval_every", "200", "--train.eval_episodes", "1", "--no-progress"]
SMALL += ["--agent.learning_starts", "100", "--agent.train_freq", "50"]
SMALL += ["--agent.gradient_steps", "5", "--agent.buffer_size", "500"]


def build(name: str, *overrides: tuple[str, str]):
    config = load_config(name)
    for key, text in overrides:
        apply_override(config, key, text)
    env = envs.make_env_fn(config)()
    return (
        config,
        env,
        SPECS[config.algorithm].build(config, env.observation_space, env.action_space),
    )


@pytest.mark.parametrize("name", ["ppo/pong", "ppo/breakout", "impala/pong"])
def test_ppo_and_impala_play_frames_with_the_nature_cnn_and_learn_from_clipped_rewards(name):
    """The Nature CNN under both heads, learning from the scores' signs; it runs once where an
    update needs both heads (each minibatch; PPO's values and `pi_old` of the batch), and the
    update is the one that a pass for each head makes."""
    config, env, learner = build(name)
    agent = learner.agent
    assert isinstance(agent.alg.model, AtariActorCritic) and agent.reward_fn is np.sign
    twin = copy.deepcopy(agent)
    twin.alg.model.policy_and_value = None  # the same model, as one without the method
    passes = [0, 0]
    for i, who in enumerate((agent, twin)):

        def count(*_, i=i):
            passes[i] += 1

        who.alg.model.trunk.register_forward_hook(count)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (3, 2, *env.observation_space.shape), dtype=np.uint8)
    action, extras = agent.sample(frames[0]), {}
    if isinstance(action, tuple):  # IMPALA's actors keep the behaviour policy's logits
        action, extras = action[0], {"logits": np.stack([action[1]["logits"]] * 2)}
    scores = np.array([[21.0, -3.0], [0.0, 400.0]], np.float32)  # the games' scores
    no = np.zeros((2, 2), dtype=bool)
    t = Trajectory(
        frames, np.stack([action] * 2), scores, no, no, frames[:0, 0], np.zeros((0, 2)), extras
    )
    if config.algorithm == "PPO":  # the advantages of the signs, not of the scores
        clipped = compute_advantages(
            dataclasses.replace(t, reward=np.sign(scores)),
            agent.alg.value,
            gamma=config.agent.gamma,
            gae_lambda=config.agent.gae_lambda,
        )
        np.testing.assert_allclose(agent.advantages(t).advantage, clipped.advantage)
    passes[0] = 0  # from here: the update's
    assert np.isfinite(agent.learn(t).value_loss)
    np.testing.assert_array_equal(t.reward, scores)  # what the returns are counted from
    twin.learn(t)
    # PPO: the batch's values with pi_old, one a minibatch (1 an epoch here), the final KL's
    epochs = getattr(agent.alg, "update_epochs", 0)
    assert passes[0] == (1 + epochs + 1 if epochs else 1)
    assert passes[1] == (2 + 2 * epochs + 1 if epochs else 2)
    for mine, theirs in zip(agent.alg.model.parameters(), twin.alg.model.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ATARI)
def test_an_atari_config_plays_stacked_uint8_frames_with_the_nature_cnn(name):
    _, env, learner = build(name, ("agent.buffer_size", "100"))
    obs, _ = env.reset(seed=1)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert env.observation_space.shape == (4, 84, 84)
    assert isinstance(learner.agent.alg.model, NatureQNetwork)
    memory = learner.memory
    assert isinstance(memory, PrioritizedReplayMemory) == (name == "rainbow/roadrunner")
    assert memory.obs.shape == (100, 4, 84, 84) and memory.obs.dtype == np.uint8
    assert memory.next_obs.dtype == np.uint8
    assert learner.reward_fn is np.sign
    assert isinstance(learner.eval_agent, EpsilonGreedy) and learner.eval_agent.epsilon == 0.05
    assert 0 <= learner.agent.predict(obs) < env.action_space.n
    alg = learner.agent.alg
    if name == "rainbow/roadrunner":
        assert (alg.distributional, alg.n_step, alg.noisy, alg.dueling) == ("c51", 3, True, True)
        support = alg.support.tolist()
        assert (support[0], support[-1], len(support)) == (-10.0, 10.0, 51)
        assert alg.optimizer.param_groups[0]["eps"] == 1.5e-4
    env.close()


def test_the_workers_frames_reach_the_replay_memory_as_uint8():
    """The samplers' layout (shared memory in sync and async modes) keeps the env's dtype."""
    from parl.samplers import SerialSampler
    from parl_algos.rollout import Trajectory
    from parl_algos.train._apex import ReplayWriter

    config, env, learner = build(
        "rainbow/roadrunner", ("train.mode", "async"), ("agent.buffer_size", "100")
    )
    env.close()
    with SerialSampler(
        envs.make_env_fn(config),
        learner.acting,
        num_workers=1,
        envs_per_worker=2,
        horizon=8,
        seed=1,
    ) as sampler:
        t = Trajectory.from_batch(sampler.collect())
    assert t.obs.dtype == np.uint8 and t.obs.shape == (9, 2, 4, 84, 84)
    assert t.extras["out"].shape == (8, 2, 18, 51)  # C51's logits, for the priorities
    writer = ReplayWriter(learner.memory, n_step=3, gamma=0.99, reward_fn=learner.reward_fn)
    writer.bootstrap_q = lambda obs: off_policy._outputs(learner.agent, obs)
    writer.priority = lambda *arrays: off_policy._priority(learner.agent, *arrays)
    writer.store(t)
    memory = learner.memory
    assert len(memory) == 12 and memory.obs.dtype == np.uint8  # 3-step: 6 a column so far
    np.testing.assert_array_equal(memory.obs[0], t.obs[0, 0])


def test_the_atari_key_needs_an_ale_game(capsys, tmp_path):
    logdir = tmp_path / "r"
    assert main(["dqn/cartpole", "--env.atari", "true", "--logdir", str(logdir)]) == 2
    assert "env.atari = true needs an Atari game of ale-py" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="env.atari = true"):
        build("dqn/roadrunner", ("env.atari", "false"))  # raw 210x160 frames: not a vector
    assert not logdir.exists()
    with pytest.raises(ConfigError, match="unknown key env.atari"):
        apply_override(load_config("sac/pendulum"), "env.atari", "true")


def test_evaluations_act_epsilon_greedily():
    class Greedy:
        weights = None

        def predict(self, obs):
            return 0

        def set_weights(self, weights):
            self.weights = weights

    agent = Greedy()
    policy = EpsilonGreedy(agent, 4, 0.25, seed=1)
    actions = np.array([policy.predict(None) for _ in range(4000)])
    assert np.mean(actions != 0) == pytest.approx(0.25 * 3 / 4, abs=0.03)
    policy.set_weights("w")
    assert agent.weights == "w"
    assert all(EpsilonGreedy(agent, 4, 0.0, seed=1).predict(None) == 0 for _ in range(100))


class Scored(gym.RewardWrapper):
    """A game that scores 100 points a step beyond its own: learning must see 1s."""

    def reward(self, reward):
        return reward + 100.0


def test_learning_rewards_are_clipped_while_reported_returns_are_the_scores(tmp_path, monkeypatch):
    make_atari_env = envs.make_atari_env
    monkeypatch.setattr(envs, "make_atari_env", lambda *a, **k: Scored(make_atari_env(*a, **k)))
    config = load_config("dqn/roadrunner")
    for key, text in [
        ("train.total_steps", "600"),
        ("train.eval_every", "0"),
        ("train.log_every", "100"),
        ("train.progress", "false"),
        ("agent.learning_starts", "100"),
        ("agent.train_freq", "100"),
        ("agent.buffer_size", "500"),
    ]:
        apply_override(config, key, text)
    result = run(config, SPECS[config.algorithm], str(tmp_path / "run"))
    assert result.env_steps == 600
    with open(tmp_path / "run" / "progress.csv", newline="") as f:
        returns = [float(r["mean_return"]) for r in csv.DictReader(f) if r["mean_return"]]
    assert returns and min(returns) >= 100.0 * 50  # the scores of episodes of 50 steps or more
    with open(Path(latest_checkpoint(str(tmp_path / "run"))) / "state.pkl", "rb") as f:
        memory = pickle.load(f)["trainer"]["memory"]
    assert isinstance(memory, ReplayMemory) and memory.obs.dtype == np.uint8
    assert memory.obs.shape == (500, 4, 84, 84) and memory.size() == 500
    assert set(np.unique(memory.reward).tolist()) == {1.0}


@pytest.mark.slow
def test_ape_x_learns_from_uint8_frames_with_two_actors(tmp_path):
    logdir = tmp_path / "run"
    proc = parl_train(
        "dqn/roadrunner",
        "--mode",
        "async",
        "--actors",
        "2",
        "--train.total_steps",
        "400",
        "--logdir",
        str(logdir),
        *SMALL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(logdir / "progress.csv", newline="") as f:
        written = list(csv.DictReader(f))
    assert int(written[-1]["env_step"]) >= 400 and any(r["loss"] for r in written)
    assert "evaluation mean return" in (logdir / "log.log").read_text()
    with open(Path(latest_checkpoint(str(logdir))) / "state.pkl", "rb") as f:
        objects = pickle.load(f)["trainer"]
    memory = objects["memory"]
    assert memory.obs.dtype == np.uint8 and memory.obs.shape == (500, 4, 84, 84)
    assert objects["writer"].written >= 400 and memory.size() >= 400
    assert set(np.unique(memory.reward[: memory.size()]).tolist()) <= {-1.0, 0.0, 1.0}


def _noop_until_game_over(env: gym.Env, limit: int) -> tuple[int, int, bool]:
    """NOOP from a reset for at most `limit` steps: (steps taken, lives left, game over)."""
    env.reset(seed=1)
    for step in range(1, limit + 1):
        _, _, terminated, truncated, _ = env.step(0)
        if terminated or truncated:
            return step, env.unwrapped.ale.lives(), True
    return limit, env.unwrapped.ale.lives(), False


def test_fire_reset_launches_the_ball_at_each_life_and_the_episode_is_the_whole_game():
    from parl_algos.rollout import make_atari_env

    idle = make_atari_env("ALE/Breakout-v5")
    steps, lives, over = _noop_until_game_over(idle, 1500)
    assert (lives, over) == (5, False)  # nobody presses FIRE: the ball never comes
    idle.close()
    env = make_atari_env("ALE/Breakout-v5", fire_reset=True)
    steps, lives, over = _noop_until_game_over(env, 1500)
    assert over and lives == 0, (steps, lives)  # each of the 5 balls launched and missed
    env.close()
    with pytest.raises(ValueError, match="fire_reset needs a game with a FIRE action"):
        make_atari_env("ALE/Freeway-v5", fire_reset=True)


def test_the_fire_reset_key_reaches_the_game_and_needs_the_atari_key(capsys, tmp_path):
    config = load_config("ppo/breakout")
    assert config.env.fire_reset and config.env.atari
    env = envs.make_env_fn(config)()
    assert isinstance(env.env, FireOnLifeStart)  # under the frame stack
    env.close()
    logdir = tmp_path / "r"
    assert main(["ppo/cartpole", "--env.fire_reset", "true", "--logdir", str(logdir)]) == 2
    assert "env.fire_reset = true presses FIRE in an Atari game: it needs env.atari = true" in (
        capsys.readouterr().err
    )
    assert not logdir.exists()

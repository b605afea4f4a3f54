"""`parl_algos.training`: when a run counts as having reached its target, evaluation, results."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import pytest

from parl.algorithms import PPO
from parl_algos.agents import ActorCriticAgent
from parl_algos.nets import ActorCriticMLP
from parl_algos.rollout import Episode
from parl_algos.training import RunArgs, TrainingRun, evaluate


@dataclasses.dataclass(frozen=True)
class Stats:
    loss: float
    flag: bool


def _run(tmp_path, **kwargs) -> TrainingRun:
    args = RunArgs(logdir=str(tmp_path / "run"), eval_every=0, **kwargs)
    return TrainingRun("test", args, total_steps=1000, progress=False)


def test_target_needs_a_full_window_whose_mean_reaches_it(tmp_path):
    run = _run(tmp_path, target_return=10.0, stop_at_target=True)
    run.record(50, [Episode(50, 100.0, 50)])  # one great episode is not ten
    assert run.reached_at is None and not run.done
    run.record(400, [Episode(50 + 10 * i, 9.0, 10) for i in range(1, 10)])
    assert run.mean_return() == pytest.approx((100 + 9 * 9) / 10)
    assert run.reached_at == 140 and run.done  # the tenth episode completed the window
    run.record(500, [Episode(500, 0.0, 10)] * 10, Stats(loss=1.5, flag=True))
    assert run.reached_at == 140  # the first time counts


def test_a_target_on_evaluations_counts_them_and_not_the_training_episodes(tmp_path):
    run = _run(tmp_path, target_return=10.0, target_on="eval", stop_at_target=True)
    run.record(100, [Episode(10 * i, 50.0, 10) for i in range(1, 11)])
    assert run.reached_at is None and not run.done  # training episodes do not count
    run.record_evaluation(200, 9.5)
    assert run.reached_at is None
    run.record(300)
    run.record_evaluation(250, 10.0)  # the env step of the evaluated weights
    assert run.reached_at == 250 and run.done
    run.record_evaluation(300, 20.0)
    assert run.reached_at == 250
    with pytest.raises(ValueError, match="target_on='best'"):
        _run(tmp_path, target_on="best")


def test_no_stop_without_stop_at_target_and_results(tmp_path):
    run = _run(tmp_path, target_return=1.0)
    run.record(20, [Episode(2 * i, 1.0, 2) for i in range(1, 11)])
    assert run.reached_at == 20 and not run.done
    agent = ActorCriticAgent(PPO(ActorCriticMLP(4, 2)), gamma=0.99, gae_lambda=0.95)
    result = run.finish(agent)
    assert result.reached_at == 20 and result.episodes == 10
    assert result.final_mean_return == 1.0 and result.best_eval_return is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.episodes = 0  # type: ignore[misc]
    assert dataclasses.asdict(result)["reached_at"] == 20
    assert (tmp_path / "run" / "agent.ckpt").exists()
    assert (tmp_path / "run" / "learning_curve.png").exists()


def test_evaluation_runs_on_schedule(tmp_path):
    args = RunArgs(logdir=str(tmp_path / "run"), eval_every=100, eval_episodes=2)
    run = TrainingRun(
        "test", args, total_steps=1000, eval_env=gym.make("CartPole-v1"), progress=False
    )
    policy = lambda obs: 0  # noqa: E731 - always left: short, non-zero returns
    run.record(50)
    assert run.maybe_evaluate(policy) is None
    run.record(100)
    first = run.maybe_evaluate(policy)
    assert first is not None and first > 0
    run.record(150)
    assert run.maybe_evaluate(policy) is None
    assert run.eval_curve == [(100, first)]


def test_evaluate_returns_the_mean_episode_return():
    env = gym.make("CartPole-v1", max_episode_steps=7)
    # Alternating actions keep the pole up for 7 steps: every episode is truncated at 7.
    state = {"a": 0}

    def alternate(obs):
        state["a"] ^= 1
        return state["a"]

    assert evaluate(env, alternate, episodes=3, seed=0) == 7.0

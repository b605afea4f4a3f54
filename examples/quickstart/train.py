"""Quickstart: teach a policy-gradient agent to balance CartPole-v1.

PARL's classic tutorial in four pieces: a `Model` (the network), an `Algorithm` (how it learns:
here `parl.algorithms.PolicyGradient`, i.e. REINFORCE), an `Agent` (numpy in, actions out) and a
training loop. It trains for at most `--train-episodes` episodes, evaluates the greedy policy
every `--eval-every` episodes, and writes a TensorBoard summary, the trained agent and a
learning-curve PNG into `--logdir`.

    python examples/quickstart/train.py                 # ~1-2 minutes on a laptop core
    python examples/quickstart/train.py --seed 3 --target-return 475
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import parl
from parl.algorithms import PolicyGradient
from parl.utils import logger, parse_args, progress_bar, require, summary

PLOT_INSTALL = "pip install matplotlib"


@dataclass
class Args:
    seed: int = 1
    """Seed of the environment, torch and numpy."""
    train_episodes: int = 1000
    """The most training episodes to run."""
    lr: float = 5e-3
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor of the reward-to-go."""
    hidden_size: int = 64
    """Width of the model's hidden layer."""
    eval_every: int = 25
    """Evaluate the greedy policy every this many training episodes."""
    eval_episodes: int = 5
    """Episodes per evaluation."""
    target_return: float | None = None
    """Stop as soon as an evaluation's mean return reaches this (default: run every episode)."""
    logdir: str = "train_log/quickstart"
    """Where the summary, the checkpoint and the learning curve go."""
    torch_threads: int = 1
    """Torch intra-op threads: one is fastest for a network this small."""


class CartpoleModel(parl.Model):
    """Observation -> action probabilities: one tanh hidden layer and a softmax."""

    def __init__(self, obs_dim: int, act_dim: int, hidden_size: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(obs_dim, hidden_size)
        self.fc2 = nn.Linear(hidden_size, act_dim)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.fc2(torch.tanh(self.fc1(obs))), dim=-1)


class CartpoleAgent(parl.Agent):
    """Turns observations into actions, and episodes into a policy-gradient update."""

    def sample(self, obs: np.ndarray) -> int:
        """An action drawn from the policy (training)."""
        obs_t = torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0)
        return int(self.alg.sample(obs_t)[0])

    def predict(self, obs: np.ndarray) -> int:
        """The most probable action (evaluation)."""
        obs_t = torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0)
        return int(self.alg.predict(obs_t)[0].argmax())

    def learn(self, obs: np.ndarray, action: np.ndarray, returns: np.ndarray):
        return self.alg.learn(
            torch.as_tensor(obs, dtype=torch.float32),
            torch.as_tensor(action, dtype=torch.int64),
            torch.as_tensor(returns, dtype=torch.float32),
        )


def reward_to_go(rewards: list[float], gamma: float) -> np.ndarray:
    """Discounted return from each step to the episode's end, normalised to zero mean, unit std."""
    returns = np.zeros(len(rewards), dtype=np.float32)
    running = 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        returns[t] = running
    return (returns - returns.mean()) / (returns.std() + 1e-8)


def run_train_episode(agent: CartpoleAgent, env: gym.Env, seed: int | None = None):
    obs_list, action_list, reward_list = [], [], []
    obs, _ = env.reset(seed=seed)
    while True:
        action = agent.sample(obs)
        obs_list.append(obs)
        action_list.append(action)
        obs, reward, terminated, truncated, _ = env.step(action)
        reward_list.append(float(reward))
        if terminated or truncated:
            return np.array(obs_list), np.array(action_list), reward_list


def run_evaluate_episodes(agent: CartpoleAgent, env: gym.Env, episodes: int) -> float:
    total = 0.0
    for _ in range(episodes):
        obs, _ = env.reset()
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(agent.predict(obs))
            total += float(reward)
            done = terminated or truncated
    return total / episodes


def save_learning_curve(
    path: str, train: list[tuple[int, float]], evals: list[tuple[int, float]]
) -> None:
    matplotlib = require("matplotlib", PLOT_INSTALL, purpose="the learning curve")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        x, y = zip(*train, strict=True)
        ax.plot(x, y, alpha=0.35, label="training episode return")
    if evals:
        x, y = zip(*evals, strict=True)
        ax.plot(x, y, marker="o", label="evaluation mean return (greedy)")
    ax.set_xlabel("training episode")
    ax.set_ylabel("return")
    ax.set_title("PolicyGradient on CartPole-v1")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args: Args) -> dict:
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    logger.set_dir(args.logdir)
    summary.set_dir(args.logdir)
    require("matplotlib", PLOT_INSTALL, purpose="the learning curve")  # before, not after, training
    logger.info("quickstart: %s", args)

    env = gym.make("CartPole-v1")
    eval_env = gym.make("CartPole-v1")
    eval_env.reset(seed=args.seed + 10_000)
    env.action_space.seed(args.seed)
    obs_dim = env.observation_space.shape[0]
    act_dim = env.action_space.n

    model = CartpoleModel(obs_dim, act_dim, args.hidden_size)
    alg = PolicyGradient(model, lr=args.lr)
    agent = CartpoleAgent(alg)

    train_curve: list[tuple[int, float]] = []
    eval_curve: list[tuple[int, float]] = []
    env_steps = 0
    start = time.perf_counter()
    best = -np.inf
    reached_at = None
    bar = progress_bar(range(1, args.train_episodes + 1), desc="episodes", unit="ep")
    for episode in bar:
        obs, actions, rewards = run_train_episode(
            agent, env, seed=args.seed if episode == 1 else None
        )
        env_steps += len(rewards)
        stats = agent.learn(obs, actions, reward_to_go(rewards, args.gamma))
        train_curve.append((episode, sum(rewards)))
        summary.add_scalar("rollout/episode_return", sum(rewards), env_steps)
        summary.add_scalar("train/loss", stats.loss, env_steps)
        summary.add_scalar("train/entropy", stats.entropy, env_steps)
        if episode % args.eval_every == 0:
            agent.eval()
            mean_return = run_evaluate_episodes(agent, eval_env, args.eval_episodes)
            agent.train()
            eval_curve.append((episode, mean_return))
            summary.add_scalar("eval/mean_return", mean_return, env_steps)
            bar.set_postfix(eval=f"{mean_return:.1f}", steps=env_steps)
            logger.info(
                "episode %d, env steps %d: evaluation mean return %.1f",
                episode,
                env_steps,
                mean_return,
            )
            best = max(best, mean_return)
            if args.target_return is not None and mean_return >= args.target_return:
                reached_at = episode
                break
    bar.close()
    elapsed = time.perf_counter() - start

    agent.save(os.path.join(args.logdir, "agent.ckpt"))
    save_learning_curve(os.path.join(args.logdir, "learning_curve.png"), train_curve, eval_curve)
    summary.flush()
    result = {
        "episodes": train_curve[-1][0],
        "env_steps": env_steps,
        "best_eval_return": float(best),
        "reached_target_at_episode": reached_at,
        "seconds": round(elapsed, 1),
    }
    logger.info("done: %s; outputs in %s", result, args.logdir)
    return result


if __name__ == "__main__":
    main(parse_args(Args))

"""DQN on CartPole-v1: `parl.algorithms.DQN` with the double-DQN target; dueling, prioritized.

A Q-network learns from a replay memory with the double-DQN target; the target network is
refreshed every `--target-update-interval` env steps. `--dueling` switches to a dueling
Q-network (`Q = V + A - mean(A)`, Wang et al. 2016, https://arxiv.org/abs/1511.06581) and
`--prioritized` samples the memory by TD error (`parl.utils.PrioritizedReplayMemory`). The
defaults are the tuned CartPole settings of the RL Baselines3 Zoo; with them the plain network
reached a mean return of 475 in 52-78k steps over seeds 1-3, the dueling one missed it within
100k steps on two seeds of three. Writes a TensorBoard summary, the agent and a learning curve
into `--logdir`.

    python examples/dqn/train.py
    python examples/dqn/train.py --dueling --prioritized
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import gymnasium as gym
import torch
from torch import nn

import parl
from parl.algorithms import DQN
from parl.utils import PrioritizedReplayMemory, ReplayMemory, parse_args
from parl_algos.agents import DQNAgent
from parl_algos.nets import mlp
from parl_algos.training import OffPolicyArgs, TrainingRun, train_off_policy


@dataclass
class Args(OffPolicyArgs):
    lr: float = 2.3e-3
    batch_size: int = 64
    buffer_size: int = 100_000
    learning_starts: int = 1000
    train_freq: int = 256
    gradient_steps: int = 128
    target_update_interval: int = 10
    """Env steps between two copies of the model into the target network."""
    exploration_fraction: float = 0.16
    """Fraction of --total-steps over which epsilon decays (warm-up steps included)."""
    eps_end: float = 0.04
    """Final exploration rate."""
    double: bool = True
    """Use the double-DQN target."""
    dueling: bool = False
    """Use a dueling Q-network."""
    prioritized: bool = False
    """Sample the replay memory by priority (TD error)."""
    target_return: float | None = 475.0
    logdir: str = "train_log/dqn"


class QNetwork(parl.Model):
    """Observation -> one Q-value per action; dueling streams when `dueling`."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int, dueling: bool) -> None:
        super().__init__()
        self.dueling = dueling
        self.body = mlp(obs_dim, [hidden], hidden)
        self.advantage = nn.Sequential(nn.ReLU(), nn.Linear(hidden, n_actions))
        self.state_value = nn.Sequential(nn.ReLU(), nn.Linear(hidden, 1)) if dueling else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        features = self.body(obs)
        advantage = self.advantage(features)
        if self.state_value is None:
            return advantage
        return self.state_value(features) + advantage - advantage.mean(dim=1, keepdim=True)


def main(args: Args) -> dict:
    env = gym.make(args.env_id)
    run = TrainingRun(
        f"DQN on {args.env_id}", args, total_steps=args.total_steps, eval_env=gym.make(args.env_id)
    )
    obs_dim, n_actions = env.observation_space.shape[0], env.action_space.n
    alg = DQN(
        QNetwork(obs_dim, n_actions, args.hidden_size, args.dueling),
        lr=args.lr,
        gamma=args.gamma,
        double=args.double,
    )
    decay = max(int(args.exploration_fraction * args.total_steps) - args.learning_starts, 1)
    agent = DQNAgent(
        alg,
        n_actions,
        eps_end=args.eps_end,
        eps_decay_steps=decay,
        seed=args.seed,
    )
    if args.prioritized:
        updates = args.total_steps * args.gradient_steps // args.train_freq
        memory = PrioritizedReplayMemory(
            args.buffer_size, obs_dim, 0, beta_steps=max(updates, 1), seed=args.seed
        )
    else:
        memory = ReplayMemory(args.buffer_size, obs_dim, 0, seed=args.seed)

    def after_step(step: int) -> None:
        if step % args.target_update_interval == 0:
            alg.sync_target()
        if step % 1000 == 0:
            parl.utils.summary.add_scalar("rollout/epsilon", agent.epsilon, step)

    train_off_policy(run, env, agent, memory, args, after_step=after_step)
    return asdict(run.finish(agent))


if __name__ == "__main__":
    main(parse_args(Args))

"""DQN on an Atari game (RoadRunner by default): the Nature DQN setup, bounded for a small machine.

The classic preprocessing comes from gymnasium's wrappers: `AtariPreprocessing` (up to 30
no-ops at reset, 4 frames per action with max-pooling of the last two, 84x84 grayscale) and
`FrameStackObservation` (the last 4 frames are the observation). Rewards are clipped to their
sign for learning; reported returns are the game's scores. The Q-network is the convolutional
network of Mnih et al. 2015 (https://doi.org/10.1038/nature14236) with the double-DQN target,
evaluated with epsilon 0.05 as in the paper. ale-py ships the game ROMs.

The defaults are a bounded run: 50k agent steps (200k frames) with a replay memory of 50k
transitions (about 3 GB), some 15 minutes on one busy CPU core, where the paper trains for 50M
steps with a memory of 1M. RoadRunner is a game where that much already shows: random play
scores about 0-40, and this run's training episodes averaged several hundred (see the
repository README). On Breakout the same budget stays at random play's ~1.5.

    python examples/dqn_atari/train.py
    python examples/dqn_atari/train.py --env-id ALE/Breakout-v5 --total-steps 1000000
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import ale_py
import gymnasium as gym
import numpy as np
import torch
from torch import nn

import parl
from parl.algorithms import DQN
from parl.utils import ReplayMemory, parse_args
from parl_algos.agents import DQNAgent
from parl_algos.training import OffPolicyArgs, TrainingRun, train_off_policy

gym.register_envs(ale_py)


@dataclass
class Args(OffPolicyArgs):
    env_id: str = "ALE/RoadRunner-v5"
    total_steps: int = 50_000
    lr: float = 1e-4
    batch_size: int = 32
    buffer_size: int = 50_000
    learning_starts: int = 5_000
    train_freq: int = 4
    hidden_size: int = 512
    target_update_interval: int = 1_000
    """Env steps between two copies of the model into the target network."""
    exploration_steps: int = 25_000
    """Env steps over which epsilon falls from 1 to --eps-end (warm-up steps included)."""
    eps_end: float = 0.01
    """Final exploration rate."""
    eval_epsilon: float = 0.05
    """Exploration rate while evaluating, as in the paper (a greedy agent may never serve)."""
    eval_every: int = 25_000
    eval_episodes: int = 3
    logdir: str = "train_log/dqn_atari"
    torch_threads: int = 1


def make_env(env_id: str) -> gym.Env:
    """The Atari game with the Nature DQN preprocessing: 4 stacked 84x84 grayscale frames."""
    env = gym.make(env_id, frameskip=1)  # AtariPreprocessing does the frame skipping
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84)
    return gym.wrappers.FrameStackObservation(env, stack_size=4)


class NatureCNN(parl.Model):
    """Three convolutions and a dense layer, from uint8 frames to one Q-value per action."""

    def __init__(self, n_actions: int, hidden: int = 512) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, hidden),
            nn.ReLU(),
            nn.Linear(hidden, n_actions),
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float() / 255.0)


def main(args: Args) -> dict:
    env, eval_env = make_env(args.env_id), make_env(args.env_id)
    run = TrainingRun(
        f"DQN on {args.env_id}", args, total_steps=args.total_steps, eval_env=eval_env
    )
    n_actions = env.action_space.n
    alg = DQN(NatureCNN(n_actions, args.hidden_size), lr=args.lr, gamma=args.gamma)
    agent = DQNAgent(
        alg,
        n_actions,
        eps_end=args.eps_end,
        eps_decay_steps=max(args.exploration_steps - args.learning_starts, 1),
        seed=args.seed,
    )
    memory = ReplayMemory(
        args.buffer_size, env.observation_space.shape, 0, obs_dtype=np.uint8, seed=args.seed
    )

    def after_step(step: int) -> None:
        if step % args.target_update_interval == 0:
            alg.sync_target()

    rng = np.random.default_rng(args.seed + 1)

    def eval_policy(obs: np.ndarray) -> int:
        if rng.random() < args.eval_epsilon:
            return int(rng.integers(n_actions))
        return agent.predict(obs)

    train_off_policy(
        run,
        env,
        agent,
        memory,
        args,
        after_step=after_step,
        reward_fn=np.sign,
        eval_policy=eval_policy,
    )
    return asdict(run.finish(agent))


if __name__ == "__main__":
    main(parse_args(Args))

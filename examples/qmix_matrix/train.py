"""QMIX on the QMIX paper's two-step game, where VDN and independent Q-learners settle for 7.

Rashid et al. (2018), section 5 and figure 3: two agents, two steps. In the first step agent 1's
action picks the game of the second step (agent 2's action does nothing): game 2A pays 7 for
every joint action, game 2B pays `[[0, 1], [1, 8]]`. The optimum is 8 (game 2B, both agents
taking their second action). Trained on uniformly random play (epsilon = 1, as in the paper),
an additive factorisation (VDN) fits game 2B by row and column effects and values it at about
6.5 < 7, so its greedy policy picks game 2A and earns 7; so do independent Q-learners
(`--mixer none`: each agent regresses its own Q-value on the team reward, no mixer), whose
agents average over each other's random actions (agent 1's value of game 2B: 4.5, below 7).
QMIX's mixing network is monotonic but conditioned on the state, which is enough to represent
game 2B exactly, so its greedy policy earns 8. The game is a PettingZoo parallel environment
run through `ParallelEnvArrays`; the agents observe the state (one-hot).

    python examples/qmix_matrix/train.py
    python examples/qmix_matrix/train.py --mixer vdn
    python examples/qmix_matrix/train.py --mixer none
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from gymnasium import spaces
from pettingzoo import ParallelEnv

from parl.algorithms import QMIX
from parl.utils import logger, parse_args
from parl_algos.multiagent import EpisodeMemory, ParallelEnvArrays
from parl_algos.qmix import QMixer, RNNAgent, VDNMixer

MIXERS = ("qmix", "vdn", "none")
PAYOFF_2B = np.array([[0.0, 1.0], [1.0, 8.0]], np.float32)


class TwoStepGame(ParallelEnv):
    """The two-step game as a PettingZoo parallel environment (states: 1, 2A, 2B; one-hot)."""

    metadata: ClassVar[dict] = {"name": "two_step_game_v0", "render_modes": []}

    def __init__(self) -> None:
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents: list[str] = []
        self._state = 0

    @functools.cache  # noqa: B019 -- PettingZoo's documented pattern; one space per agent
    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 1.0, (3,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    @property
    def state_space(self) -> spaces.Box:
        return spaces.Box(0.0, 1.0, (3,), np.float32)

    def state(self) -> np.ndarray:
        return np.eye(3, dtype=np.float32)[self._state]

    def _obs(self) -> dict[str, np.ndarray]:
        return {a: self.state() for a in self.agents}

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self._state = 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        a0, a1 = int(actions["agent_0"]), int(actions["agent_1"])
        if self._state == 0:
            self._state = 1 + a0  # agent 0 picks game 2A (state 1) or 2B (state 2)
            reward, done = 0.0, False
        else:
            reward = 7.0 if self._state == 1 else float(PAYOFF_2B[a0, a1])
            done = True
        obs = self._obs()
        rewards = {a: reward for a in self.agents}
        terminated = {a: done for a in self.agents}
        truncated = {a: False for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terminated, truncated, {a: {} for a in rewards}


@dataclass
class Args:
    mixer: str = "qmix"
    """`qmix` (the monotonic mixing network), `vdn` (a sum) or `none` (independent Q-learners)."""
    seed: int = 1
    """Seed of torch, numpy and the exploration."""
    updates: int = 200
    """Gradient steps, each on a batch of episodes of uniformly random play."""
    episodes_per_update: int = 2
    """Fresh episodes played before each update."""
    batch_size: int = 32
    """Episodes per update."""
    lr: float = 5e-3
    """Adam learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    target_update: int = 20
    """Updates between two copies of the networks into the targets."""
    torch_threads: int = 1
    """Torch intra-op threads."""


def play(env: ParallelEnvArrays, qmix: QMIX, epsilon: float, memory: EpisodeMemory | None):
    """Play one episode (epsilon-greedy); store it in `memory`; return (return, actions)."""
    obs = env.stack(env.reset())
    state, hidden = env.state(), qmix.init_hidden()
    total, taken, done = 0.0, [], False
    while not done:
        action, hidden = qmix.sample(torch.from_numpy(obs), hidden, epsilon)
        action = action.numpy()
        next_obs, reward, terminated, truncated = env.step(list(action))
        next_obs, next_state = env.stack(next_obs), env.state()
        team_reward, done = float(reward[0]), bool(terminated.all() or truncated.all())
        if memory is not None:
            memory.append(
                obs, state, action, team_reward, bool(terminated.all()), next_obs, next_state
            )
        total += team_reward
        taken.append(action.tolist())
        obs, state = next_obs, next_state
    if memory is not None:
        memory.end_episode()
    return total, taken


def main(args: Args) -> dict:
    if args.mixer not in MIXERS:
        raise ValueError(f"{args.mixer=} must be one of {', '.join(MIXERS)}")
    torch.set_num_threads(args.torch_threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    random.seed(args.seed)
    env = ParallelEnvArrays(TwoStepGame())
    n, obs_dim, n_actions = env.n_agents, env.max_obs_dim, 2
    mixer = {"qmix": lambda: QMixer(n, env.state_dim), "vdn": VDNMixer, "none": lambda: None}
    qmix = QMIX(
        RNNAgent(obs_dim + n, n_actions, hidden_dim=32),
        mixer[args.mixer](),
        n_agents=n,
        lr=args.lr,
        gamma=args.gamma,
        seed=args.seed,
    )
    memory = EpisodeMemory(1000, 2, n, obs_dim, env.state_dim, n_actions, seed=args.seed)
    stats = None
    for update in range(1, args.updates + 1):
        for _ in range(args.episodes_per_update):
            play(env, qmix, 1.0, memory)  # uniform exploration, as in the paper
        stats = qmix.learn(*memory.sample(args.batch_size))
        if update % args.target_update == 0:
            qmix.sync_target()
    greedy_return, joint_actions = play(env, qmix, 0.0, None)
    logger.info(
        "%s: greedy return %.1f with joint actions %s (final loss %.3f)",
        args.mixer, greedy_return, joint_actions, stats.loss,
    )  # fmt: skip
    return {
        "mixer": args.mixer,
        "greedy_return": greedy_return,
        "joint_actions": joint_actions,
        "loss": stats.loss,
    }


if __name__ == "__main__":
    main(parse_args(Args))

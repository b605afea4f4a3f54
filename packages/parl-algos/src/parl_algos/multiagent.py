"""Multi-agent plumbing: PettingZoo parallel environments as arrays, and the replay memories.

`ParallelEnvArrays` wraps a PettingZoo parallel environment so that the learning code sees
arrays in one fixed agent order (`env.possible_agents`) instead of dicts keyed by agent name,
and a global state (`env.state()` where the environment has one, else the concatenated
observations). `MultiAgentReplayMemory` keeps per-step transitions of every agent for MADDPG;
`EpisodeMemory` keeps whole padded episodes with a mask for QMIX's recurrent agents.
`gumbel_softmax` is the straight-through relaxation MADDPG uses for discrete actions.
`StackedAgentsEnv` shows a parallel environment as one `gymnasium.Env` of stacked agents, so
that the samplers (`parl.samplers`, remote workers included) step it like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

__all__ = [
    "EpisodeBatch",
    "EpisodeMemory",
    "MultiAgentBatch",
    "MultiAgentReplayMemory",
    "ParallelEnvArrays",
    "StackedAgentsEnv",
    "gumbel_softmax",
]


def gumbel_softmax(
    logits: torch.Tensor,
    tau: float = 1.0,
    *,
    hard: bool = True,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """A sample of the Gumbel-softmax relaxation of `Categorical(logits)`, along the last axis.

    Jang et al., "Categorical reparameterization with Gumbel-softmax", ICLR 2017,
    https://arxiv.org/abs/1611.01144. `y = softmax((logits + g) / tau)` with Gumbel noise `g`;
    with `hard=True` the forward value is the one-hot of `argmax y` (an exact sample of the
    categorical) while the gradient is that of `y` (the straight-through estimator).

    Args:
        logits: `(..., n)` unnormalised log-probabilities.
        tau: the temperature of the relaxation.
        hard: return one-hot samples with straight-through gradients.
        generator: the random generator of the Gumbel noise (CPU).
    """
    uniform = torch.rand(logits.shape, generator=generator).to(logits.device)
    gumbel = -torch.log((-torch.log(uniform.clamp(1e-20, 1.0))).clamp_min(1e-20))
    y = torch.softmax((logits + gumbel) / tau, dim=-1)
    if not hard:
        return y
    one_hot = torch.zeros_like(y).scatter_(-1, y.argmax(dim=-1, keepdim=True), 1.0)
    return one_hot - y.detach() + y


class ParallelEnvArrays:
    """A PettingZoo parallel environment seen as arrays in a fixed agent order.

    Agents are ordered as `env.possible_agents`. An agent that has left the episode (absent from
    the step's dicts) gets a zero observation, a zero reward and `terminated=True` from then on;
    the episode is over when every agent is terminated or truncated.

    Args:
        env: a `pettingzoo.ParallelEnv`.
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self.agents: tuple[str, ...] = tuple(env.possible_agents)
        if not self.agents:
            raise ValueError("ParallelEnvArrays: the environment has no possible_agents")
        self.n_agents = len(self.agents)
        self.obs_dims = tuple(int(np.prod(env.observation_space(a).shape)) for a in self.agents)
        self.action_spaces = tuple(env.action_space(a) for a in self.agents)
        self._has_state = callable(getattr(env, "state", None))
        self._obs: list[np.ndarray] = [np.zeros(d, np.float32) for d in self.obs_dims]
        if self._has_state:
            try:
                self.state_dim = int(np.prod(env.state_space.shape))
            except (AttributeError, NotImplementedError):
                self._has_state = False
        if not self._has_state:
            self.state_dim = sum(self.obs_dims)

    @property
    def max_obs_dim(self) -> int:
        """The largest observation size: the width of `stack`'s zero-padded rows."""
        return max(self.obs_dims)

    def reset(self, seed: int | None = None) -> list[np.ndarray]:
        """Start an episode; return each agent's observation (float32, flat)."""
        obs, _ = self.env.reset(seed=seed)
        self._obs = self._arrays(obs)
        return list(self._obs)

    def step(
        self, actions: Sequence[Any]
    ) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
        """Take one action per agent (in agent order).

        Returns:
            `(obs, reward, terminated, truncated)`: the observations (a list in agent order) and
            `(n_agents,)` arrays of rewards (float32) and flags (bool).
        """
        if len(actions) != self.n_agents:
            raise ValueError(
                f"ParallelEnvArrays.step: got {len(actions)} actions for {self.n_agents} agents"
            )
        live = set(self.env.agents)
        action_dict = {a: act for a, act in zip(self.agents, actions, strict=True) if a in live}
        obs, reward, terminated, truncated, _ = self.env.step(action_dict)
        self._obs = self._arrays(obs)
        r = np.array([reward.get(a, 0.0) for a in self.agents], np.float32)
        term = np.array([bool(terminated.get(a, a not in obs)) for a in self.agents])
        trunc = np.array([bool(truncated.get(a, False)) for a in self.agents])
        return list(self._obs), r, term, trunc

    def state(self) -> np.ndarray:
        """The global state: `env.state()` where defined, else the concatenated observations."""
        if self._has_state:
            return np.asarray(self.env.state(), np.float32).reshape(-1)
        return np.concatenate(self._obs)

    def stack(self, obs: Sequence[np.ndarray]) -> np.ndarray:
        """Stack per-agent observations into `(n_agents, max_obs_dim)`, zero-padding short ones."""
        out = np.zeros((self.n_agents, self.max_obs_dim), np.float32)
        for i, o in enumerate(obs):
            out[i, : o.shape[0]] = o
        return out

    def close(self) -> None:
        """Close the environment."""
        self.env.close()

    def _arrays(self, obs: dict) -> list[np.ndarray]:
        return [
            np.asarray(obs[a], np.float32).reshape(-1) if a in obs else np.zeros(d, np.float32)
            for a, d in zip(self.agents, self.obs_dims, strict=True)
        ]


class StackedAgentsEnv(gym.Env):
    """A PettingZoo parallel environment as one `gymnasium.Env` whose rows are the agents.

    The observation is `ParallelEnvArrays.stack`'s `(n_agents, max_obs_dim)` float32 array; the
    action one row per agent: `MultiDiscrete` when every agent's space is `Discrete`, else a
    `(n_agents, *shape)` `Box` when all are the same `Box`. The reward is the agents' rewards
    reduced by `reward` (`"mean"` or `"sum"`, for cooperative tasks); `info["rewards"]` holds
    each agent's and `info["state"]` the global state. The episode terminates when every agent
    is terminated and is truncated when every agent is done and some only truncated. A sampler
    builds it from a zero-argument factory, so a worker makes its own copy of the environment:
    `ParallelSampler(lambda: StackedAgentsEnv(simple_spread_v3.parallel_env()), agent)`.

    Args:
        env: a `pettingzoo.ParallelEnv`.
        reward: how the agents' rewards become one, `"mean"` or `"sum"`.
    """

    def __init__(self, env: Any, reward: str = "mean") -> None:
        if reward not in ("mean", "sum"):
            raise ValueError(f"StackedAgentsEnv: {reward=} must be 'mean' or 'sum'")
        self.arrays = ParallelEnvArrays(env)
        self._reduce = np.mean if reward == "mean" else np.sum
        n, spaces = self.arrays.n_agents, self.arrays.action_spaces
        self.observation_space = gym.spaces.Box(
            -np.inf, np.inf, (n, self.arrays.max_obs_dim), np.float32
        )
        if all(isinstance(s, gym.spaces.Discrete) for s in spaces):
            self.action_space: gym.Space = gym.spaces.MultiDiscrete([int(s.n) for s in spaces])
        elif all(isinstance(s, gym.spaces.Box) and s == spaces[0] for s in spaces):
            low = np.stack([s.low for s in spaces])
            high = np.stack([s.high for s in spaces])
            self.action_space = gym.spaces.Box(low, high, dtype=spaces[0].dtype)
        else:
            raise TypeError(
                "StackedAgentsEnv needs every agent's action space Discrete, or all the same "
                f"Box; got {spaces}"
            )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode; return the stacked observations and the global state in `info`."""
        super().reset(seed=seed)
        obs = self.arrays.reset(seed=seed)
        return self.arrays.stack(obs), {"state": self.arrays.state()}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Step every agent with its row of `action`."""
        rows = np.asarray(action)
        if isinstance(self.action_space, gym.spaces.MultiDiscrete):
            actions: list[Any] = [int(a) for a in rows.reshape(-1)]
        else:
            actions = list(rows.reshape(self.action_space.shape))
        obs, reward, terminated, truncated = self.arrays.step(actions)
        done = terminated | truncated
        all_terminated = bool(np.all(terminated))
        info = {"rewards": reward, "state": self.arrays.state()}
        return (
            self.arrays.stack(obs),
            float(self._reduce(reward)),
            all_terminated,
            bool(np.all(done)) and not all_terminated,
            info,
        )

    def close(self) -> None:
        """Close the PettingZoo environment."""
        self.arrays.close()


class MultiAgentBatch(NamedTuple):
    """Transitions of every agent: lists in agent order, and `(B, n_agents)` tensors."""

    obs: list[torch.Tensor]
    """Per agent, `(B, obs_dim_i)` observations."""
    action: list[torch.Tensor]
    """Per agent, `(B, act_dim_i)` actions (one-hot for discrete actions)."""
    reward: torch.Tensor
    """`(B, n_agents)` rewards."""
    next_obs: list[torch.Tensor]
    """Per agent, `(B, obs_dim_i)` observations after the step."""
    terminal: torch.Tensor
    """`(B, n_agents)` 1 where the agent's step ended in a terminal state (not a truncation)."""


class MultiAgentReplayMemory:
    """A ring buffer of joint transitions for off-policy multi-agent learning (MADDPG).

    Args:
        capacity: the most transitions kept; the oldest are overwritten.
        obs_dims: the observation size of each agent.
        act_dims: the action size of each agent (the number of actions for one-hot ones).
        seed: seed of the sampling.
    """

    def __init__(
        self,
        capacity: int,
        obs_dims: Sequence[int],
        act_dims: Sequence[int],
        seed: int | None = None,
    ) -> None:
        if capacity <= 0:
            raise ValueError(f"MultiAgentReplayMemory: {capacity=} must be positive")
        if len(obs_dims) != len(act_dims) or not obs_dims:
            raise ValueError(
                f"MultiAgentReplayMemory: {obs_dims=} and {act_dims=} must have one entry per agent"
            )
        self.capacity = capacity
        self.n_agents = len(obs_dims)
        self._obs = [np.zeros((capacity, d), np.float32) for d in obs_dims]
        self._next_obs = [np.zeros((capacity, d), np.float32) for d in obs_dims]
        self._action = [np.zeros((capacity, d), np.float32) for d in act_dims]
        self._reward = np.zeros((capacity, self.n_agents), np.float32)
        self._terminal = np.zeros((capacity, self.n_agents), np.float32)
        self._size = 0
        self._next = 0
        self._rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self._size

    def append(
        self,
        obs: Sequence[np.ndarray],
        action: Sequence[np.ndarray],
        reward: np.ndarray,
        next_obs: Sequence[np.ndarray],
        terminal: np.ndarray,
    ) -> None:
        """Store one joint transition (per-agent sequences in agent order)."""
        i = self._next
        for a in range(self.n_agents):
            self._obs[a][i] = obs[a]
            self._action[a][i] = action[a]
            self._next_obs[a][i] = next_obs[a]
        self._reward[i] = reward
        self._terminal[i] = terminal
        self._next = (i + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)

    def sample(self, batch_size: int) -> MultiAgentBatch:
        """Draw `batch_size` joint transitions uniformly, with replacement, as tensors."""
        if self._size == 0:
            raise ValueError("MultiAgentReplayMemory.sample: the memory is empty")
        idx = self._rng.integers(0, self._size, batch_size)

        def pick(arrays: list[np.ndarray]) -> list[torch.Tensor]:
            return [torch.from_numpy(x[idx]) for x in arrays]

        return MultiAgentBatch(
            obs=pick(self._obs),
            action=pick(self._action),
            reward=torch.from_numpy(self._reward[idx]),
            next_obs=pick(self._next_obs),
            terminal=torch.from_numpy(self._terminal[idx]),
        )


class EpisodeBatch(NamedTuple):
    """Whole episodes, zero-padded to `T` steps, batch-major: `(B, T, ...)`."""

    obs: torch.Tensor
    """`(B, T + 1, n_agents, obs_dim)` observations, the one after the last step included."""
    state: torch.Tensor
    """`(B, T + 1, state_dim)` global states."""
    action: torch.Tensor
    """`(B, T, n_agents)` int64 actions."""
    reward: torch.Tensor
    """`(B, T)` team rewards."""
    terminated: torch.Tensor
    """`(B, T)` 1 where the step ended the episode in a terminal state."""
    mask: torch.Tensor
    """`(B, T)` 1 for the steps that happened, 0 for the padding after the episode's end."""
    avail_actions: torch.Tensor
    """`(B, T + 1, n_agents, n_actions)` 1 for the actions each agent may take."""


class EpisodeMemory:
    """A ring buffer of whole episodes for recurrent multi-agent value learning (QMIX).

    An episode is written step by step with `append` and stored by `end_episode`; shorter
    episodes are zero-padded to `max_steps` and their mask marks the steps that happened.

    Args:
        capacity: the most episodes kept; the oldest are overwritten.
        max_steps: the longest episode, in steps.
        n_agents: number of agents.
        obs_dim: the observation size of every agent.
        state_dim: the size of the global state.
        n_actions: number of discrete actions of every agent.
        seed: seed of the sampling.
    """

    def __init__(
        self,
        capacity: int,
        max_steps: int,
        n_agents: int,
        obs_dim: int,
        state_dim: int,
        n_actions: int,
        seed: int | None = None,
    ) -> None:
        for name, value in (("capacity", capacity), ("max_steps", max_steps)):
            if value <= 0:
                raise ValueError(f"EpisodeMemory: {name}={value!r} must be positive")
        self.capacity, self.max_steps = capacity, max_steps
        self.n_agents, self.n_actions = n_agents, n_actions
        T, N = max_steps, n_agents
        self._obs = np.zeros((capacity, T + 1, N, obs_dim), np.float32)
        self._state = np.zeros((capacity, T + 1, state_dim), np.float32)
        self._action = np.zeros((capacity, T, N), np.int64)
        self._reward = np.zeros((capacity, T), np.float32)
        self._terminated = np.zeros((capacity, T), np.float32)
        self._mask = np.zeros((capacity, T), np.float32)
        self._avail = np.ones((capacity, T + 1, N, n_actions), np.float32)
        self._size = 0
        self._next = 0
        self._t = 0
        self._rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self._size

    def append(
        self,
        obs: np.ndarray,
        state: np.ndarray,
        action: np.ndarray,
        reward: float,
        terminated: bool,
        next_obs: np.ndarray,
        next_state: np.ndarray,
        avail_actions: np.ndarray | None = None,
        next_avail_actions: np.ndarray | None = None,
    ) -> None:
        """Add one step of the episode being written (`obs` `(n_agents, obs_dim)`)."""
        e, t = self._next, self._t
        if t >= self.max_steps:
            raise ValueError(
                f"EpisodeMemory.append: the episode is longer than max_steps={self.max_steps}; "
                "call end_episode() at its end or raise max_steps"
            )
        if t == 0:  # clear what an overwritten episode left behind
            self._mask[e] = 0.0
            self._terminated[e] = 0.0
            self._avail[e] = 1.0
        self._obs[e, t], self._state[e, t] = obs, state
        self._obs[e, t + 1], self._state[e, t + 1] = next_obs, next_state
        if avail_actions is not None:
            self._avail[e, t] = avail_actions
        if next_avail_actions is not None:
            self._avail[e, t + 1] = next_avail_actions
        self._action[e, t] = action
        self._reward[e, t] = reward
        self._terminated[e, t] = float(terminated)
        self._mask[e, t] = 1.0
        self._t += 1

    def end_episode(self) -> None:
        """Store the episode written since the last call (an empty one is dropped)."""
        if self._t == 0:
            return
        e = self._next
        self._obs[e, self._t + 1 :] = 0.0
        self._state[e, self._t + 1 :] = 0.0
        self._next = (e + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)
        self._t = 0

    def sample(self, batch_size: int) -> EpisodeBatch:
        """Draw `batch_size` stored episodes uniformly, with replacement, as tensors."""
        if self._size == 0:
            raise ValueError("EpisodeMemory.sample: no episode is stored yet")
        idx = self._rng.integers(0, self._size, batch_size)
        # The slot being written is never among the stored ones while the memory is not full;
        # when it is full, it is skipped (its old episode is being overwritten).
        if self._t > 0 and self._size == self.capacity:
            idx = np.where(idx == self._next, (idx + 1) % self.capacity, idx)
        return EpisodeBatch(
            *(
                torch.from_numpy(x[idx])
                for x in (
                    self._obs,
                    self._state,
                    self._action,
                    self._reward,
                    self._terminated,
                    self._mask,
                    self._avail,
                )
            )
        )

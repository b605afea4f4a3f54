"""Collecting on-policy experience from a vector of environments, apart from learning.

`VectorCollector` steps a gymnasium vector environment with any `act(obs)` function (a local
agent's sampler, or a remote actor's copy of the policy) and returns a `Trajectory` of numpy
arrays, which can cross a process boundary as it is. `compute_advantages` turns a trajectory
into the flat batch that `A2C.learn` and `PPO.learn` consume, given a value function. Episode
returns are counted here, in one place, so every example reports them the same way. The
environments the examples and `parl-train` share are made here too (`make_rescaled_env`,
`make_masked_cartpole`, `make_atari_env`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, SupportsFloat

import gymnasium as gym
import numpy as np
import torch
from numpy.typing import ArrayLike

from parl_algos.functional import gae

__all__ = [
    "AdvantageBatch",
    "Episode",
    "EpisodeCounter",
    "FireOnLifeStart",
    "MaskVelocity",
    "Trajectory",
    "VectorCollector",
    "compute_advantages",
    "make_atari_env",
    "make_masked_cartpole",
    "make_rescaled_env",
    "make_vector_env",
]


class Episode(NamedTuple):
    """One finished episode: the total env steps when it ended, its return and its length."""

    env_step: int
    ret: float
    length: int


class EpisodeCounter:
    """Adds up rewards per environment and reports each episode as it ends.

    Args:
        num_envs: how many environments step together (1 for a plain `gymnasium.Env`).
    """

    def __init__(self, num_envs: int = 1) -> None:
        self.num_envs = num_envs
        self.env_steps = 0
        self._returns = np.zeros(num_envs)
        self._lengths = np.zeros(num_envs, dtype=np.int64)

    def step(self, reward: ArrayLike, done: ArrayLike) -> list[Episode]:
        """Count one step of every environment; return the episodes it ended."""
        self.env_steps += self.num_envs
        self._returns += reward
        self._lengths += 1
        ended = []
        for i in np.flatnonzero(done):
            ended.append(Episode(self.env_steps, float(self._returns[i]), int(self._lengths[i])))
            self._returns[i] = 0.0
            self._lengths[i] = 0
        return ended


@dataclass
class Trajectory:
    """`T` steps of `N` environments, time-major.

    Attributes:
        obs: `(T + 1, N, *obs_shape)`: `obs[t]` is what `action[t]` was chosen from; `obs[T]` is
            the observation after the last step (to bootstrap from). Where an episode ended at
            step `t`, `obs[t + 1]` is the first observation of the next episode.
        action: `(T, N, *act_shape)` the actions taken.
        reward: `(T, N)` rewards.
        terminated: `(T, N)` True where the step reached a terminal state.
        truncated: `(T, N)` True where the step hit a time limit (and did not terminate).
        final_obs: `(K, *obs_shape)` the last observation of each truncated episode, in the order
            of `final_index`.
        final_index: `(K, 2)` the `(t, n)` of each truncated step.
        extras: `(T, N, ...)` arrays the `act` function returned beside each action (for example
            the behaviour policy's logits that IMPALA's V-trace needs).
    """

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray
    final_index: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def done(self) -> np.ndarray:
        """`(T, N)` True where an episode ended, for either reason."""
        return self.terminated | self.truncated

    @classmethod
    def from_batch(cls, batch: Any) -> Trajectory:
        """The trajectory of a sampler's `Batch` (`parl.samplers`): the same steps, this layout.

        `obs` gains the batch's `next_obs` as its last row; only the final observations of
        truncated (not terminated) steps are kept, as `VectorCollector` keeps them.
        """
        truncated = batch.truncated & ~batch.terminated
        index = sorted(key for key in batch.final_obs if truncated[key])
        obs_shape = batch.obs.shape[2:]
        return cls(
            obs=np.concatenate([batch.obs, batch.next_obs[None]]),
            action=batch.actions,
            reward=batch.rewards,
            terminated=batch.terminated,
            truncated=truncated,
            final_obs=np.array([batch.final_obs[k] for k in index], dtype=batch.obs.dtype).reshape(
                -1, *obs_shape
            ),
            final_index=np.array(index, dtype=np.int64).reshape(-1, 2),
            extras=dict(batch.extras),
        )

    @classmethod
    def concat(cls, parts: Sequence[Trajectory]) -> Trajectory:
        """The environments of `parts` side by side: one trajectory of all their columns.

        Every part has the same `T` steps (and the same extras); the columns keep their order,
        part by part, and each truncated step's `final_index` names its column in the whole.
        """
        if not parts:
            raise ValueError("Trajectory.concat needs at least one trajectory")
        steps = {len(p.action) for p in parts}
        if len(steps) > 1:
            raise ValueError(f"Trajectory.concat: the parts have different steps {sorted(steps)}")
        if len(parts) == 1:
            return parts[0]
        offsets = np.cumsum([0] + [p.reward.shape[1] for p in parts[:-1]])
        return cls(
            obs=np.concatenate([p.obs for p in parts], axis=1),
            action=np.concatenate([p.action for p in parts], axis=1),
            reward=np.concatenate([p.reward for p in parts], axis=1),
            terminated=np.concatenate([p.terminated for p in parts], axis=1),
            truncated=np.concatenate([p.truncated for p in parts], axis=1),
            final_obs=np.concatenate([p.final_obs for p in parts]),
            final_index=np.concatenate(
                [
                    p.final_index + np.array([0, k], np.int64)
                    for p, k in zip(parts, offsets, strict=True)
                ]
            ),
            extras={
                name: np.concatenate([p.extras[name] for p in parts], axis=1)
                for name in parts[0].extras
            },
        )


@dataclass(frozen=True)
class AdvantageBatch:
    """A trajectory flattened to `T * N` samples with advantages: what A2C and PPO learn from."""

    obs: torch.Tensor
    action: torch.Tensor
    advantage: torch.Tensor
    value_target: torch.Tensor
    """`advantage + value`: the return estimate the value function regresses to."""
    value: torch.Tensor
    """The value estimate at collection time (PPO's value clipping is relative to it)."""


def make_vector_env(env_id: str, num_envs: int, **kwargs: Any) -> gym.vector.SyncVectorEnv:
    """`gym.make_vec(env_id, num_envs)`, stepped in this process, as `VectorCollector` needs it.

    Sub-environments reset in the same step that ends their episode (gymnasium's `SAME_STEP`
    autoreset), so every step returned is a real transition. `kwargs` go to `gym.make`.
    """
    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        **kwargs,
    )


def make_rescaled_env(env_id: str, **kwargs: Any) -> gym.Env:
    """`gym.make(env_id)` with its Box actions rescaled to `[-1, 1]`, the range of a tanh policy.

    `kwargs` go to `gym.make`.
    """
    env = gym.make(env_id, **kwargs)
    shape, dtype = env.action_space.shape, env.action_space.dtype
    return gym.wrappers.RescaleAction(
        env, np.full(shape, -1.0, dtype=dtype), np.full(shape, 1.0, dtype=dtype)
    )


def make_atari_env(env_id: str, *, fire_reset: bool = False, **kwargs: Any) -> gym.Env:
    """An Atari game of ale-py with the Nature DQN preprocessing: 4 stacked 84x84 grayscale frames.

    Mnih et al. 2015 (https://doi.org/10.1038/nature14236) through gymnasium's wrappers:
    `AtariPreprocessing` (up to 30 no-ops at reset, 4 frames per action with the maximum of
    the last two, 84x84 grayscale) and `FrameStackObservation` (the last 4 frames), so that an
    observation is a `(4, 84, 84)` uint8 array. Rewards stay the game's scores: clipping them
    for learning is the training loop's (`reward_fn=np.sign`). `fire_reset`: FIRE is pressed
    for the agent at reset and after each lost life (`FireOnLifeStart`). `kwargs` go to
    `gym.make` (e.g. `render_mode`).

    Raises:
        ImportError: ale-py (the games, ROMs included) is not installed.
    """
    try:
        import ale_py
    except ImportError as exc:
        raise ImportError(
            f"{env_id} needs ale-py (the Atari games): pip install 'parl-algos[examples]'"
        ) from exc
    gym.register_envs(ale_py)  # in each process that makes one (a worker's too)
    env = gym.make(env_id, frameskip=1, **kwargs)  # AtariPreprocessing skips the frames
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, screen_size=84)
    if fire_reset:
        env = FireOnLifeStart(env)
    return gym.wrappers.FrameStackObservation(env, stack_size=4)


class FireOnLifeStart(gym.Wrapper):
    """Presses FIRE for the agent when a life starts: after reset and after each lost life.

    Games such as Breakout wait for FIRE to launch the ball; a greedy policy that has not
    learned to press it would play out the episode's time limit. The episode stays the whole
    game (no end at a lost life). The FIRE step's reward joins the step that lost the life (or
    the reset's none), and its frames are the environment's, not an agent step.

    Raises:
        ValueError: the game has no FIRE action.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        if "FIRE" not in meanings:
            raise ValueError(
                f"{env.spec.id if env.spec else env}: fire_reset needs a game with a FIRE "
                f"action; its actions are {meanings}: leave env.fire_reset out"
            )
        self._fire = meanings.index("FIRE")
        self._lives = 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """Reset, then FIRE (resetting again should FIRE end the game at once)."""
        obs, info = self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(self._fire)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        self._lives = self.env.unwrapped.ale.lives()
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """The agent's step; FIRE after it where it lost a life and the game goes on."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self.env.unwrapped.ale.lives()
        if lives < self._lives and not (terminated or truncated):
            obs, fire_reward, terminated, truncated, info = self.env.step(self._fire)
            reward = float(reward) + float(fire_reward)
        self._lives = lives
        return obs, reward, terminated, truncated, info


class MaskVelocity(gym.ObservationWrapper):
    """CartPole with its two velocities hidden: only the cart's position and the pole's angle.

    A partially observable task: a policy must infer the velocities from what it saw before
    (R2D2's recurrent network can, a feed-forward Q-network cannot).
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        low, high = env.observation_space.low[[0, 2]], env.observation_space.high[[0, 2]]
        self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """Keep the position and the angle."""
        return observation[[0, 2]].astype(np.float32)


def make_masked_cartpole(**kwargs: Any) -> gym.Env:
    """CartPole-v1 with its velocities hidden (`MaskVelocity`); `kwargs` go to `gym.make`.

    Registered with gymnasium as `CartPoleNoVelocity-v1` when this module is imported, so that
    any algorithm's config or example can name it (`--env.id CartPoleNoVelocity-v1`).
    """
    return MaskVelocity(gym.make("CartPole-v1", **kwargs))


if "CartPoleNoVelocity-v1" not in gym.registry:
    gym.register("CartPoleNoVelocity-v1", entry_point=make_masked_cartpole)


class VectorCollector:
    """Steps a vector environment with a policy and returns fixed-length trajectories.

    The collector keeps the current observations between calls, so consecutive trajectories
    continue the same episodes, and it counts every finished episode (`pop_episodes`).

    Args:
        envs: a gymnasium vector env with `SAME_STEP` autoreset (see `make_vector_env`).
        seed: seed of the first reset (each sub-environment gets `seed + i`).
    """

    def __init__(self, envs: gym.vector.VectorEnv, *, seed: int | None = None) -> None:
        mode = envs.metadata.get("autoreset_mode")
        if mode != gym.vector.AutoresetMode.SAME_STEP:
            raise ValueError(
                f"VectorCollector needs a vector env with SAME_STEP autoreset, got {mode=}; "
                "create it with parl_algos.rollout.make_vector_env or pass "
                "vector_kwargs={'autoreset_mode': gym.vector.AutoresetMode.SAME_STEP}"
            )
        self.envs = envs
        self.num_envs = envs.num_envs
        self.obs, _ = envs.reset(seed=seed)
        self._counter = EpisodeCounter(self.num_envs)
        self._episodes: list[Episode] = []

    @property
    def env_steps(self) -> int:
        """Steps taken so far, summed over the environments."""
        return self._counter.env_steps

    def collect(
        self,
        n_steps: int,
        act: Callable[[np.ndarray], np.ndarray | tuple[np.ndarray, dict[str, np.ndarray]]],
    ) -> Trajectory:
        """Run `n_steps` steps of every environment and return them.

        Args:
            n_steps: `T`, the steps per environment.
            act: maps a batch of observations `(N, *obs_shape)` to the actions `(N, ...)`, or to
                `(actions, extras)` where `extras` maps names to `(N, ...)` arrays to keep.
        """
        n = self.num_envs
        obs = np.empty((n_steps + 1, *self.obs.shape), dtype=self.obs.dtype)
        reward = np.empty((n_steps, n), dtype=np.float32)
        terminated = np.empty((n_steps, n), dtype=bool)
        truncated = np.empty((n_steps, n), dtype=bool)
        actions: list[np.ndarray] = []
        extras: dict[str, list[np.ndarray]] = {}
        final_obs: list[np.ndarray] = []
        final_index: list[tuple[int, int]] = []
        for t in range(n_steps):
            obs[t] = self.obs
            out = act(self.obs)
            action, extra = out if isinstance(out, tuple) else (out, {})
            actions.append(np.asarray(action))
            for name, value in extra.items():
                extras.setdefault(name, []).append(np.asarray(value))
            self.obs, reward[t], terminated[t], truncated[t], info = self.envs.step(action)
            truncated[t] &= ~terminated[t]
            for i in np.flatnonzero(truncated[t]):
                final_obs.append(info["final_obs"][i])
                final_index.append((t, i))
            self._episodes += self._counter.step(reward[t], terminated[t] | truncated[t])
        obs[n_steps] = self.obs
        return Trajectory(
            obs=obs,
            action=np.stack(actions),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            final_obs=np.array(final_obs, dtype=obs.dtype).reshape(-1, *obs.shape[2:]),
            final_index=np.array(final_index, dtype=np.int64).reshape(-1, 2),
            extras={name: np.stack(values) for name, values in extras.items()},
        )

    def pop_episodes(self) -> list[Episode]:
        """Return the episodes finished since the last call, oldest first."""
        episodes, self._episodes = self._episodes, []
        return episodes


@torch.no_grad()
def compute_advantages(
    trajectory: Trajectory,
    value_fn: Callable[[torch.Tensor], torch.Tensor],
    *,
    gamma: float,
    gae_lambda: float,
) -> AdvantageBatch:
    """Flatten `trajectory` into an `AdvantageBatch` with GAE advantages.

    The values of all `T + 1` observations (and of the last observation of each truncated
    episode, which is bootstrapped from) come from one batched call of `value_fn`.

    Args:
        trajectory: what `VectorCollector.collect` returned.
        value_fn: maps a batch of observations `(B, *obs_shape)` to values `(B,)`.
        gamma: discount factor.
        gae_lambda: the GAE lambda (1 gives Monte-Carlo advantages, as A2C's n-step returns).
    """
    obs = torch.as_tensor(trajectory.obs)
    steps, n = trajectory.reward.shape
    all_obs = obs.reshape(-1, *obs.shape[2:])
    if len(trajectory.final_obs):
        all_obs = torch.cat([all_obs, torch.as_tensor(trajectory.final_obs)])
    all_values = value_fn(all_obs).reshape(-1)
    values = all_values[: (steps + 1) * n].reshape(steps + 1, n)
    next_value = values[1:].clone()
    if len(trajectory.final_obs):
        t, i = torch.as_tensor(trajectory.final_index).unbind(1)
        next_value[t, i] = all_values[(steps + 1) * n :]
    advantage = gae(
        torch.as_tensor(trajectory.reward),
        values[:-1],
        next_value,
        torch.as_tensor(trajectory.terminated),
        torch.as_tensor(trajectory.done),
        gamma,
        gae_lambda,
    )
    action = torch.as_tensor(trajectory.action)
    return AdvantageBatch(
        obs=obs[:-1].reshape(steps * n, *obs.shape[2:]),
        action=action.reshape(steps * n, *action.shape[2:]),
        advantage=advantage.reshape(-1),
        value_target=(advantage + values[:-1]).reshape(-1),
        value=values[:-1].reshape(-1),
    )

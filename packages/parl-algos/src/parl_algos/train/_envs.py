"""The environments and samplers of `parl-train`'s runs, and the cluster they run on.

`make_env` makes one environment as every run plays it (Box actions rescaled to `[-1, 1]`,
float32 observations, Atari games with the Nature DQN's preprocessing), `make_eval_env` the
evaluations' (recorded with `train.capture_video`). `make_collector` builds a run's sampler
(`parl.samplers`: `SerialSampler` in `single` mode, `ParallelSampler` in `sync`,
`AsyncSampler` in `async`) with the face of a `VectorCollector` (`SamplerCollector`), and
`connect` connects the run to its cluster.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

import parl
from parl.samplers import AsyncSampler, ParallelSampler, SerialSampler
from parl_algos.rollout import Episode, Trajectory, make_atari_env, make_rescaled_env
from parl_algos.train._config import Config, ConfigError
from parl_algos.train._spec import AlgorithmSpec

__all__ = [
    "ASYNC_WORKER_NICE",
    "SamplerCollector",
    "async_options",
    "check_atari_env",
    "connect",
    "make_collector",
    "make_env",
    "make_env_fn",
    "make_eval_env",
]

ASYNC_WORKER_NICE = 5
"""The niceness of on-policy `async` workers: below the learner, whose update bounds the rate.

Two workers at 5 weigh less together than one process at 0, so a scheduler balancing two
cores leaves the learner a core of its own; under others' load the workers still get a share.
"""


def make_env(
    env_id: str, *, atari: bool = False, fire_reset: bool = False, **kwargs: Any
) -> gym.Env:
    """One environment; Box actions are rescaled to `[-1, 1]` (the range of a tanh policy).

    Actions outside `[-1, 1]` (a Gaussian policy's draws) are clipped to it, and float64
    observations (MuJoCo's) become float32, the models' dtype. `atari`: an Atari game with the
    Nature DQN's preprocessing (`make_atari_env`: 4 stacked 84x84 uint8 frames), and with
    `fire_reset` FIRE pressed for the agent when a life starts.
    """
    if atari:
        return make_atari_env(env_id, fire_reset=fire_reset, **kwargs)
    env = gym.make(env_id, **kwargs)
    if isinstance(env.action_space, gym.spaces.Box):
        env.close()
        env = gym.wrappers.ClipAction(make_rescaled_env(env_id, **kwargs))
    space = env.observation_space
    if isinstance(space, gym.spaces.Box) and space.dtype == np.float64:
        low, high = space.low.astype(np.float32), space.high.astype(np.float32)
        env = gym.wrappers.TransformObservation(env, _float32, gym.spaces.Box(low, high))
    return env


def _float32(obs: np.ndarray) -> np.ndarray:
    return obs.astype(np.float32)


def make_env_fn(config: Config) -> Callable[[], gym.Env]:
    """A picklable zero-argument maker of the config's environment (`make_env`'s)."""
    return functools.partial(
        make_env,
        config.env.id,
        atari=getattr(config.env, "atari", False),
        fire_reset=getattr(config.env, "fire_reset", False),
    )


def make_eval_env(config: Config, logdir: str) -> gym.Env:
    """The evaluation environment; with `train.capture_video`, its episodes are recorded."""
    if not config.train.capture_video:
        return make_env_fn(config)()
    if getattr(config.env, "atari", False):  # the game's frames, not the network's
        fire_reset = getattr(config.env, "fire_reset", False)
        env = make_atari_env(config.env.id, fire_reset=fire_reset, render_mode="rgb_array")
    else:
        env = gym.make(config.env.id, render_mode="rgb_array")
    env = gym.wrappers.RecordVideo(
        env,
        os.path.join(logdir, "videos"),
        episode_trigger=lambda episode: True,
        name_prefix="eval",
        disable_logger=True,
    )
    if isinstance(env.action_space, gym.spaces.Box):
        shape, dtype = env.action_space.shape, env.action_space.dtype
        env = gym.wrappers.RescaleAction(
            env, np.full(shape, -1.0, dtype=dtype), np.full(shape, 1.0, dtype=dtype)
        )
    return env


def check_atari_env(env: Any) -> None:
    """Raise ConfigError where the `[env]` section's Atari keys do not fit.

    `atari` needs a game of ale-py (which must be installed); `fire_reset` needs `atari`.
    """
    if getattr(env, "fire_reset", False) and not getattr(env, "atari", False):
        raise ConfigError(
            "env.fire_reset = true presses FIRE in an Atari game: it needs env.atari = true"
        )
    if getattr(env, "atari", False):
        _check_atari_game(env.id)


def _check_atari_game(env_id: str) -> None:
    try:
        import ale_py
    except ImportError:
        raise ConfigError(
            "env.atari = true needs ale-py (the Atari games): pip install 'parl-algos[examples]'"
        ) from None
    gym.register_envs(ale_py)
    try:
        entry_point = str(gym.spec(env_id).entry_point)
    except gym.error.Error:
        entry_point = ""
    if not entry_point.startswith("ale_py"):
        raise ConfigError(
            f"env.atari = true needs an Atari game of ale-py, e.g. id = 'ALE/RoadRunner-v5'; "
            f"env.id={env_id!r} is not one"
        )


PRELOAD = ["torch", "gymnasium", "parl_algos"]
"""What an embedded xparl cluster's warm processes import as it starts: every actor of a run
imports them, so its first actors and the spare that replaces a lost one (which would
otherwise learn them only from the first actors, and import them at a low CPU share once the
actors keep the CPUs busy) start without the second of importing torch."""


def connect(config: Config) -> None:
    """Connect to the run's cluster: `train.address`, or an embedded one of `actors + 1` slots."""
    train = config.train
    if train.address is None:
        preload = PRELOAD if train.backend == "xparl" else []  # (Ray has no warm processes)
        parl.connect(cpu_num=train.actors + 1, backend=train.backend, preload=preload)
    else:
        parl.connect(train.address, backend=train.backend)


class SamplerCollector:
    """A sampler (`parl.samplers`) with the face of a `VectorCollector`, for `train_on_policy`.

    Each `collect` first sends the agent's weights to the sampler's workers (nothing for a
    `SerialSampler`), or with `weights_every` only once that many env steps passed since the
    last send, then returns the sampler's next `batches` batches as one `Trajectory`, their
    environments side by side (`Trajectory.concat`). `offset` counts the env steps of earlier
    sessions of the run, when a resumed run starts a fresh sampler.

    Args:
        sampler: a `SerialSampler`, `ParallelSampler` or `AsyncSampler` built with the agent.
        offset: env steps taken before this sampler's first.
        weights_every: env steps between two sends of the weights (0: before every
            `collect`; the first always gets them).
        batches: sampler batches a `collect` returns together (an `AsyncSampler`'s batch is
            one worker's environments: as many as it has workers make the run's whole vector).

    Attributes:
        weights_sent: sends of the weights so far.
    """

    def __init__(
        self, sampler: Any, *, offset: int = 0, weights_every: int = 0, batches: int = 1
    ) -> None:
        if batches < 1:
            raise ValueError(f"SamplerCollector: batches={batches} must be at least 1")
        self.sampler = sampler
        self.batches = batches
        self.offset = offset
        self.weights_every = weights_every
        self.weights_sent = 0
        self._sent_at: int | None = None

    @property
    def env_steps(self) -> int:
        """Env steps of the run so far, summed over the environments."""
        return self.offset + self.sampler.env_steps

    def collect(self, n_steps: int, act: Any = None) -> Trajectory:
        """The sampler's next `batches` batches (its own `horizon` steps, with its own agent)."""
        steps = self.sampler.env_steps
        if self._sent_at is None or steps - self._sent_at >= self.weights_every:
            self.sampler.sync_weights()
            self.weights_sent += 1
            self._sent_at = steps
        parts = [Trajectory.from_batch(self.sampler.collect()) for _ in range(self.batches)]
        return Trajectory.concat(parts)

    @property
    def restarts(self) -> int:
        """The sampler's workers replaced so far (0 for a `SerialSampler`)."""
        return getattr(self.sampler, "restarts", 0)

    def pop_episodes(self) -> list[Episode]:
        """The episodes finished since the last call, dated by the run's env steps."""
        return [e._replace(env_step=e.env_step + self.offset) for e in self.sampler.episodes()]

    def close(self) -> None:
        """Close the sampler (its environments, and its workers if it has any)."""
        self.sampler.close()


def make_collector(config: Config, spec: AlgorithmSpec, agent: Any) -> SamplerCollector:
    """The sampler of a run: in-process (`single`) or on worker actors (`sync`, `async`).

    `async` uses an `AsyncSampler` where `sync` uses a `ParallelSampler`: workers never wait
    for the learner, which takes each worker's batch as it comes (IMPALA's V-trace corrects
    for the policy lag; off-policy algorithms learn from the replay memory, Ape-X style).

    On-policy, `single` steps `env.num_envs` environments with a `SerialSampler` and `sync`
    splits them over `train.actors` workers of a `ParallelSampler` (at least one each), for
    `agent.n_steps` steps a round. Off-policy (`sync`, `async`), each worker steps one
    environment for `train_freq / actors` steps a batch (at least 8), acting with `agent`
    (a DQN-family agent's `QActing`: the exploration the learner decides). Workers run on the
    cluster of `train.address`, or on an embedded one of `actors + 1` slots. With
    `train.restart_actors` the sampler replaces a worker that dies (`restart=True`).

    On-policy PPO's `async` learns from batches as large as the other modes' (`agent.n_steps`
    steps of `env.num_envs` environments): each update takes as many of the workers' batches
    as there are workers (`SamplerCollector`'s `batches`), whichever finished first, each
    sample weighted against its own behaviour policy (`BehaviourPPOAgent`). One worker's
    batch an update would halve the config's batch and double the updates per env step, each
    with a full trust region (`update_epochs` passes, clipped at `clip_coef`): the policy
    would move up to twice as far per sample as in the other modes. IMPALA learns each
    worker's batch as it comes.

    On-policy `async` keeps the batches fresh and the learner first: with several workers each
    has one rollout under way or waiting (not two: half the policy lag, the learner still fed
    while a worker's rollout lasts no longer than two of its updates), and the workers run at
    niceness `ASYNC_WORKER_NICE` (`AsyncSampler`'s `worker_nice`). The learner's update is
    what bounds the rate there; at equal priority each worker's session took as large a share
    of a busy core as the learner's, and the workers' lead only aged the data.
    """
    train = config.train
    if spec.family == "on_policy":
        horizon, num_envs = config.agent.n_steps, config.env.num_envs
    else:
        horizon, num_envs = max(config.agent.train_freq // train.actors, 8), train.actors
    if train.mode == "single":
        sampler = SerialSampler(
            make_env_fn(config),
            agent,
            num_workers=1,
            envs_per_worker=num_envs,
            horizon=horizon,
            seed=train.seed,
        )
        return SamplerCollector(sampler)
    connect(config)
    options = async_options(config, spec) if train.mode == "async" else {}
    sampler_cls = ParallelSampler if train.mode == "sync" else AsyncSampler
    sampler = sampler_cls(
        make_env_fn(config),
        agent,
        num_workers=train.actors,
        envs_per_worker=max(num_envs // train.actors, 1),
        horizon=horizon,
        seed=train.seed,
        restart=train.restart_actors,
        max_restarts=train.max_restarts,
        **options,
    )
    batches = train.actors if train.mode == "async" and spec.name == "PPO" else 1
    return SamplerCollector(sampler, weights_every=train.weights_every, batches=batches)


def async_options(config: Config, spec: AlgorithmSpec) -> dict[str, Any]:
    """`AsyncSampler`'s `slots` and `worker_nice` for an `async` run (see `make_collector`)."""
    if spec.family != "on_policy":
        return {}
    return {"slots": 1 if config.train.actors > 1 else 2, "worker_nice": ASYNC_WORKER_NICE}

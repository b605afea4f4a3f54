"""The plumbing every training script shares, so that each example is only its algorithm.

`RunArgs` holds the settings every example has (environment and output directory, and the
`ScheduleArgs`: seed, budget, evaluation schedule, target, torch threads), `OffPolicyArgs` and
`OnPolicyArgs` those of a family (with the `ReplayArgs` or the `ActorCriticArgs`); an
example's `@dataclass Args(OffPolicyArgs)` adds or re-defaults its algorithm's. `parl-train`'s
config sections are built on the same dataclasses, so each setting is declared once.
`TrainingRun` sets up a run (seeds, torch threads, log and summary directories, a progress
bar), records finished episodes and training statistics to TensorBoard, evaluates the greedy
policy on a schedule, notices when the mean return of the last episodes first reaches a
target, and at the end saves the agent, draws the learning curve and returns a `RunResult`.
`train_off_policy` is the loop of the replay-based examples (DQN, DDPG, TD3, SAC) and
`train_on_policy` that of the trajectory-based ones (A2C, PPO); the parallel ones collect with
`parl.samplers`.
`evaluate` and `save_learning_curve` can be used on their own. The progress bar needs `tqdm`
and the curve `matplotlib` (the `examples` extra of parl-algos).
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import parl
from parl.utils import ReplayMemory, logger, summary
from parl_algos.rollout import (
    Episode,
    EpisodeCounter,
    VectorCollector,
    make_rescaled_env,
)

__all__ = [
    "ActorCriticArgs",
    "OffPolicyArgs",
    "OffPolicyState",
    "OnPolicyArgs",
    "ReplayArgs",
    "RunArgs",
    "RunResult",
    "ScheduleArgs",
    "TARGETS_ON",
    "TrainingRun",
    "evaluate",
    "save_learning_curve",
    "train_continuous_control",
    "train_off_policy",
    "train_on_policy",
]


TARGETS_ON = ("train", "eval")
"""What `ScheduleArgs.target_return` can be compared with."""


@dataclasses.dataclass
class ScheduleArgs:
    """The budget, seed, evaluation schedule and target of a run (`parl-train`'s too)."""

    seed: int = 1
    """Seed of the environments, torch and numpy."""
    total_steps: int = 100_000
    """Env steps to train for (summed over the environments)."""
    eval_every: int = 10_000
    """Evaluate the greedy policy every this many env steps (0: never)."""
    eval_episodes: int = 5
    """Episodes per evaluation."""
    target_return: float | None = None
    """Report when the mean return of the last 10 training episodes first reaches this."""
    target_on: str = "train"
    """What target_return is compared with: "train", the mean return of the last 10 training
    episodes, or "eval", an evaluation's mean return (the greedy policy's: for runs whose
    actors explore by design, as Ape-X's do)."""
    stop_at_target: bool = False
    """Stop training as soon as target_return is reached."""
    torch_threads: int = 1
    """Torch intra-op threads: one is fastest for small networks on a busy machine."""


@dataclasses.dataclass
class RunArgs(ScheduleArgs):
    """The settings every example shares; each field's docstring is its `--help`."""

    env_id: str = "CartPole-v1"
    """The gymnasium environment to train on."""
    logdir: str = "train_log/run"
    """Where the summary, the checkpoint and the learning curve go."""


@dataclasses.dataclass
class ReplayArgs:
    """The hyperparameters every replay-based algorithm has (`parl-train`'s `[agent]` too)."""

    lr: float = 1e-3
    """Adam learning rate (of every network)."""
    gamma: float = 0.99
    """Discount factor."""
    batch_size: int = 256
    """Transitions per update."""
    buffer_size: int = 1_000_000
    """Replay memory size."""
    learning_starts: int = 100
    """Random steps before learning starts."""
    train_freq: int = 1
    """Env steps between two rounds of updates."""
    gradient_steps: int = 1
    """Updates per round."""
    hidden_size: int = 256
    """Width of the hidden layers of each network."""


@dataclasses.dataclass
class OffPolicyArgs(ReplayArgs, RunArgs):
    """The settings of the replay-based examples (DQN, DDPG, TD3, SAC)."""


@dataclasses.dataclass
class ActorCriticArgs:
    """The hyperparameters A2C, PPO and IMPALA share (`parl-train`'s `[agent]` too)."""

    n_steps: int = 5
    """Steps per environment between two updates."""
    lr: float = 7e-4
    """Learning rate."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 1.0
    """GAE lambda (1: n-step returns)."""
    ent_coef: float = 0.0
    """Entropy bonus weight."""
    vf_coef: float = 0.5
    """Value loss weight."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    hidden_size: int = 64
    """Width of the two hidden layers of the actor and of the critic."""


@dataclasses.dataclass
class OnPolicyArgs(ActorCriticArgs, RunArgs):
    """The settings of the examples that learn from fresh trajectories (A2C, PPO)."""

    num_envs: int = 8
    """Environments stepped together."""


def evaluate(
    env: gym.Env,
    policy: Callable[[np.ndarray], Any],
    episodes: int,
    *,
    seed: int | None = None,
) -> float:
    """Run `episodes` episodes of `policy` (observation -> action) and return the mean return.

    `seed` seeds the first reset; later episodes continue the environment's random stream.
    """
    total = 0.0
    for i in range(episodes):
        obs, _ = env.reset(seed=seed if i == 0 else None)
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy(obs))
            total += float(reward)
            done = terminated or truncated
    return total / episodes


def save_learning_curve(
    path: str | os.PathLike,
    title: str,
    train: Sequence[tuple[int, float]],
    evals: Sequence[tuple[int, float]] = (),
    *,
    window: int = 10,
    target: float | None = None,
) -> None:
    """Draw episode returns against env steps into a PNG at `path`.

    Args:
        path: the image file to write.
        title: the plot's title.
        train: `(env_step, return)` of each training episode; drawn faintly, with the mean of
            the last `window` episodes on top.
        evals: `(env_step, mean return)` of each evaluation.
        window: episodes in the running mean.
        target: a return to draw as a dashed line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        steps, returns = (np.asarray(v) for v in zip(*train, strict=True))
        ax.plot(steps, returns, alpha=0.25, label="training episode return")
        cumulative = np.cumsum(np.insert(returns, 0, 0.0))
        lo = np.maximum(np.arange(1, len(returns) + 1) - window, 0)
        running = (cumulative[1:] - cumulative[lo]) / (np.arange(1, len(returns) + 1) - lo)
        ax.plot(steps, running, label=f"mean of the last {window} episodes")
    if evals:
        x, y = zip(*evals, strict=True)
        ax.plot(x, y, marker="o", label="evaluation mean return")
    if target is not None:
        ax.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_xlabel("environment steps")
    ax.set_ylabel("return")
    ax.set_title(title)
    if train or evals or target is not None:  # a run without an episode has nothing to name
        ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.fspath(path), dpi=100)
    plt.close(fig)


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a training run did: `TrainingRun.finish`'s summary.

    `dataclasses.asdict(result)` gives it as a plain dict (for JSON).
    """

    env_steps: int
    """Environment steps taken."""
    episodes: int
    """Training episodes finished."""
    reached_at: int | None
    """The env step at which the mean return of the last `window` training episodes first
    reached `target_return`, or with `target_on="eval"` the env step of the first evaluation
    whose mean return did (None: never, or no target)."""
    reached_seconds: float | None
    """Seconds of training (set-up excluded) until `reached_at`."""
    final_mean_return: float | None
    """Mean return of the last `window` training episodes at the end (None: no episode)."""
    best_eval_return: float | None
    """The best mean return of the scheduled evaluations (None: none ran)."""
    seconds: float
    """Seconds of training in all (set-up excluded)."""


class TrainingRun:
    """One training run of an example: seeding, logging, evaluation, checkpoint and curve.

    Typical use, in a loop that steps environments and calls `agent.learn` (this is what
    `train_off_policy` and `train_on_policy` do)::

        run = TrainingRun("DQN on CartPole-v1", args, total_steps=args.total_steps,
                          eval_env=gym.make("CartPole-v1"))
        while run.env_steps < args.total_steps and not run.done:
            ...  # step the environments, learn
            run.record(env_steps, episodes, stats)  # steps so far, finished episodes, stats
            run.maybe_evaluate(agent.predict)       # on schedule
        result = run.finish(agent)

    Args:
        title: what is trained on what, for the log and the plot.
        args: the example's settings (a `RunArgs`, usually a subclass).
        total_steps: the env-step budget, for the progress bar.
        eval_env: the environment evaluations run in (None: no evaluation).
        window: episodes in the running mean that is compared to `target_return`.
        log_every: env steps between two writes of the training statistics.
        progress: show the progress bar.
    """

    def __init__(
        self,
        title: str,
        args: RunArgs,
        *,
        total_steps: int,
        eval_env: gym.Env | None = None,
        window: int = 10,
        log_every: int = 1000,
        progress: bool = True,
    ) -> None:
        self.title = title
        self.seed = args.seed
        self.logdir = args.logdir
        self.eval_every = args.eval_every
        self.eval_episodes = args.eval_episodes
        self.target_return = args.target_return
        if args.target_on not in TARGETS_ON:
            raise ValueError(f"target_on={args.target_on!r}: allowed {', '.join(TARGETS_ON)}")
        self.target_on = args.target_on
        self.stop_at_target = args.stop_at_target
        self.window = window
        self.log_every = log_every
        self.eval_env = eval_env
        if args.torch_threads:
            torch.set_num_threads(args.torch_threads)
        random.seed(self.seed)
        np.random.seed(self.seed)
        torch.manual_seed(self.seed)
        logger.set_dir(self.logdir)
        summary.set_dir(self.logdir)
        logger.info("%s: %s", title, args)

        self.env_steps = 0
        self.train_curve: list[tuple[int, float]] = []
        self.eval_curve: list[tuple[int, float]] = []
        self.reached_at: int | None = None
        self.reached_seconds: float | None = None
        self._recent: deque[float] = deque(maxlen=window)
        self._next_eval = self.eval_every
        self._next_log = 0
        self._start = time.perf_counter()
        self._bar = _progress_bar(total_steps, title) if progress else None

    def start(self) -> None:
        """Start the clock now: building networks and first imports are not training time.

        The training loops call it just before their first step; `reached_seconds` and
        `seconds` count from here (from construction when it is never called), and so do the
        progress bar's rate and time left (starting remote actors can take seconds).
        """
        self._start = time.perf_counter()
        if self._bar is not None:
            self._bar.reset()

    @property
    def done(self) -> bool:
        """True once the target was reached and `stop_at_target` asks to stop there."""
        return self.stop_at_target and self.reached_at is not None

    def mean_return(self) -> float | None:
        """The mean return of the last `window` training episodes (None before the first)."""
        return float(np.mean(self._recent)) if self._recent else None

    def record(self, env_steps: int, episodes: Iterable[Episode] = (), stats: Any = None) -> None:
        """Note the env-step count, the episodes finished since the last call, and learn stats.

        `stats` is the dataclass an algorithm's `learn` returned; its float fields are written
        as `train/<field>` at most every `log_every` env steps.
        """
        if self._bar is not None:
            self._bar.update(env_steps - self.env_steps)
        self.env_steps = env_steps
        for episode in episodes:
            self.train_curve.append((episode.env_step, episode.ret))
            self._recent.append(episode.ret)
            summary.add_scalar("rollout/episode_return", episode.ret, episode.env_step)
            summary.add_scalar("rollout/episode_length", episode.length, episode.env_step)
            mean = self.mean_return()
            if (
                self.reached_at is None
                and self.target_return is not None
                and self.target_on == "train"
                and len(self._recent) == self.window
                and mean >= self.target_return
            ):
                self.reached_at = episode.env_step
                self.reached_seconds = time.perf_counter() - self._start
                logger.info(
                    "mean return of the last %d episodes reached %.1f at env step %d (%.1f s)",
                    self.window,
                    mean,
                    episode.env_step,
                    self.reached_seconds,
                )
        if stats is not None and env_steps >= self._next_log:
            self._next_log = env_steps + self.log_every
            for field in dataclasses.fields(stats):
                value = getattr(stats, field.name)
                if isinstance(value, float | int) and not isinstance(value, bool):
                    summary.add_scalar(f"train/{field.name}", value, env_steps)
            summary.add_scalar("time/steps_per_second", self.steps_per_second(), env_steps)
            if self._bar is not None and self._recent:
                self._bar.set_postfix(ret=f"{self.mean_return():.1f}")

    def steps_per_second(self) -> float:
        """Env steps per wall second since the run started."""
        return self.env_steps / max(time.perf_counter() - self._start, 1e-9)

    def maybe_evaluate(self, policy: Callable[[np.ndarray], Any]) -> float | None:
        """Evaluate `policy` when `eval_every` more env steps have passed; return the mean."""
        if self.eval_env is None or not self.eval_every or self.env_steps < self._next_eval:
            return None
        self._next_eval = self.env_steps + self.eval_every
        mean = evaluate(self.eval_env, policy, self.eval_episodes, seed=self.eval_seed())
        self.record_evaluation(self.env_steps, mean)
        return mean

    def eval_seed(self) -> int | None:
        """The seed of the next evaluation's first reset: the first is seeded, later ones go on."""
        return self.seed + 10_000 if not self.eval_curve else None

    def record_evaluation(self, env_step: int, mean: float) -> None:
        """Note the mean return of an evaluation of the policy of `env_step`."""
        self.eval_curve.append((env_step, mean))
        summary.add_scalar("eval/mean_return", mean, env_step)
        logger.info("env step %d: evaluation mean return %.1f", env_step, mean)
        if (
            self.reached_at is None
            and self.target_return is not None
            and self.target_on == "eval"
            and mean >= self.target_return
        ):
            self.reached_at = env_step
            self.reached_seconds = time.perf_counter() - self._start
            logger.info(
                "evaluation mean return reached %.1f at env step %d (%.1f s)",
                mean,
                env_step,
                self.reached_seconds,
            )

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to continue this run: counters, curves, schedules, clock."""
        return {
            "env_steps": self.env_steps,
            "train_curve": list(self.train_curve),
            "eval_curve": list(self.eval_curve),
            "reached_at": self.reached_at,
            "reached_seconds": self.reached_seconds,
            "recent": list(self._recent),
            "next_eval": self._next_eval,
            "next_log": self._next_log,
            "seconds": time.perf_counter() - self._start,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from what `state_dict` returned; the clock goes on from its `seconds`."""
        self.env_steps = state["env_steps"]
        self.train_curve = list(state["train_curve"])
        self.eval_curve = list(state["eval_curve"])
        self.reached_at = state["reached_at"]
        self.reached_seconds = state["reached_seconds"]
        self._recent = deque(state["recent"], maxlen=self.window)
        self._next_eval = state["next_eval"]
        self._next_log = state["next_log"]
        self._start = time.perf_counter() - state["seconds"]

    def finish(self, agent: parl.Agent) -> RunResult:
        """Save the agent and the learning curve, flush the summary, and return the results."""
        if self._bar is not None:
            self._bar.close()
        seconds = time.perf_counter() - self._start
        agent.save(os.path.join(self.logdir, "agent.ckpt"))
        save_learning_curve(
            os.path.join(self.logdir, "learning_curve.png"),
            self.title,
            self.train_curve,
            self.eval_curve,
            window=self.window,
            target=self.target_return,
        )
        summary.flush()
        result = RunResult(
            env_steps=self.env_steps,
            episodes=len(self.train_curve),
            reached_at=self.reached_at,
            reached_seconds=_round(self.reached_seconds),
            final_mean_return=_round(self.mean_return()),
            best_eval_return=_round(max((r for _, r in self.eval_curve), default=None)),
            seconds=_round(seconds),
        )
        logger.info("done: %s; outputs in %s", result, self.logdir)
        return result


@dataclasses.dataclass
class OffPolicyState:
    """Where `train_off_policy` is: what a checkpoint needs to continue the loop exactly."""

    obs: Any
    """The observation the next step acts on."""
    counter: EpisodeCounter
    """Returns and lengths of the episodes under way."""
    step: int = 0
    """Env steps taken so far."""
    stats: Any = None
    """What the last update returned (None before the first)."""

    @classmethod
    def start(cls, env: gym.Env, seed: int) -> OffPolicyState:
        """A fresh start: `env` and its action space seeded with `seed`, and reset."""
        env.action_space.seed(seed)
        obs, _ = env.reset(seed=seed)
        return cls(obs=obs, counter=EpisodeCounter())


def train_off_policy(
    run: TrainingRun,
    env: gym.Env,
    agent: parl.Agent,
    memory: ReplayMemory,
    args: OffPolicyArgs,
    *,
    after_step: Callable[[int], None] | None = None,
    reward_fn: Callable[[float], float] | None = None,
    eval_policy: Callable[[np.ndarray], Any] | None = None,
    state: OffPolicyState | None = None,
) -> None:
    """Collect transitions into `memory` and learn from it, one environment step at a time.

    The first `args.learning_starts` steps take uniformly random actions; after that the
    agent's `sample` acts, and every `args.train_freq` steps the agent takes
    `args.gradient_steps` updates, `agent.learn(memory, args.batch_size)`. Transitions are
    stored with `terminal` set only on termination, so that time-limit truncations still
    bootstrap, and with the `truncated` flag that a `parl.utils.NStepAdder` in the memory's
    place needs. Stops after `args.total_steps` or when `run.done`.

    Args:
        run: the `TrainingRun` that records episodes, statistics and evaluations.
        env: a single gymnasium environment.
        agent: has `sample(obs)`, `predict(obs)` and `learn(memory, batch_size)`.
        memory: where transitions go (a replay memory or an `NStepAdder` in front of one).
        args: the schedule (`total_steps`, `learning_starts`, `train_freq`, `gradient_steps`,
            `batch_size`).
        after_step: called with the step count after each step (e.g. to sync a target network).
        reward_fn: maps each reward to the one stored (e.g. `np.sign`, Atari's reward
            clipping); episode returns are still counted from the environment's rewards.
        eval_policy: what evaluations run (default: `agent.predict`).
        state: where the loop is (None: a fresh start, resetting `env` with `run.seed`); it
            is updated in place step by step, so that a checkpoint taken between two steps
            can continue the same run.
    """
    if state is None:
        state = OffPolicyState.start(env, run.seed)
    run.start()
    for step in range(state.step + 1, args.total_steps + 1):
        obs = state.obs
        action = env.action_space.sample() if step <= args.learning_starts else agent.sample(obs)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        stored = reward if reward_fn is None else reward_fn(reward)
        memory.append(obs, action, stored, next_obs, terminated, truncated)
        state.obs = env.reset()[0] if terminated or truncated else next_obs
        state.step = step
        episodes = state.counter.step(reward, terminated or truncated)
        if step > args.learning_starts and step % args.train_freq == 0:
            for _ in range(args.gradient_steps):
                state.stats = agent.learn(memory, args.batch_size)
        if after_step is not None:
            after_step(step)
        run.record(step, episodes, state.stats)
        run.maybe_evaluate(agent.predict if eval_policy is None else eval_policy)
        if run.done:
            break


def train_continuous_control(
    args: OffPolicyArgs,
    title: str,
    make_algorithm: Callable[[int, int], parl.Algorithm],
) -> RunResult:
    """Train `DDPG`, `TD3` or `SAC` on `args.env_id` with a uniform replay memory.

    The environment's actions are rescaled to `[-1, 1]`; `make_algorithm(obs_dim, act_dim)`
    builds the algorithm; the agent is a `ContinuousAgent`; the loop is `train_off_policy`.
    Returns `TrainingRun.finish`'s results.
    """
    from parl_algos.agents import ContinuousAgent

    env, eval_env = make_rescaled_env(args.env_id), make_rescaled_env(args.env_id)
    run = TrainingRun(title, args, total_steps=args.total_steps, eval_env=eval_env)
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    agent = ContinuousAgent(make_algorithm(obs_dim, act_dim))
    memory = ReplayMemory(args.buffer_size, obs_dim, act_dim, seed=args.seed)
    train_off_policy(run, env, agent, memory, args)
    return run.finish(agent)


def train_on_policy(
    run: TrainingRun,
    collector: VectorCollector,
    agent: parl.Agent,
    args: OnPolicyArgs,
    *,
    before_learn: Callable[[int], None] | None = None,
) -> None:
    """Alternate collecting `args.n_steps` steps of every environment and one `agent.learn`.

    Args:
        run: the `TrainingRun` that records episodes, statistics and evaluations.
        collector: steps the environments with `agent.sample`.
        agent: has `sample(obs_batch)`, `predict(obs)` and `learn(trajectory)`.
        args: `n_steps` per environment between updates, and `total_steps`.
        before_learn: called with the env-step count before each update (e.g. to anneal).
    """
    run.start()
    while collector.env_steps < args.total_steps and not run.done:
        trajectory = collector.collect(args.n_steps, agent.sample)
        if before_learn is not None:
            before_learn(collector.env_steps)
        stats = agent.learn(trajectory)
        run.record(collector.env_steps, collector.pop_episodes(), stats)
        run.maybe_evaluate(agent.predict)


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 2)


def _progress_bar(total: int, title: str):
    try:
        from tqdm import tqdm
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError(
            "TrainingRun's progress bar needs tqdm: pip install 'parl-algos[examples]', "
            "or pass progress=False"
        ) from exc
    return tqdm(total=total, desc=title, unit="step", unit_scale=True, mininterval=1.0)

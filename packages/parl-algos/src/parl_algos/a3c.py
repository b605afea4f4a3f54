"""A3C: actors compute gradients on their own rollouts; the learner applies them as they come.

Mnih et al., "Asynchronous methods for deep reinforcement learning", ICML 2016,
https://arxiv.org/abs/1602.01783. Each actor holds a copy of the network, steps its own
environments for `n_steps`, computes the advantage actor-critic gradient of that rollout on its
copy and sends the gradient (not the experience) to the learner, which applies it with its
optimizer the moment it arrives, whichever actor it came from. Before a rollout an actor pulls
the learner's current weights (every `pull_every` rollouts), so a gradient is computed on
weights a few updates old: the asynchrony of the paper's Hogwild! threads, across processes.

- `A3C`: `A2C`'s loss, split into `compute_gradients` (actor) and `apply_gradients` (learner);
- `A3CActor`: environments, a copy of the agent, `gradients()` per rollout; `RemoteA3CActor`
  is it as a `@parl.remote_class` actor;
- `A3CLearner`: one thread per actor drives its calls (weight pulls, then rollouts) and hands
  the gradients to the learner's thread through a queue; iterating it applies them in order
  of arrival and yields an `A3CUpdate` each.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch

import parl
from parl_algos.a2c import A2C, A2CStats
from parl_algos.agents import ActorCriticAgent
from parl_algos.rollout import Episode, VectorCollector
from parl_algos.samplers import Replacements
from parl_remote import RemoteActorDiedError, RemoteError

logger = logging.getLogger(__name__)

__all__ = ["A3C", "A3CActor", "A3CLearner", "A3CRollout", "A3CUpdate", "RemoteA3CActor"]


class A3C(A2C):
    """Asynchronous advantage actor-critic: gradients computed by actors, applied by a learner.

    The loss is `A2C`'s (policy gradient with advantages, value regression, entropy bonus);
    `compute_gradients` leaves the optimizer alone and returns the clipped gradient as numpy
    arrays, one per parameter in `model.parameters()` order; `apply_gradients` steps the
    learner's optimizer (RMSprop, the paper's shared RMSProp) with such a gradient. `learn`
    does both at once, as `A2C.learn`. Mnih et al. 2016, https://arxiv.org/abs/1602.01783.

    It takes `A2C`'s arguments: the model (with `policy(obs)` and `value(obs)`), `lr`,
    `vf_coef`, `ent_coef`, `max_grad_norm` and RMSprop's settings.
    """

    def compute_gradients(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        advantage: torch.Tensor,
        value_target: torch.Tensor,
    ) -> tuple[list[np.ndarray], A2CStats]:
        """The gradient of the loss of a batch (clipped), as numpy arrays, and its statistics."""
        for p in self.model.parameters():
            p.grad = None
        stats = self.backward(obs, action, advantage, value_target)
        grads = [
            np.zeros(tuple(p.shape), np.float32)
            if p.grad is None
            else p.grad.detach().cpu().numpy()
            for p in self.model.parameters()
        ]
        return grads, stats

    def apply_gradients(self, grads: Sequence[np.ndarray]) -> None:
        """One optimizer step with a gradient from `compute_gradients` (any copy's)."""
        params = list(self.model.parameters())
        if len(grads) != len(params):
            raise ValueError(
                f"A3C.apply_gradients: {len(grads)} gradients for a model of {len(params)} "
                "parameters; pass what compute_gradients of the same model returned"
            )
        for p, g in zip(params, grads, strict=True):
            if tuple(g.shape) != tuple(p.shape):
                raise ValueError(
                    f"A3C.apply_gradients: a gradient of shape {tuple(g.shape)} for a "
                    f"parameter of shape {tuple(p.shape)}"
                )
            p.grad = torch.as_tensor(g, dtype=p.dtype, device=p.device)
        self.optimizer.step()


class A3CRollout(NamedTuple):
    """What one `A3CActor.gradients` call returns."""

    grads: list[np.ndarray]
    """The gradient of the rollout's loss, one array per parameter."""
    stats: A2CStats
    """The rollout's loss terms and gradient norm."""
    episodes: list[tuple[float, int]]
    """`(return, length)` of each episode finished during the rollout."""
    env_steps: int
    """Env steps of the rollout (summed over the environments)."""
    weights_version: int
    """The version of the weights the gradient was computed on."""


class A3CActor:
    """Environments and a copy of an `A3C` agent: one gradient per rollout.

    Args:
        env_fn: a zero-argument callable returning a `gymnasium.Env`.
        agent: an `ActorCriticAgent` driving an `A3C` (a copy of the learner's).
        num_envs: environments stepped together.
        n_steps: steps of every environment per rollout.
        seed: environment `i` is reset with `seed + i` first; actions are drawn from torch's
            generator, seeded with `seed` too.

    Torch runs on one thread in the actor's process (set when the actor is made).
    """

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        agent: ActorCriticAgent,
        num_envs: int = 4,
        n_steps: int = 5,
        seed: int | None = None,
    ) -> None:
        if not isinstance(agent.alg, A3C):
            raise TypeError(f"A3CActor needs an agent of A3C, got {type(agent.alg).__name__}")
        torch.set_num_threads(1)  # one core an actor: threads of its own only compete
        if seed is not None:
            torch.manual_seed(seed)
        self.agent = agent
        self.n_steps = n_steps
        envs = gym.vector.SyncVectorEnv(
            [env_fn] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
        self.collector = VectorCollector(envs, seed=seed)
        self.weights_version = 0

    def set_weights(self, weights: dict[str, np.ndarray], version: int) -> None:
        """Load the learner's weights (`version`: how many gradients it had applied)."""
        self.agent.set_weights(weights)
        self.weights_version = version

    def gradients(self) -> A3CRollout:
        """Collect one rollout with the current weights and return its gradient."""
        start = self.collector.env_steps
        trajectory = self.collector.collect(self.n_steps, self.agent.sample)
        b = self.agent.advantages(trajectory)
        grads, stats = self.agent.alg.compute_gradients(
            b.obs, b.action, b.advantage, b.value_target
        )
        episodes = [(e.ret, e.length) for e in self.collector.pop_episodes()]
        steps = self.collector.env_steps - start
        return A3CRollout(grads, stats, episodes, steps, self.weights_version)

    def close(self) -> None:
        """Close the environments."""
        self.collector.envs.close()


RemoteA3CActor = parl.remote_class(A3CActor)
"""`A3CActor` as a cluster actor (blocking calls: `A3CLearner` drives each from a thread)."""


@dataclass(frozen=True)
class A3CUpdate:
    """One gradient applied by `A3CLearner`."""

    actor: int
    """Which actor sent it."""
    stats: A2CStats
    """Its rollout's loss terms."""
    episodes: list[Episode]
    """Episodes its rollout finished, with the learner's env-step count at their end."""
    env_steps: int
    """Env steps of every actor so far, this rollout included."""
    staleness: int
    """Gradients the learner had applied since the weights it was computed on."""


_STOP = object()


class A3CLearner:
    """Applies the gradients of `actors` to `agent` in the order they arrive.

    One thread per actor makes its calls in turn: every `pull_every` rollouts it sends the
    learner's current weights (`set_weights`), then asks for the next gradient (`gradients`)
    and puts it in a queue. Iterating the learner takes each gradient from the queue, applies
    it (`A3C.apply_gradients`) and yields an `A3CUpdate`. Use it as a context manager, or call
    `close`: the threads stop after their call under way.

    Args:
        agent: the learner's `ActorCriticAgent` of an `A3C`.
        actors: `A3CActor`s, local or remote (`RemoteA3CActor`, blocking calls).
        pull_every: rollouts of an actor between two weight pulls (1: before every rollout).
        timeout: seconds to wait for the next gradient before raising TimeoutError (None:
            forever).
        replace: `replace(i, r)` makes actor `i` anew for the `r`-th time, for one that died
            (None: a dead actor's error is raised); the new one pulls the weights first, the
            lost rollout is dropped.
        max_restarts: the most replacements of one actor within 10 minutes; one more death
            raises.
    """

    def __init__(
        self,
        agent: ActorCriticAgent,
        actors: Sequence[Any],
        *,
        pull_every: int = 1,
        timeout: float | None = None,
        replace: Callable[[int, int], Any] | None = None,
        max_restarts: int = 3,
    ) -> None:
        if pull_every < 1:
            raise ValueError(f"A3CLearner: {pull_every=} must be at least 1")
        self.agent = agent
        self.actors = list(actors)
        self.pull_every = pull_every
        self.timeout = timeout
        self.version = 0
        self.env_steps = 0
        self.replace = replace
        self.max_restarts = max_restarts
        self._replacements = Replacements("A3CLearner: actor {i}", max_restarts)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=len(self.actors))
        self._threads = [
            threading.Thread(target=self._drive, args=(i,), name=f"a3c-actor-{i}", daemon=True)
            for i in range(len(self.actors))
        ]
        for thread in self._threads:
            thread.start()

    def _drive(self, i: int) -> None:
        rollouts = 0
        try:
            while not self._stop.is_set():
                try:
                    if rollouts % self.pull_every == 0:
                        with self._lock:
                            weights, version = self.agent.get_weights(), self.version
                        self.actors[i].set_weights(weights, version)
                    rollout = self.actors[i].gradients()
                except RemoteError as exc:
                    if self.replace is None or type(exc) not in (RemoteError, RemoteActorDiedError):
                        raise  # no replacing, or the actor's own code failed
                    self._replace(i, exc)
                    rollouts = 0  # the new actor pulls the weights first
                    continue
                rollouts += 1
                self._put((i, rollout))
        except BaseException as exc:  # handed to the learner's thread
            self._put((i, exc))

    @property
    def restarts(self) -> int:
        """Actors replaced so far."""
        return self._replacements.total

    def _replace(self, i: int, exc: BaseException) -> None:
        """Make actor `i` anew for one that died with `exc` (raise past `max_restarts`)."""
        assert self.replace is not None
        self.actors[i] = None  # its last handle: the actor and its slot are freed
        self.actors[i] = self._replacements.replace(i, exc, functools.partial(self.replace, i))

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self) -> Iterator[A3CUpdate]:
        while True:
            yield self.step()

    def step(self) -> A3CUpdate:
        """Apply the next gradient that arrives (blocks until one does)."""
        if self._stop.is_set():
            raise RuntimeError("A3CLearner: closed")
        try:
            i, rollout = self._queue.get(timeout=self.timeout)
        except queue.Empty:
            raise TimeoutError(f"A3CLearner: no gradient within {self.timeout} s") from None
        if isinstance(rollout, BaseException):
            self.close()
            raise rollout
        with self._lock:
            self.agent.alg.apply_gradients(rollout.grads)
            staleness = self.version - rollout.weights_version
            self.version += 1
        episodes = []
        self.env_steps += rollout.env_steps
        for ret, length in rollout.episodes:
            episodes.append(Episode(self.env_steps, ret, length))
        return A3CUpdate(i, rollout.stats, episodes, self.env_steps, staleness)

    def close(self) -> None:
        """Stop the threads (each after its call under way); calling it again does nothing."""
        self._stop.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=30)

    def __enter__(self) -> A3CLearner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

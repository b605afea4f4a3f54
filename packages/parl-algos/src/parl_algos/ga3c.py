"""GA3C: many environment workers, one batched predictor, and a trainer fed by a queue.

Babaeizadeh et al., "Reinforcement learning through asynchronous advantage actor-critic on a
GPU", ICLR 2017, https://arxiv.org/abs/1611.06256. The workers only step environments; the
actions of all of them are computed here, in one batched call a step (the paper's predictor),
by a `parl.samplers.CentralSampler`; its finished rollouts go into a queue that the trainer
empties, one A3C update a rollout, while the predictor goes on collecting with the weights of
the moment. A rollout may thus be a few updates older than the weights it trains (the paper's
policy lag).

- `GA3C`: the A3C loss of `A2C`, under the name of the architecture it belongs to;
- `GA3CLearner`: the sampler in a predictor thread, the queue, and the trainer's `step`.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from parl_algos.a2c import A2C, A2CStats
from parl_algos.agents import ActorCriticAgent
from parl_algos.rollout import Episode
from parl_algos.samplers import CentralSampler

__all__ = ["GA3C", "GA3CLearner", "GA3CUpdate"]


class GA3C(A2C):
    """GA3C's learner: A3C's loss on rollouts from a central, batched predictor.

    The loss and the update are `A2C`'s (policy gradient with advantages, value regression,
    entropy bonus, RMSprop); what makes GA3C is where the rollouts come from (`GA3CLearner`).
    Babaeizadeh et al., ICLR 2017, https://arxiv.org/abs/1611.06256.

    It takes `A2C`'s arguments: the model (with `policy(obs)` and `value(obs)`), `lr`,
    `vf_coef`, `ent_coef`, `max_grad_norm` and RMSprop's settings.
    """


@dataclass(frozen=True)
class GA3CUpdate:
    """One update of `GA3CLearner`'s trainer."""

    stats: A2CStats
    """The update's loss terms."""
    episodes: list[Episode]
    """Episodes finished in the rollout."""
    env_steps: int
    """Env steps collected until the end of the rollout (all workers)."""
    lag: int
    """Updates the trainer had made while the rollout was collected and queued."""


class _Predictor:
    """`agent.sample` under the trainer's lock: the weights never change halfway through."""

    def __init__(self, agent: ActorCriticAgent, lock: threading.Lock) -> None:
        self.agent, self.lock = agent, lock

    def sample(self, obs: np.ndarray) -> Any:
        with self.lock:
            return self.agent.sample(obs)


class GA3CLearner:
    """A `CentralSampler` collecting in a predictor thread, and a trainer fed by its queue.

    The predictor thread calls the sampler's `collect()` over and over (every step, one
    `agent.sample` on the observations of all workers) and puts each rollout in a queue of
    `queue_size`; `step()` takes the next one and makes one `agent.learn` from it. Sampling
    and learning take turns on the agent (a lock), so the workers step their environments
    while the trainer learns. Use it as a context manager, or call `close`.

    Args:
        agent: the `ActorCriticAgent` of a `GA3C` (or `A2C`).
        env_fn: a picklable zero-argument callable returning a `gymnasium.Env`.
        num_workers: environment worker actors.
        envs_per_worker: environments each worker steps.
        horizon: steps of every environment per rollout.
        seed: column `k` is reset with `seed + k` first (None: unseeded).
        address: the cluster (None: the current one, or a local one of `num_workers` slots).
        queue_size: rollouts waiting for the trainer at most (the predictor waits beyond).
        timeout: seconds `step` waits for a rollout before raising TimeoutError (None: forever).
        restart: replace a worker of the sampler that dies (`CentralSampler`'s `restart`).
        max_restarts: the most replacements of one worker within 10 minutes.
    """

    def __init__(
        self,
        agent: ActorCriticAgent,
        env_fn: Callable[[], gym.Env],
        *,
        num_workers: int = 2,
        envs_per_worker: int = 8,
        horizon: int = 5,
        seed: int | None = 0,
        address: str | None = None,
        queue_size: int = 2,
        timeout: float | None = None,
        restart: bool = False,
        max_restarts: int = 3,
    ) -> None:
        self.agent = agent
        self.timeout = timeout
        self.updates = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self.sampler = CentralSampler(
            env_fn,
            _Predictor(agent, self._lock),
            num_workers=num_workers,
            envs_per_worker=envs_per_worker,
            horizon=horizon,
            seed=seed,
            address=address,
            restart=restart,
            max_restarts=max_restarts,
        )
        self._thread = threading.Thread(target=self._predict, name="ga3c-predictor", daemon=True)
        self._thread.start()

    @property
    def restarts(self) -> int:
        """The sampler's workers replaced so far."""
        return self.sampler.restarts

    def _predict(self) -> None:
        try:
            while not self._stop.is_set():
                start = self.updates
                batch = self.sampler.collect()
                item = (batch, self.sampler.episodes(), self.sampler.env_steps, start)
                self._put(item)
        except BaseException as exc:  # handed to the trainer's thread
            self._put(exc)

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self) -> Iterator[GA3CUpdate]:
        while True:
            yield self.step()

    def step(self) -> GA3CUpdate:
        """Learn from the next rollout of the queue (blocks until one is there)."""
        if self._stop.is_set():
            raise RuntimeError("GA3CLearner: closed")
        try:
            item = self._queue.get(timeout=self.timeout)
        except queue.Empty:
            raise TimeoutError(f"GA3CLearner: no rollout within {self.timeout} s") from None
        if isinstance(item, BaseException):
            self.close()
            raise item
        batch, episodes, env_steps, start = item
        with self._lock:
            stats = self.agent.learn(batch.to_trajectory())
            lag = self.updates - start
            self.updates += 1
        return GA3CUpdate(stats, episodes, env_steps, lag)

    def close(self) -> None:
        """Stop the predictor (after its rollout under way) and close the sampler."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
        self.sampler.close()

    def __enter__(self) -> GA3CLearner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

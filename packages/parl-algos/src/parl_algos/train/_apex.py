"""The DQN family on remote actors: exploration chosen by the learner, and Ape-X's replay writes.

`parl-train` runs a DQN-family agent in `sync` and `async` modes with a `QActing` as the
policy copy of the samplers' workers. The learner's instance decides how every copy explores
and sends it with the weights, so that exploration follows the run, not each worker's own count:

- `sync`: one epsilon for every actor, the linear schedule of single mode read at the run's
  env-step count (uniformly random actions before `learning_starts`);
- `async` (Ape-X, Horgan et al., "Distributed prioritized experience replay", ICLR 2018,
  https://arxiv.org/abs/1803.00933): actor `i` of `N` keeps `eps_i = eps ** (1 + alpha * i /
  (N - 1))` for the whole run (`parl_algos.r2d2.apex_epsilons`), past the warm-up.

With noisy networks (Rainbow) the noise explores and epsilon is 0 after the warm-up.
Each copy returns, beside its actions, the Q-values it acted on (`q`) and its own id (`actor`,
drawn from the worker's seeded generator): the learner numbers the actors by the order their
first rollouts arrive and addresses each one's epsilon by that id.

`ReplayWriter` puts the samplers' trajectories into the learner's replay memory: one
`parl.utils.NStepAdder` per environment column when `n_step > 1`, and with a prioritized
memory the initial priority of each one-step transition, `|r + gamma * max_a Q(s', a) - Q(s,
a)|`, from the Q-values the actor computed with its copy (the learner's network gives
`max_a Q(s', a)` only where the actor never acted on `s'`: the last step of a rollout and the
final observation of a truncated episode), as Ape-X's actors do.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from parl.utils import NStepAdder, PrioritizedReplayMemory
from parl_algos._common import to_tensor
from parl_algos.r2d2 import apex_epsilons
from parl_algos.rollout import Trajectory

__all__ = ["QActing", "ReplayWriter"]


class QActing:
    """A DQN-family agent's policy copy on the samplers' workers, epsilon-greedy on its Q-values.

    On the learner, `env_steps` (set by the training loop) and the actors seen so far decide
    the epsilons that `get_weights` sends with the model's weights; on a worker, `set_weights`
    loads both and `sample` acts. See the module's docstring for the schedules.

    Args:
        agent: a `DQNAgent` (its `eps_start`, `eps_end` and `eps_decay_steps` are the `sync`
            schedule, counted from `learning_starts`).
        mode: `"sync"` (one scheduled epsilon) or `"async"` (Ape-X's per-actor epsilons).
        actors: how many actors (the `N` of Ape-X's epsilons).
        learning_starts: env steps (all actors together) of uniformly random actions.
        noisy: the network explores with its noise (epsilon 0 after the warm-up).
        apex_eps: Ape-X's base epsilon.
        apex_alpha: Ape-X's exponent.
    """

    def __init__(
        self,
        agent: Any,
        *,
        mode: str,
        actors: int,
        learning_starts: int,
        noisy: bool = False,
        apex_eps: float = 0.4,
        apex_alpha: float = 7.0,
    ) -> None:
        if mode not in ("sync", "async"):
            raise ValueError(f"QActing: {mode=} must be 'sync' or 'async'")
        self.agent = agent
        self.mode = mode
        self.learning_starts = learning_starts
        self.noisy = noisy
        self.epsilons = [float(e) for e in apex_epsilons(actors, apex_eps, apex_alpha)]
        self.env_steps = 0
        """Learner: the run's env steps, which the `sync` schedule reads."""
        self.epsilon = 1.0
        """Worker: the exploration rate this copy acts with."""
        self.actors: dict[int, int] = {}
        """Learner: actor id -> actor number, in the order their first rollouts came."""
        self._id: int | None = None
        self._rng: np.random.Generator | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A copy draws its id and generator where it acts (after the worker seeded it).
        return {**self.__dict__, "_id": None, "_rng": None}

    def _own(self) -> tuple[int, np.random.Generator]:
        if self._id is None or self._rng is None:
            self._id = random.getrandbits(62) + 1
            self._rng = np.random.default_rng(random.getrandbits(64))
        return self._id, self._rng

    def scheduled_epsilon(self) -> float:
        """The `sync` schedule's epsilon at `env_steps` (1 during the warm-up)."""
        if self.env_steps < self.learning_starts:
            return 1.0
        if self.noisy:
            return 0.0
        a = self.agent
        frac = min((self.env_steps - self.learning_starts) / a.eps_decay_steps, 1.0)
        return a.eps_start + frac * (a.eps_end - a.eps_start)

    def actor_epsilons(self) -> dict[int, float]:
        """`async`, past the warm-up: the epsilon of each actor seen so far, by its id."""
        if self.mode != "async" or self.env_steps < self.learning_starts:
            return {}
        n = len(self.epsilons)
        return {i: 0.0 if self.noisy else self.epsilons[k % n] for i, k in self.actors.items()}

    def observe(self, trajectory: Trajectory) -> None:
        """Learner: number the actors whose rollouts arrive for the first time."""
        for actor in np.unique(trajectory.extras.get("actor", ())).tolist():
            self.actors.setdefault(int(actor), len(self.actors))

    @torch.no_grad()
    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Worker: epsilon-greedy actions for a batch of observations, the Q-values and the id."""
        actor, rng = self._own()
        alg = self.agent.alg
        q = alg.predict(to_tensor(obs, self.agent.device)).cpu().numpy()
        actions = q.argmax(axis=1)
        explore = rng.random(len(obs)) < self.epsilon
        actions[explore] = rng.integers(q.shape[1], size=int(explore.sum()))
        return actions, {"q": q.astype(np.float32), "actor": np.full(len(obs), actor, np.int64)}

    def get_weights(self) -> dict[str, Any]:
        """Learner: the model's weights and the epsilons every copy is to act with."""
        epsilon = self.scheduled_epsilon() if self.mode == "sync" else 1.0
        if self.mode == "async" and self.env_steps >= self.learning_starts:
            epsilon = 0.0 if self.noisy else self.epsilons[0]  # an actor not seen yet
        return {
            "model": self.agent.get_weights(),
            "epsilon": epsilon,
            "actors": self.actor_epsilons(),
        }

    def set_weights(self, weights: dict[str, Any]) -> None:
        """Worker: load the weights and this copy's epsilon."""
        actor, _ = self._own()
        self.agent.set_weights(weights["model"])
        self.epsilon = weights["actors"].get(actor, weights["epsilon"])


class ReplayWriter:
    """Writes sampler trajectories into a replay memory, column by column, with priorities.

    Args:
        memory: the replay memory (a `PrioritizedReplayMemory` gets initial priorities when
            the trajectories carry the actors' Q-values `q` and `n_step` is 1).
        n_step: steps of each stored transition (an `NStepAdder` per column above 1).
        gamma: the discount of the n-step returns and of the priorities' TD errors.
        bootstrap_q: the learner's Q-values `(B, n_actions)` of a batch of observations, for
            the priorities' bootstraps the actors did not compute (None: no priorities).
    """

    def __init__(
        self,
        memory: Any,
        *,
        n_step: int = 1,
        gamma: float = 0.99,
        bootstrap_q: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.memory = memory
        self.n_step = n_step
        self.gamma = gamma
        self.bootstrap_q = bootstrap_q
        self.written = 0
        """Transitions written into the memory so far (its next position, modulo its size)."""
        self._adders: dict[tuple[int, int], NStepAdder] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "bootstrap_q": None}  # the learner's network is the agent's

    def store(self, t: Trajectory) -> None:
        """Write every step of `t` into the memory.

        `terminal` is set on termination only, and where an episode was truncated `next_obs`
        is its true last observation.
        """
        horizon, width = t.reward.shape
        next_obs = np.array(t.obs[1:], copy=True)
        for (i, k), final in zip(t.final_index.tolist(), t.final_obs, strict=True):
            next_obs[i, k] = final
        priorities = self._priorities(t, next_obs)
        actors = t.extras.get("actor")
        indices, written = [], []
        for k in range(width):
            column = (0 if actors is None else int(actors[0, k]), k)
            for i in range(horizon):
                step = (t.obs[i, k], t.action[i, k], t.reward[i, k], next_obs[i, k])
                if self.n_step > 1:
                    adder = self._adders.get(column)
                    if adder is None:
                        adder = self._adders[column] = NStepAdder(
                            self.memory, self.n_step, self.gamma
                        )
                    adder.append(*step, bool(t.terminated[i, k]), bool(t.truncated[i, k]))
                    continue
                self.memory.append(*step, t.terminated[i, k])
                indices.append(self.written % self.memory.max_size)
                written.append(priorities[i, k] if priorities is not None else 0.0)
                self.written += 1
        if priorities is not None and indices:
            self.memory.update_priorities(indices, written)

    def _priorities(self, t: Trajectory, next_obs: np.ndarray) -> np.ndarray | None:
        """`(T, N)` one-step TD errors under the actors' Q-values (None: not computed here)."""
        q = t.extras.get("q")
        if (
            q is None
            or self.n_step > 1
            or self.bootstrap_q is None
            or not isinstance(self.memory, PrioritizedReplayMemory)
        ):
            return None
        horizon, width = t.reward.shape
        next_max = np.zeros((horizon, width), dtype=np.float64)
        next_max[:-1] = q[1:].max(axis=-1)  # the actor acted on obs[t + 1]
        own = np.zeros((horizon, width), dtype=bool)
        own[-1] = True
        own[tuple(t.final_index.T)] = True  # truncated: next_obs is the final observation
        if own.any():
            next_max[own] = self.bootstrap_q(next_obs[own]).max(axis=-1)
        q_sa = np.take_along_axis(q, t.action[..., None].astype(np.int64), axis=-1)[..., 0]
        target = t.reward + self.gamma * (1.0 - t.terminated) * next_max
        return np.abs(target - q_sa)

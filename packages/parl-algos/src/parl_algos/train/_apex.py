"""The DQN family on remote actors: exploration chosen by the learner, and Ape-X's replay writes.

`parl-train` runs a DQN-family agent in `sync` and `async` modes with a `QActing` as the
policy copy of the samplers' workers. The learner's instance decides how every copy explores
and sends it with the weights, so that exploration follows the run, not each worker's own count:

- `sync`: one epsilon for every actor, the linear schedule of single mode read at the run's
  env-step count (uniformly random actions before `learning_starts`);
- `async` (Ape-X, Horgan et al., "Distributed prioritized experience replay", ICLR 2018,
  https://arxiv.org/abs/1803.00933): actor `i` of `N` keeps `eps_i = eps ** (1 + alpha * i /
  (N - 1))` for the whole run (`parl_algos.r2d2.apex_epsilons`), past the warm-up.

With noisy networks (Rainbow) the noise explores and epsilon is 0 after the warm-up; each
copy draws new noise for every batch of actions (the learner's draws stay the learner's). With
`act_with_noise=False` a copy acts on the layers' means and epsilon explores (the schedules
above, as without noisy layers).
Each copy returns, beside its actions, the Q-values it acted on (`q`; a distributional
network's outputs too, `out`) and its own id (`actor`, drawn from the worker's seeded
generator): the learner numbers the actors by the order their first rollouts arrive and
addresses each one's epsilon by that id.

`ReplayWriter` puts the samplers' trajectories into the learner's replay memory: one
`parl.utils.NStepAdder` per environment column, and with a prioritized memory the initial
priority of each n-step transition as the learner computes it (`DQN.priority`), from the
outputs the actor computed with its copy: `|G + gamma^k * max_a Q(s', a) - Q(s, a)|` with
`G` the n-step return (`k = n`, or the fewer steps left at the end of a truncated episode),
or for a distributional agent the loss of `out(s, a)` against the projected target from
`out(s')` (the learner's network gives `out(s')` only where the actor never acted on `s'`: the
last step of a rollout and the final observation of an episode), as Ape-X's actors do.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from parl.utils import NStepAdder, PrioritizedReplayMemory
from parl_algos._common import to_tensor
from parl_algos.nets import noise_free, reset_noise
from parl_algos.r2d2 import apex_epsilons
from parl_algos.rollout import Trajectory

__all__ = ["QActing", "ReplayWriter", "td_priority"]


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
        act_with_noise: a noisy network acts with noise, drawn afresh for every batch of
            actions; False: on its means (give `noisy=False` then: epsilon explores).
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
        act_with_noise: bool = True,
    ) -> None:
        if mode not in ("sync", "async"):
            raise ValueError(f"QActing: {mode=} must be 'sync' or 'async'")
        self.agent = agent
        self.mode = mode
        self.learning_starts = learning_starts
        self.noisy = noisy
        self.act_with_noise = act_with_noise
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
        """Worker: epsilon-greedy actions for a batch of observations, the Q-values and the id.

        A distributional network's outputs (C51's logits, QR-DQN's quantiles) come too, as
        `out`: the initial priorities are its loss.
        """
        actor, rng = self._own()
        alg = self.agent.alg
        x = to_tensor(obs, self.agent.device)
        if not alg.noisy:
            out = alg.model(x)
        elif self.act_with_noise:
            reset_noise(alg.model)
            out = alg.model(x)
        else:
            with noise_free(alg.model):
                out = alg.model(x)
        q = alg.q_values(out).cpu().numpy()
        actions = q.argmax(axis=1)
        explore = rng.random(len(obs)) < self.epsilon
        actions[explore] = rng.integers(q.shape[1], size=int(explore.sum()))
        extras = {"q": q.astype(np.float32), "actor": np.full(len(obs), actor, np.int64)}
        if alg.distributional is not None:
            extras["out"] = out.cpu().numpy().astype(np.float32)
        return actions, extras

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


class _Written:
    """The memory an `NStepAdder` of `ReplayWriter` writes into: it keeps what comes."""

    def __init__(self) -> None:
        self.transitions: list[tuple[Any, ...]] = []

    def append(self, *transition: Any, discount: float) -> None:
        self.transitions.append((*transition, discount))

    def drain(self) -> list[tuple[Any, ...]]:
        out, self.transitions = self.transitions, []
        return out


def td_priority(
    out: np.ndarray, ret: np.ndarray, discount: np.ndarray, next_out: np.ndarray
) -> np.ndarray:
    """`|ret + discount * max_a next_out[a] - out|`: the TD errors of Q-values.

    Args:
        out: `(B,)` `Q(s, a)` of each transition's first step.
        ret: `(B,)` the transitions' (n-step) returns.
        discount: `(B,)` the bootstrap's discount, `gamma^k (1 - terminal)` (`k` the steps the
            transition spans).
        next_out: `(B, n_actions)` the Q-values of the observations they bootstrap from.
    """
    return np.abs(ret + discount * next_out.max(axis=-1) - out)


class ReplayWriter:
    """Writes sampler trajectories into a replay memory, column by column, with priorities.

    With a `PrioritizedReplayMemory` and trajectories that carry the actors' network outputs
    (`extras["out"]`, else their Q-values `extras["q"]`), each transition gets its initial
    priority from them as Ape-X's actors compute it: `priority(out(s, a), G, gamma^k (1 -
    terminal), out(s'))`, `G` its n-step return, `s'` the observation it bootstraps from and `k`
    the steps between them (`n`, fewer at the end of a truncated episode).
    The actor acted on `s'` unless `s'` is the last of a rollout or the final observation of a
    truncated episode: there `bootstrap` (the learner's network) gives `out(s')`. An n-step
    transition's window can span two rollouts: the first step's output waits with it.

    Args:
        memory: the replay memory.
        n_step: steps of each stored transition (an `NStepAdder` per column).
        gamma: the discount of the n-step returns and of the priorities.
        bootstrap_q: the learner's network outputs of a batch of observations (the shape of
            the actors' `out`), for the bootstraps the actors did not compute (None: no
            priorities; the memory gives its largest).
        priority: `(out(s, a), G, discount, out(s')) -> (B,)` priorities, numpy in and out
            (default: `td_priority`; the learner's `DQN.priority` for distributional ones).
        reward_fn: maps each reward to the one stored (Atari's `np.sign`; None: as it is);
            the episodes' returns, counted by the samplers, stay the environment's.
    """

    def __init__(
        self,
        memory: Any,
        *,
        n_step: int = 1,
        gamma: float = 0.99,
        bootstrap_q: Callable[[np.ndarray], np.ndarray] | None = None,
        priority: Callable[..., np.ndarray] | None = None,
        reward_fn: Callable[[Any], Any] | None = None,
    ) -> None:
        self.memory = memory
        self.reward_fn = reward_fn
        self.n_step = n_step
        self.gamma = gamma
        self.bootstrap_q = bootstrap_q
        self.priority = priority
        self.written = 0
        """Transitions written into the memory so far (its next position, modulo its size)."""
        self._adders: dict[tuple[int, int], NStepAdder] = {}
        self._firsts: dict[tuple[int, int], deque[np.ndarray | None]] = {}
        self._sink = _Written()

    def __getstate__(self) -> dict[str, Any]:
        # The learner's network is the agent's: the runner sets these again.
        return {**self.__dict__, "bootstrap_q": None, "priority": None}

    def drop_pending(self) -> None:
        """Forget the steps of the episodes under way (a resumed run's workers start afresh)."""
        self._adders.clear()
        self._firsts.clear()

    def store(self, t: Trajectory) -> None:
        """Write every step of `t` into the memory.

        `terminal` is set on termination only, and where an episode was truncated `next_obs`
        is its true last observation.
        """
        horizon, width = t.reward.shape
        next_obs = np.array(t.obs[1:], copy=True)
        for (i, k), final in zip(t.final_index.tolist(), t.final_obs, strict=True):
            next_obs[i, k] = final
        outputs = self._outputs(t, next_obs)
        reward = t.reward if self.reward_fn is None else self.reward_fn(t.reward)
        actors = t.extras.get("actor")
        rows: list[tuple[int, np.ndarray, float, float, np.ndarray]] = []
        for k in range(width):
            column = (0 if actors is None else int(actors[0, k]), k)
            adder = self._adders.get(column)
            if adder is None:
                adder = self._adders[column] = NStepAdder(self._sink, self.n_step, self.gamma)
            firsts = self._firsts.setdefault(column, deque())
            for i in range(horizon):
                firsts.append(None if outputs is None else outputs[0][i, k])
                adder.append(
                    t.obs[i, k],
                    t.action[i, k],
                    reward[i, k],
                    next_obs[i, k],
                    bool(t.terminated[i, k]),
                    bool(t.truncated[i, k]),
                )
                for obs, act, ret, nxt, terminal, discount in self._sink.drain():
                    self.memory.append(obs, act, ret, nxt, terminal, discount=discount)
                    first = firsts.popleft()
                    if first is not None and outputs is not None:
                        position = self.written % self.memory.max_size
                        bootstrap = 0.0 if terminal else discount
                        rows.append((position, first, ret, bootstrap, outputs[1][i, k]))
                    self.written += 1
        if rows:
            positions, out, ret, bootstrap, next_out = zip(*rows, strict=True)
            discount = np.asarray(bootstrap, np.float64)
            priority = self.priority or td_priority
            priorities = priority(
                np.stack(out), np.asarray(ret, np.float64), discount, np.stack(next_out)
            )
            self.memory.update_priorities(list(positions), np.asarray(priorities).tolist())

    def _outputs(self, t: Trajectory, next_obs: np.ndarray) -> tuple[np.ndarray, ...] | None:
        """`(T, N, ...)` outputs at each step's action and at its next observation, or None."""
        out = t.extras.get("out", t.extras.get("q"))
        if (
            out is None
            or self.bootstrap_q is None
            or not isinstance(self.memory, PrioritizedReplayMemory)
        ):
            return None
        horizon, width = t.reward.shape
        next_out = np.zeros_like(out)
        next_out[:-1] = out[1:]  # the actor acted on obs[t + 1]
        own = np.zeros((horizon, width), dtype=bool)
        own[-1] = True
        own[tuple(t.final_index.T)] = True  # an episode's end: next_obs is its final observation
        next_out[own] = self.bootstrap_q(next_obs[own])
        action = t.action.astype(np.int64).reshape(horizon, width, 1, *([1] * (out.ndim - 3)))
        taken = np.take_along_axis(out, action, axis=2)[:, :, 0]
        return taken, next_out

"""Sequences of steps for recurrent agents: `SequenceAdder` builds them, a memory replays them.

R2D2 (Kapturowski et al., ICLR 2019, https://openreview.net/forum?id=r1lyTjAqYX) learns from
fixed-length sequences that carry the recurrent state the actor had at their first step. A
sequence is `burn_in + learn_len` steps: the first `burn_in` only warm the recurrent state up,
the `learn_len` after them are learned from; consecutive sequences of an episode advance by
`learn_len` steps, so each step is learned in exactly one sequence and the burn-in of a
sequence is the end of the one before. Sequences never cross an episode boundary: the first
one of an episode is padded in front (the state holds through the padding, at the episode's
zero state), the last one behind (`mask` 0).

- `SequenceAdder` folds one environment's steps into such `SequenceRecord`s;
- `SequenceReplayMemory` holds them and samples them in proportion to a priority per sequence
  (Schaul et al.'s proportional prioritization over sequences), in `SequenceBatch`es.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from parl.utils._prioritized_replay_memory import SumTree

__all__ = ["SequenceAdder", "SequenceBatch", "SequenceRecord", "SequenceReplayMemory"]


class SequenceRecord(NamedTuple):
    """One stored sequence of `T = burn_in + learn_len` steps of one episode."""

    obs: np.ndarray
    """`(T + 1, *obs_shape)`: `obs[t]` is where `action[t]` was chosen; row `T` (or the row after
    the last real step) is the observation after the last step."""
    action: np.ndarray
    """`(T,)` int64 actions."""
    reward: np.ndarray
    """`(T,)` float32 rewards (0 on padding)."""
    terminal: np.ndarray
    """`(T,)` float32, 1 on the step that reached a terminal state (not on time limits)."""
    mask: np.ndarray
    """`(T,)` float32, 1 on real steps, 0 on padding (in front of an episode, after its end)."""
    state: np.ndarray
    """`(state_size,)` float32: the actor's recurrent state before the first real step."""


class SequenceBatch(NamedTuple):
    """A minibatch of sequences, batch-major, with what prioritization needs."""

    obs: np.ndarray
    """`(B, T + 1, *obs_shape)` observations."""
    action: np.ndarray
    """`(B, T)` int64 actions."""
    reward: np.ndarray
    """`(B, T)` float32 rewards."""
    terminal: np.ndarray
    """`(B, T)` float32 terminal flags."""
    mask: np.ndarray
    """`(B, T)` float32: 1 on real steps."""
    state: np.ndarray
    """`(B, state_size)` float32 recurrent states at the first real step."""
    weights: np.ndarray
    """`(B,)` float32 importance-sampling weights, at most 1 (all 1 without prioritization)."""
    indices: np.ndarray
    """`(B,)` int64 slots of the sequences: pass them back to `update_priorities`."""


class SequenceAdder:
    """Folds the steps of one environment into `SequenceRecord`s of fixed length.

    Call `append` with every step, in order, and the recurrent state the actor had *before*
    choosing the step's action. A record is returned each time `learn_len` new steps are
    complete, and at the end of an episode when it has steps not yet in a record.

    Args:
        burn_in: steps in front of each sequence that only warm the recurrent state up.
        learn_len: steps of each sequence that are learned from (and its stride).
        obs_shape: shape of one observation.
        state_size: length of the recurrent state vector.
        obs_dtype: dtype of stored observations.
    """

    def __init__(
        self,
        burn_in: int,
        learn_len: int,
        obs_shape: int | tuple[int, ...],
        state_size: int,
        obs_dtype: np.dtype | str = np.float32,
    ) -> None:
        if burn_in < 0 or learn_len < 1:
            raise ValueError(f"SequenceAdder: {burn_in=} must be >= 0 and {learn_len=} at least 1")
        self.burn_in = int(burn_in)
        self.learn_len = int(learn_len)
        self.obs_shape = (obs_shape,) if isinstance(obs_shape, int) else tuple(obs_shape)
        self.state_size = int(state_size)
        self.obs_dtype = np.dtype(obs_dtype)
        self._reset()

    @property
    def seq_len(self) -> int:
        """`T = burn_in + learn_len`, the steps of a record."""
        return self.burn_in + self.learn_len

    def _reset(self) -> None:
        self._steps: list[tuple[np.ndarray, int, float, np.ndarray]] = []
        self._pos = 0  # episode step of self._steps[0]
        self._learn_start = 0  # episode step where the current sequence's learning part starts

    def append(
        self,
        obs: np.ndarray,
        action: int,
        reward: float,
        next_obs: np.ndarray,
        terminal: bool,
        truncated: bool,
        state: np.ndarray,
    ) -> SequenceRecord | None:
        """Take one step; return the record it completes, if any.

        Args:
            obs: the observation the action was chosen from.
            action: the action taken.
            reward: the reward of the step.
            next_obs: the observation after the step (the final one at an episode's end).
            terminal: the step reached a terminal state.
            truncated: a time limit ended the episode here.
            state: `(state_size,)` the recurrent state before the action was chosen.
        """
        state = np.array(state, dtype=np.float32).reshape(-1)  # copies: callers reuse arrays
        if state.shape != (self.state_size,):
            raise ValueError(
                f"SequenceAdder.append: state has {state.size} values, expected {self.state_size}"
            )
        self._steps.append((np.array(obs, self.obs_dtype), int(action), float(reward), state))
        end = self._pos + len(self._steps)  # episode steps taken so far
        ended = bool(terminal or truncated)
        if end - self._learn_start < self.learn_len and not ended:
            return None
        record = self._record(next_obs, bool(terminal))
        if ended:
            self._reset()
        else:
            self._learn_start += self.learn_len
            first = max(0, self._learn_start - self.burn_in)
            del self._steps[: first - self._pos]
            self._pos = first
        return record

    def _record(self, next_obs: np.ndarray, terminal: bool) -> SequenceRecord:
        t_len = self.seq_len
        pad = self.burn_in - (self._learn_start - self._pos)  # padding in front
        n = len(self._steps)
        obs = np.zeros((t_len + 1, *self.obs_shape), self.obs_dtype)
        action = np.zeros(t_len, np.int64)
        reward = np.zeros(t_len, np.float32)
        term = np.zeros(t_len, np.float32)
        mask = np.zeros(t_len, np.float32)
        for i, (o, a, r, _) in enumerate(self._steps):
            obs[pad + i], action[pad + i], reward[pad + i] = o, a, r
        obs[pad + n] = next_obs
        mask[pad : pad + n] = 1.0
        term[pad + n - 1] = float(terminal)
        return SequenceRecord(obs, action, reward, term, mask, self._steps[0][3].copy())


class SequenceReplayMemory:
    """A ring buffer of sequences, sampled in proportion to `priority ** alpha`.

    New sequences get the priority given to `append` (as R2D2's actors compute it) or else the
    largest seen so far. `sample_batch` draws a stratified batch and returns the normalised
    importance-sampling weights `(N P(i))^-beta / max_j (...)` with the slots; the learner writes
    its new priorities back with `update_priorities`. `alpha=0` samples uniformly.

    Args:
        max_size: sequences it holds; the oldest is overwritten after that.
        seq_len: `T`, steps of a sequence.
        obs_shape: shape of one observation.
        state_size: length of the recurrent state vector.
        alpha: prioritization exponent, 0 (uniform) to 1.
        beta: importance-sampling exponent at the start, 0 to 1.
        beta_steps: `sample_batch` calls over which beta rises linearly to 1 (None: it stays).
        eps: added to every priority, so that no sequence is never sampled again.
        obs_dtype: dtype of stored observations.
        seed: seed of the memory's random generator.
    """

    def __init__(
        self,
        max_size: int,
        seq_len: int,
        obs_shape: int | tuple[int, ...],
        state_size: int,
        *,
        alpha: float = 0.9,
        beta: float = 0.6,
        beta_steps: int | None = None,
        eps: float = 1e-6,
        obs_dtype: np.dtype | str = np.float32,
        seed: int | None = None,
    ) -> None:
        if max_size < 1 or seq_len < 1 or state_size < 1:
            raise ValueError(
                f"SequenceReplayMemory: {max_size=}, {seq_len=} and {state_size=} must be positive"
            )
        if alpha < 0 or not 0.0 <= beta <= 1.0 or eps <= 0:
            raise ValueError(
                f"SequenceReplayMemory: {alpha=} must be >= 0, {beta=} in [0, 1], {eps=} > 0"
            )
        obs_shape = (obs_shape,) if isinstance(obs_shape, int) else tuple(obs_shape)
        self.max_size, self.seq_len = int(max_size), int(seq_len)
        self.alpha, self.beta, self.beta_steps, self.eps = (
            float(alpha),
            float(beta),
            beta_steps,
            eps,
        )
        self.sample_steps = 0
        n, t = self.max_size, self.seq_len
        self.obs = np.zeros((n, t + 1, *obs_shape), obs_dtype)
        self.action = np.zeros((n, t), np.int64)
        self.reward = np.zeros((n, t), np.float32)
        self.terminal = np.zeros((n, t), np.float32)
        self.mask = np.zeros((n, t), np.float32)
        self.state = np.zeros((n, int(state_size)), np.float32)
        self._priority = np.zeros(n, np.float64)
        self._tree = SumTree(n)
        self._max_priority = 1.0
        self._next = 0
        self._size = 0
        self._rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self._size

    def append(self, record: SequenceRecord, priority: float | None = None) -> int:
        """Store one sequence (with its priority, default the largest seen); return its slot."""
        i = self._next
        if record.action.shape != (self.seq_len,):
            raise ValueError(
                f"SequenceReplayMemory.append: a sequence of {record.action.shape} steps; "
                f"this memory holds {self.seq_len}"
            )
        self.obs[i], self.action[i], self.reward[i] = record.obs, record.action, record.reward
        self.terminal[i], self.mask[i], self.state[i] = record.terminal, record.mask, record.state
        self._next = (i + 1) % self.max_size
        self._size = min(self._size + 1, self.max_size)
        p = self._max_priority if priority is None else abs(float(priority)) + self.eps
        self._set_priorities(np.array([i]), np.array([p]))
        self._max_priority = max(self._max_priority, p)
        return i

    def current_beta(self) -> float:
        """The importance-sampling exponent of the next `sample_batch` call."""
        if self.beta_steps is None:
            return self.beta
        return self.beta + min(self.sample_steps / self.beta_steps, 1.0) * (1.0 - self.beta)

    def sample_batch(self, batch_size: int) -> SequenceBatch:
        """Draw `batch_size` sequences by priority (stratified over the priority mass)."""
        if self._size == 0:
            raise ValueError("SequenceReplayMemory.sample_batch: the memory is empty")
        beta = self.current_beta()
        self.sample_steps += 1
        total = self._tree.total()
        seg = total / batch_size
        mass = np.arange(batch_size) * seg + self._rng.random(batch_size) * seg
        idx = self._tree.find_prefix_sum(np.minimum(mass, np.nextafter(total, 0)))
        idx = np.minimum(idx, self._size - 1)
        prob = self._tree[idx] / total
        weights = (prob / (self._tree.min() / total)) ** -beta
        return SequenceBatch(
            self.obs[idx],
            self.action[idx],
            self.reward[idx],
            self.terminal[idx],
            self.mask[idx],
            self.state[idx],
            weights.astype(np.float32),
            idx.astype(np.int64),
        )

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of the sequences at `indices` (R2D2's mixed |TD| of each)."""
        indices = np.asarray(indices, dtype=np.int64)
        priorities = np.abs(np.asarray(priorities, dtype=np.float64)) + self.eps
        if indices.shape != priorities.shape:
            raise ValueError(
                f"update_priorities: {indices.shape=} and {priorities.shape=} must match"
            )
        if indices.size and (indices.min() < 0 or indices.max() >= self._size):
            raise IndexError(f"update_priorities: indices must lie in [0, {self._size})")
        self._set_priorities(indices, priorities)
        self._max_priority = max(self._max_priority, float(priorities.max(initial=0.0)))

    def priorities(self) -> np.ndarray:
        """The priorities (before the `alpha` exponent) of the stored sequences."""
        return self._priority[: self._size].copy()

    def _set_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        self._priority[indices] = priorities
        self._tree.update(indices, priorities**self.alpha)

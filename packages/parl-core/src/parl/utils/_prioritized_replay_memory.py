"""`parl.utils.PrioritizedReplayMemory`: a replay memory sampled in proportion to priorities.

Prioritized experience replay (Schaul et al., 2016, https://arxiv.org/abs/1511.05952), the
proportional variant: transition `i` is drawn with probability `P(i) = p_i^alpha / sum_k p_k^alpha`
and its loss is weighted by `w_i = (N * P(i))^-beta / max_j w_j` (`j` over the batch, or the
whole memory) to correct the bias. The sums and minimum of the priorities live in two
array-backed binary trees, so sampling a batch and updating its priorities cost
`O(batch * log N)` numpy operations. A sample is a `PrioritizedBatch`: a `Batch`'s fields plus
the weights and the slots whose priorities the learner writes back (a
`PrioritizedNStepBatch`, with the bootstrap discounts too, from a memory an `NStepAdder` feeds).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from parl.utils._replay_memory import ReplayMemory

__all__ = ["PrioritizedBatch", "PrioritizedNStepBatch", "PrioritizedReplayMemory", "SumTree"]


class PrioritizedBatch(NamedTuple):
    """A minibatch from a `PrioritizedReplayMemory`: a `Batch` plus what prioritization needs.

    It unpacks as `obs, act, reward, next_obs, terminal, weights, indices = batch`.
    """

    obs: np.ndarray
    """`(B, *obs_shape)` observations."""
    act: np.ndarray
    """`(B, *act_shape)` actions (int64 `(B,)` for discrete ones)."""
    reward: np.ndarray
    """`(B,)` float32 rewards."""
    next_obs: np.ndarray
    """`(B, *obs_shape)` observations after the actions."""
    terminal: np.ndarray
    """`(B,)` float32, 1 where `next_obs` is a terminal state."""
    weights: np.ndarray
    """`(B,)` float32 importance-sampling weights `w_i`, at most 1: multiply each loss by them."""
    indices: np.ndarray
    """`(B,)` int64 slots of the transitions: pass them back to `update_priorities`."""

    @property
    def discount(self) -> None:
        """Bootstrap discounts: none stored (the learner's own, `gamma^n_step`, for every row)."""
        return None


class PrioritizedNStepBatch(NamedTuple):
    """A `PrioritizedBatch` from a memory that stores each transition's bootstrap discount.

    Its first seven fields are a `PrioritizedBatch`'s; `discount` is an `NStepBatch`'s.
    """

    obs: np.ndarray
    """`(B, *obs_shape)` observations."""
    act: np.ndarray
    """`(B, *act_shape)` actions (int64 `(B,)` for discrete ones)."""
    reward: np.ndarray
    """`(B,)` float32 (n-step) returns."""
    next_obs: np.ndarray
    """`(B, *obs_shape)` the observations the transitions bootstrap from."""
    terminal: np.ndarray
    """`(B,)` float32, 1 where `next_obs` is a terminal state."""
    weights: np.ndarray
    """`(B,)` float32 importance-sampling weights `w_i`, at most 1: multiply each loss by them."""
    indices: np.ndarray
    """`(B,)` int64 slots of the transitions: pass them back to `update_priorities`."""
    discount: np.ndarray
    """`(B,)` float32 `gamma^k`, `k` the steps each transition spans (`n`, or fewer at the end of
    a truncated episode)."""


class SumTree:
    """A complete binary tree over `capacity` leaves holding each node's sum and minimum.

    Leaves start at zero (sum) and +inf (minimum). Node `k` has children `2k` and `2k + 1`; the
    root is node 1 and the leaves are nodes `size .. 2 * size - 1`, `size` the smallest power of
    two not below `capacity`.

    Args:
        capacity: how many leaves (priorities) the tree holds.
    """

    def __init__(self, capacity: int) -> None:
        if int(capacity) <= 0:
            raise ValueError(f"SumTree: {capacity=} must be positive")
        self.capacity = int(capacity)
        self._depth = (self.capacity - 1).bit_length()
        self._size = 1 << self._depth
        self._sum = np.zeros(2 * self._size, dtype=np.float64)
        self._min = np.full(2 * self._size, np.inf, dtype=np.float64)

    def total(self) -> float:
        """Return the sum of every leaf."""
        return float(self._sum[1])

    def min(self) -> float:
        """Return the smallest leaf that was ever set (+inf while none was)."""
        return float(self._min[1])

    def __getitem__(self, index: ArrayLike) -> np.ndarray:
        return np.asarray(self._sum[self._size + np.asarray(index, dtype=np.int64)])

    def update(self, index: ArrayLike, value: ArrayLike) -> None:
        """Set the leaves `index` (an int or an array) to `value` (non-negative, finite).

        With repeated indices the last value wins, as with numpy assignment.
        """
        index = np.atleast_1d(np.asarray(index, dtype=np.int64))
        value = np.broadcast_to(np.asarray(value, dtype=np.float64), index.shape)
        if index.size and (index.min() < 0 or index.max() >= self.capacity):
            raise IndexError(f"SumTree.update: indices must lie in [0, {self.capacity})")
        if not np.all(np.isfinite(value)) or np.any(value < 0):
            raise ValueError("SumTree.update: values must be finite and non-negative")
        node = index + self._size
        self._sum[node] = value
        self._min[node] = value
        for _ in range(self._depth):  # recompute each changed ancestor, one level at a time
            node = np.unique(node >> 1)
            left, right = 2 * node, 2 * node + 1
            self._sum[node] = self._sum[left] + self._sum[right]
            self._min[node] = np.minimum(self._min[left], self._min[right])

    def find_prefix_sum(self, mass: ArrayLike) -> np.ndarray:
        """Return, for each value in `mass`, the first leaf whose running sum exceeds it.

        `mass` holds values in `[0, total())`; the answer for `m` is the leaf `i` with
        `sum(leaves[:i]) <= m < sum(leaves[:i + 1])`, so each leaf is found with probability
        proportional to its value when `m` is uniform.
        """
        mass = np.array(mass, dtype=np.float64, copy=True)
        node = np.ones(mass.shape, dtype=np.int64)
        for _ in range(self._depth):
            left = 2 * node
            left_sum = self._sum[left]
            go_right = mass >= left_sum
            mass = np.where(go_right, mass - left_sum, mass)
            node = np.where(go_right, left + 1, left)
        # Rounding can push a draw onto an empty leaf past the last written one: clamp it.
        return np.minimum(node - self._size, self.capacity - 1)


class PrioritizedReplayMemory(ReplayMemory):
    """A `ReplayMemory` that samples transitions in proportion to `priority ** alpha`.

    New transitions get the largest priority seen so far, so each is replayed at least once
    soon. `sample_batch` returns a `PrioritizedBatch`, with importance-sampling weights and the
    sampled indices; after computing the TD errors, pass the indices and the errors to
    `update_priorities`.

    Args:
        max_size: how many transitions it holds; the oldest is overwritten after that.
        obs_dim: shape of one observation (an int or a tuple).
        act_dim: shape of one action; 0 for a discrete action (stored as one int64).
        alpha: how much prioritization is used, 0 (uniform) to 1 (fully proportional).
        beta: importance-sampling exponent, 0 (no correction) to 1 (full correction) at the
            start.
        beta_steps: `sample_batch` calls over which beta rises linearly from `beta` to 1, as
            the paper anneals it (None: beta stays; a caller may still pass `beta=` per batch).
        eps: added to every priority so that no transition is never sampled again.
        weight_norm: what the importance-sampling weights are divided by so that none exceeds
            1: `"batch"`, the largest weight in the batch (as Dopamine and Tianshou do), or
            `"memory"`, the weight of the least likely transition in the whole memory (the
            PER paper's `max_i w_i` read over all `N`). With `"memory"` the loss's scale
            follows the smallest priority stored, which a single well-fitted transition moves
            (Rainbow on LunarLander: the mean weight slid from 0.5 to 0.07 over 20k updates,
            by steps of 2-3x); with `"batch"` every batch's largest weight is 1.
        stratified: draw each batch stratified (True, the PER paper's and Dopamine's: the
            priority mass is cut into `batch_size` equal segments and one transition is drawn
            from each) or as `batch_size` independent draws over the whole mass (False, as
            Tianshou's; a batch may then hold the same high-priority transition twice).
        obs_dtype: dtype of stored observations.
        seed: seed of the buffer's own random generator, for reproducible sampling.
    """

    weight_norm = "memory"  # memories pickled before the option existed normalised so
    stratified = True  # and drew stratified batches

    def __init__(
        self,
        max_size: int,
        obs_dim: int | tuple[int, ...],
        act_dim: int | tuple[int, ...],
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_steps: int | None = None,
        eps: float = 1e-6,
        weight_norm: str = "batch",
        stratified: bool = True,
        obs_dtype: DTypeLike = np.float32,
        seed: int | None = None,
    ) -> None:
        super().__init__(max_size, obs_dim, act_dim, obs_dtype=obs_dtype, seed=seed)
        if alpha < 0:
            raise ValueError(f"PrioritizedReplayMemory: {alpha=} must be non-negative")
        _check_beta(beta)
        if eps <= 0:
            raise ValueError(f"PrioritizedReplayMemory: {eps=} must be positive")
        if beta_steps is not None and beta_steps <= 0:
            raise ValueError(f"PrioritizedReplayMemory: {beta_steps=} must be positive or None")
        if weight_norm not in ("memory", "batch"):
            raise ValueError(f"PrioritizedReplayMemory: {weight_norm=} must be 'memory' or 'batch'")
        self.weight_norm = weight_norm
        self.stratified = bool(stratified)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.beta_steps = beta_steps
        self.sample_steps = 0
        self.eps = float(eps)
        self._tree = SumTree(self.max_size)
        self._priority = np.zeros(self.max_size, dtype=np.float64)
        self._max_priority = 1.0

    def append(
        self,
        obs: ArrayLike,
        act: ArrayLike,
        reward: float,
        next_obs: ArrayLike,
        terminal: bool | float,
        truncated: bool = False,
        discount: float | None = None,
    ) -> None:
        """Store one transition with the largest priority seen so far (see `ReplayMemory`)."""
        pos = self._curr_pos
        super().append(obs, act, reward, next_obs, terminal, truncated, discount)
        self._set_priorities(pos, self._max_priority)

    def current_beta(self) -> float:
        """The importance-sampling exponent of the next `sample_batch` call."""
        if self.beta_steps is None:
            return self.beta
        frac = min(self.sample_steps / self.beta_steps, 1.0)
        return self.beta + frac * (1.0 - self.beta)

    # A richer batch than the base class's: its fields plus weights and indices.
    def sample_batch(  # type: ignore[override]
        self, batch_size: int, beta: float | None = None
    ) -> PrioritizedBatch | PrioritizedNStepBatch:
        """Return a `PrioritizedBatch` of `batch_size` transitions (`PrioritizedNStepBatch`).

        By default the batch is stratified: the total priority mass is cut into `batch_size`
        equal segments and one transition is drawn from each (see `stratified`). `weights`
        (float32) are the normalised importance-sampling weights, at most 1; `indices` go back
        to `update_priorities`. A memory that stores bootstrap discounts returns a
        `PrioritizedNStepBatch`, which carries them.

        Args:
            batch_size: how many transitions to draw.
            beta: the importance-sampling exponent for this batch (default: `current_beta()`).
        """
        if self._curr_size == 0:
            raise ValueError("PrioritizedReplayMemory.sample_batch: the memory is empty")
        beta = self.current_beta() if beta is None else _check_beta(beta)
        self.sample_steps += 1
        batch_size = int(batch_size)
        total = self._tree.total()
        if self.stratified:
            bounds = np.arange(batch_size, dtype=np.float64) * (total / batch_size)
            mass = bounds + self._rng.random(batch_size) * (total / batch_size)
        else:
            mass = self._rng.random(batch_size) * total
        idx = self._tree.find_prefix_sum(np.minimum(mass, np.nextafter(total, 0)))
        idx = np.minimum(idx, self._curr_size - 1)
        prob = self._tree[idx] / total
        # (N P(i))^-beta / max_j (N P(j))^-beta: the max where P is least.
        min_prob = prob.min() if self.weight_norm == "batch" else self._tree.min() / total
        weights = (prob / min_prob) ** -beta
        batch = PrioritizedBatch(
            self.obs[idx],
            self.act[idx],
            self.reward[idx],
            self.next_obs[idx],
            self.terminal[idx],
            weights.astype(np.float32),
            idx.astype(np.int64),
        )
        if self.discount is None:
            return batch
        return PrioritizedNStepBatch(*batch, discount=self.discount[idx])

    def update_priorities(self, indices: ArrayLike, priorities: ArrayLike) -> None:
        """Set the priorities of the transitions at `indices` (usually `|TD error|`)."""
        priorities = np.abs(np.asarray(priorities, dtype=np.float64)) + self.eps
        indices = np.asarray(indices, dtype=np.int64)
        if indices.shape != priorities.shape:
            raise ValueError(
                f"update_priorities: {indices.shape=} and {priorities.shape=} must match"
            )
        if indices.size and (indices.min() < 0 or indices.max() >= self._curr_size):
            raise IndexError(
                f"update_priorities: indices must lie in [0, {self._curr_size}), the stored "
                "transitions; pass the indices that sample_batch returned"
            )
        self._set_priorities(indices, priorities)
        self._max_priority = max(self._max_priority, float(priorities.max(initial=0.0)))

    def priorities(self) -> np.ndarray:
        """Return the priorities (`p_i`, before the `alpha` exponent) of the stored transitions."""
        return self._priority[: self._curr_size].copy()

    def _set_priorities(self, indices: ArrayLike, priorities: ArrayLike) -> None:
        slots = np.asarray(indices, dtype=np.int64)
        values = np.asarray(priorities, dtype=np.float64)
        self._priority[slots] = values
        self._tree.update(slots, values**self.alpha)

    def load(self, pathname: str | os.PathLike[str]) -> None:
        """Replace the contents with those saved by `save` (see `ReplayMemory.load`).

        Priorities are not saved: every loaded transition gets the largest priority seen by this
        memory, as new transitions do, and is soon replayed and re-prioritized.
        """
        super().load(pathname)
        self._tree = SumTree(self.max_size)
        self._priority[:] = 0.0
        if self._curr_size:
            self._set_priorities(np.arange(self._curr_size), self._max_priority)


def _check_beta(beta: float) -> float:
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"PrioritizedReplayMemory: {beta=} must be in [0, 1]")
    return float(beta)

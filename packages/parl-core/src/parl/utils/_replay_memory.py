"""`parl.utils.ReplayMemory`: a ring buffer of transitions in preallocated numpy arrays.

Off-policy algorithms (DQN, DDPG, TD3, SAC) store `(obs, act, reward, next_obs, terminal)` and
learn from uniformly sampled minibatches, each a `Batch`. Memory is allocated once; appending
overwrites the oldest transition when full; sampling only ever returns written slots. A memory
fed by a `parl.utils.NStepAdder` also stores each transition's bootstrap discount (`gamma^k`,
`k` the steps it spans, fewer than `n` at the end of a truncated episode) and samples
`NStepBatch`es, which carry it.
"""

from __future__ import annotations

import os
import tempfile
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

__all__ = ["Batch", "NStepBatch", "ReplayMemory"]

_FIELDS = ("obs", "act", "reward", "next_obs", "terminal")


def _shape(dim: int | tuple[int, ...], name: str) -> tuple[int, ...]:
    shape = (dim,) if isinstance(dim, int | np.integer) else tuple(dim)
    if any(int(d) < 0 for d in shape):
        raise ValueError(f"ReplayMemory: {name}={dim!r} must not be negative")
    return tuple(int(d) for d in shape)


class Batch(NamedTuple):
    """A minibatch of transitions from a `ReplayMemory`, one row per transition.

    It unpacks as PARL's five arrays, `obs, act, reward, next_obs, terminal = batch`.
    `weights` and `indices` are None here; a `PrioritizedBatch` carries them under the same
    names, so that a learner reads either kind of batch the same way.
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

    @property
    def weights(self) -> None:
        """Importance-sampling weights: none for a uniform sample (every weight is 1)."""
        return None

    @property
    def indices(self) -> None:
        """Slots of the sampled transitions: only a prioritized memory needs them back."""
        return None

    @property
    def discount(self) -> None:
        """Bootstrap discounts: none stored (the learner's own, `gamma^n_step`, for every row)."""
        return None


class NStepBatch(NamedTuple):
    """A `Batch` from a memory that stores each transition's bootstrap discount.

    Its first five fields are a `Batch`'s (`obs, act, reward, next_obs, terminal = batch[:5]`);
    `discount` is what the bootstrap from `next_obs` is multiplied by, before `1 - terminal`.
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
    discount: np.ndarray
    """`(B,)` float32 `gamma^k`, `k` the steps each transition spans (`n`, or fewer at the end of
    a truncated episode)."""

    @property
    def weights(self) -> None:
        """Importance-sampling weights: none for a uniform sample (every weight is 1)."""
        return None

    @property
    def indices(self) -> None:
        """Slots of the sampled transitions: only a prioritized memory needs them back."""
        return None


class ReplayMemory:
    """A fixed-size buffer of transitions, sampled uniformly.

    Args:
        max_size: how many transitions it holds; the oldest is overwritten after that.
        obs_dim: shape of one observation (an int or a tuple).
        act_dim: shape of one action; 0 for a discrete action (stored as one int64).
        obs_dtype: dtype of stored observations (uint8 keeps Atari frames small).
        seed: seed of the buffer's own random generator, for reproducible sampling.
    """

    discount: np.ndarray | None = None
    """`(max_size,)` float32 bootstrap discounts, allocated by the first `append` that gives one
    (None while no transition carries one; memories pickled before discounts were stored)."""

    def __init__(
        self,
        max_size: int,
        obs_dim: int | tuple[int, ...],
        act_dim: int | tuple[int, ...],
        *,
        obs_dtype: DTypeLike = np.float32,
        seed: int | None = None,
    ) -> None:
        if int(max_size) <= 0:
            raise ValueError(f"ReplayMemory: {max_size=} must be positive")
        self.max_size = int(max_size)
        self.obs_shape = _shape(obs_dim, "obs_dim")
        act_shape = _shape(act_dim, "act_dim")
        discrete = act_shape == (0,)
        self.act_shape = () if discrete else act_shape
        self.obs = np.zeros((self.max_size, *self.obs_shape), dtype=obs_dtype)
        self.next_obs = np.zeros_like(self.obs)
        self.act = np.zeros(
            (self.max_size, *self.act_shape), dtype=np.int64 if discrete else np.float32
        )
        self.reward = np.zeros((self.max_size,), dtype=np.float32)
        self.terminal = np.zeros((self.max_size,), dtype=np.float32)
        self._curr_size = 0
        self._curr_pos = 0
        self._rng = np.random.default_rng(seed)

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
        """Store one transition.

        `terminal` is true only when the episode *terminated* (the MDP reached an end state);
        for a time-limit truncation store `terminal=False`, so that learning still bootstraps
        from `next_obs`. `truncated` changes nothing for a one-step transition; it is taken so
        that a memory and an `NStepAdder` accept the same calls. `discount` is the bootstrap's
        discount of this transition (`gamma^k` for one spanning `k` steps, as an `NStepAdder`
        gives it): either every transition of a memory has one or none has.
        """
        pos = self._curr_pos
        self._store_discount(pos, discount)
        self.obs[pos] = obs
        self.act[pos] = act
        self.reward[pos] = reward
        self.next_obs[pos] = next_obs
        self.terminal[pos] = terminal
        self._curr_pos = (pos + 1) % self.max_size
        self._curr_size = min(self._curr_size + 1, self.max_size)

    def _store_discount(self, pos: int, discount: float | None) -> None:
        if (discount is None) != (self.discount is None) and self._curr_size:
            has = "no discounts" if self.discount is None else "a discount for every transition"
            raise ValueError(
                f"{type(self).__name__}.append: this memory holds {has}; got {discount=}. "
                "Feed a memory through an NStepAdder for all of its transitions or for none"
            )
        if discount is None:
            return
        if self.discount is None:
            self.discount = np.ones((self.max_size,), dtype=np.float32)
        self.discount[pos] = discount

    def sample_batch(self, batch_size: int) -> Batch | NStepBatch:
        """Return a `Batch` of `batch_size` random transitions (an `NStepBatch` with discounts).

        Indices are drawn with replacement from the transitions written so far.
        """
        if self._curr_size == 0:
            raise ValueError("ReplayMemory.sample_batch: the memory is empty; append first")
        idx = self._rng.integers(0, self._curr_size, size=int(batch_size))
        batch = Batch(
            self.obs[idx], self.act[idx], self.reward[idx], self.next_obs[idx], self.terminal[idx]
        )
        if self.discount is None:
            return batch
        return NStepBatch(*batch, discount=self.discount[idx])

    def size(self) -> int:
        """Return how many transitions are stored."""
        return self._curr_size

    def __len__(self) -> int:
        return self._curr_size

    def save(self, pathname: str | os.PathLike[str]) -> None:
        """Write the stored transitions to a `.npz` file, atomically."""
        pathname = os.fspath(pathname)
        if not pathname.endswith(".npz"):
            pathname += ".npz"
        n = self._curr_size
        arrays = {name: getattr(self, name)[:n] for name in _FIELDS}
        if self.discount is not None:
            arrays["discount"] = self.discount[:n]
        directory = os.path.dirname(os.path.abspath(pathname))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".parl-", suffix=".npz", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, curr_pos=self._curr_pos, max_size=self.max_size, **arrays)
            os.replace(tmp, pathname)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def load(self, pathname: str | os.PathLike[str]) -> None:
        """Replace the contents with those saved by `save`.

        With the same `max_size` the buffer is restored exactly (same next slot to overwrite).
        With a different one, the most recent transitions that fit are kept, oldest first.
        """
        pathname = os.fspath(pathname)
        if not os.path.exists(pathname) and os.path.exists(pathname + ".npz"):
            pathname += ".npz"
        with np.load(pathname, allow_pickle=False) as data:
            missing = [name for name in (*_FIELDS, "curr_pos", "max_size") if name not in data]
            if missing:
                raise ValueError(f"ReplayMemory.load: {pathname!r} lacks {missing}")
            arrays = {name: data[name] for name in _FIELDS}
            if "discount" in data:
                arrays["discount"] = data["discount"]
            saved_pos, saved_max = int(data["curr_pos"]), int(data["max_size"])
        n = len(arrays["obs"])
        for name, array in arrays.items():
            expected = () if name == "discount" else getattr(self, name).shape[1:]
            if array.shape != (n, *expected):
                raise ValueError(
                    f"ReplayMemory.load: {name!r} in {pathname!r} has shape {array.shape}, "
                    f"this memory stores {(n, *expected)}"
                )
        has_discount = "discount" in arrays
        self.discount = np.ones((self.max_size,), dtype=np.float32) if has_discount else None
        if saved_max == self.max_size:
            for name, array in arrays.items():
                getattr(self, name)[:n] = array
            self._curr_size, self._curr_pos = n, saved_pos % self.max_size
            return
        # Chronological order: a full ring buffer's oldest transition sits at curr_pos.
        order = np.roll(np.arange(n), -saved_pos) if n == saved_max else np.arange(n)
        keep = order[-self.max_size :]
        for name, array in arrays.items():
            getattr(self, name)[: len(keep)] = array[keep]
        self._curr_size = len(keep)
        self._curr_pos = len(keep) % self.max_size

"""`parl.utils.OfflineDataset`: a fixed set of transitions for offline RL (CQL, IQL, BC).

A dataset holds the six arrays `(obs, action, reward, next_obs, terminated, truncated)`, one row
a transition. It comes from a plain `.npz` file of those six arrays (`load` / `save`), from a
`ReplayMemory` that was filled by some policy (`from_replay_memory`), by running a policy in an
environment (`collect`), or from a `minari` dataset when minari is installed (`from_minari`).
Learning draws uniform minibatches with `sample_batch`, which returns the same named `Batch`
a replay memory's consumer reads, so an agent learns from either without knowing which it
got. Numpy only: no torch here.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from parl.utils._replay_memory import Batch

__all__ = ["OfflineDataset"]

FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def _error(source: str, message: str) -> ValueError:
    return ValueError(f"OfflineDataset{source}: {message}")


def _as_flag(name: str, array: np.ndarray, source: str) -> np.ndarray:
    """`terminated`/`truncated` as bool: bool arrays, or numbers that are all 0 or 1."""
    if array.dtype == np.bool_:
        return array
    if not (np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
        raise _error(source, f"{name!r} has dtype {array.dtype}; expected bool (or 0/1 numbers)")
    if not np.isin(array, (0, 1)).all():
        bad = array[~np.isin(array, (0, 1))][:3]
        raise _error(source, f"{name!r} must hold only 0 and 1, found {bad.tolist()}")
    return array.astype(bool)


def _validate(arrays: dict[str, Any], source: str) -> dict[str, np.ndarray]:
    """Check names, lengths, shapes and dtypes; return the arrays in their stored dtypes."""
    missing = [name for name in FIELDS if name not in arrays]
    unexpected = sorted(set(arrays) - set(FIELDS))
    if missing or unexpected:
        raise _error(
            source,
            f"expected the arrays {list(FIELDS)}; missing {missing}, unexpected {unexpected}",
        )
    out = {name: np.asarray(arrays[name]) for name in FIELDS}
    n = len(out["obs"]) if out["obs"].ndim else 0
    if n == 0:
        raise _error(source, "'obs' holds no transitions")
    lengths = {name: (len(a) if a.ndim else None) for name, a in out.items()}
    if any(length != n for length in lengths.values()):
        raise _error(source, f"the arrays differ in length: {lengths}")
    for name in ("reward", "terminated", "truncated"):
        if out[name].shape != (n,):
            raise _error(source, f"{name!r} has shape {out[name].shape}; expected ({n},)")
    if out["next_obs"].shape != out["obs"].shape:
        raise _error(
            source,
            f"'next_obs' has shape {out['next_obs'].shape}, 'obs' {out['obs'].shape}; "
            "they must agree",
        )
    for name in ("obs", "next_obs", "action", "reward"):
        dtype = out[name].dtype
        if not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)):
            raise _error(source, f"{name!r} has dtype {dtype}; expected real numbers")
        if np.issubdtype(dtype, np.floating) and not np.isfinite(out[name]).all():
            raise _error(source, f"{name!r} holds non-finite values (nan or inf)")
    for name in ("obs", "next_obs"):
        if np.issubdtype(out[name].dtype, np.floating):
            out[name] = out[name].astype(np.float32, copy=False)
    action = out["action"]
    out["action"] = action.astype(
        np.int64 if np.issubdtype(action.dtype, np.integer) else np.float32, copy=False
    )
    out["reward"] = out["reward"].astype(np.float32, copy=False)
    out["terminated"] = _as_flag("terminated", out["terminated"], source)
    out["truncated"] = _as_flag("truncated", out["truncated"], source)
    return out


class OfflineDataset:
    """A fixed dataset of transitions, sampled uniformly in minibatches.

    Args:
        obs: `(n, *obs_shape)` observations (float, or integers such as uint8 frames).
        action: `(n, *act_shape)` actions: floats for continuous ones, integers for discrete.
        reward: `(n,)` rewards.
        next_obs: `(n, *obs_shape)` observations after each action. Where an episode was
            truncated, the last real observation (not the one after a reset).
        terminated: `(n,)` bool: the transition ended the episode in a terminal state.
        truncated: `(n,)` bool: the episode was cut (time limit) after this transition.
        seed: seed of the dataset's own random generator (used when `sample_batch` is given none).

    Raises:
        ValueError: naming the array that is missing, of the wrong length, shape or dtype, or
            holding non-finite values.
    """

    def __init__(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        *,
        seed: int | None = None,
    ) -> None:
        arrays = _validate(
            {
                "obs": obs,
                "action": action,
                "reward": reward,
                "next_obs": next_obs,
                "terminated": terminated,
                "truncated": truncated,
            },
            "",
        )
        self.obs: np.ndarray = arrays["obs"]
        self.action: np.ndarray = arrays["action"]
        self.reward: np.ndarray = arrays["reward"]
        self.next_obs: np.ndarray = arrays["next_obs"]
        self.terminated: np.ndarray = arrays["terminated"]
        self.truncated: np.ndarray = arrays["truncated"]
        self._rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return len(self.obs)

    def size(self) -> int:
        """Return how many transitions the dataset holds (as `ReplayMemory.size`)."""
        return len(self.obs)

    def __repr__(self) -> str:
        return (
            f"OfflineDataset({len(self)} transitions, obs {self.obs.shape[1:]} "
            f"{self.obs.dtype}, action {self.action.shape[1:]} {self.action.dtype}, "
            f"{self.num_episodes()} episodes)"
        )

    # -- sampling ---------------------------------------------------------------------------

    def sample_batch(self, batch_size: int, rng: np.random.Generator | None = None) -> Batch:
        """Return a `Batch` of `batch_size` transitions drawn uniformly with replacement.

        Args:
            batch_size: transitions in the batch.
            rng: the generator that draws the indices (default: the dataset's own, seeded by
                the constructor's `seed`).
        """
        if int(batch_size) <= 0:
            raise ValueError(f"OfflineDataset.sample_batch: {batch_size=} must be positive")
        idx = (self._rng if rng is None else rng).integers(0, len(self), size=int(batch_size))
        return Batch(
            self.obs[idx],
            self.action[idx],
            self.reward[idx],
            self.next_obs[idx],
            self.terminated[idx].astype(np.float32),
        )

    # -- statistics -------------------------------------------------------------------------

    def episode_ends(self) -> np.ndarray:
        """Return the indices of the last transition of each episode (terminated or truncated).

        Transitions after the last end form an unfinished episode and are not counted.
        """
        return np.flatnonzero(self.terminated | self.truncated)

    def num_episodes(self) -> int:
        """Return how many finished episodes the dataset holds."""
        return len(self.episode_ends())

    def episode_returns(self) -> np.ndarray:
        """Return the undiscounted return of each finished episode, in order (float64)."""
        ends = self.episode_ends()
        if len(ends) == 0:
            return np.zeros(0)
        cumulative = np.concatenate([[0.0], np.cumsum(self.reward, dtype=np.float64)])
        starts = np.concatenate([[0], ends[:-1] + 1])
        returns: np.ndarray = cumulative[ends + 1] - cumulative[starts]
        return returns

    def obs_mean_std(self, eps: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
        """Return the per-feature mean and standard deviation of `obs` (float32), to normalise.

        `eps` is added to the standard deviation so that constant features divide safely.
        """
        obs = self.obs.astype(np.float64)
        return obs.mean(0).astype(np.float32), (obs.std(0) + eps).astype(np.float32)

    # -- files ------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the six arrays to a `.npz` file (suffix added if absent), atomically."""
        path = os.fspath(path)
        if not path.endswith(".npz"):
            path += ".npz"
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".parl-", suffix=".npz", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez_compressed(f, **{name: getattr(self, name) for name in FIELDS})
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, seed: int | None = None) -> OfflineDataset:
        """Read a `.npz` of the arrays `obs, action, reward, next_obs, terminated, truncated`.

        Raises:
            FileNotFoundError: there is no such file.
            ValueError: the file is not a `.npz` of those arrays, or they do not agree (the
                message names what is wrong).
        """
        path = os.fspath(path)
        if not os.path.exists(path) and os.path.exists(path + ".npz"):
            path += ".npz"
        try:
            data = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"OfflineDataset.load: {path!r} is not a readable .npz: {exc}"
            ) from exc
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError(f"OfflineDataset.load: {path!r} holds one array, not a .npz")
        with data:
            try:
                arrays = {name: data[name] for name in data.files}
            except ValueError as exc:  # an object array, which would need unpickling
                raise ValueError(f"OfflineDataset.load: {path!r}: {exc}") from exc
        _validate(arrays, f".load({path!r})")
        return cls(**arrays, seed=seed)

    # -- other sources ----------------------------------------------------------------------

    @classmethod
    def from_replay_memory(cls, memory: Any, *, seed: int | None = None) -> OfflineDataset:
        """Copy the transitions of a `parl.utils.ReplayMemory`, oldest first.

        A replay memory stores only `terminal` (termination). Episode ends are recovered where
        a transition's `next_obs` is not the next transition's `obs`; those that did not
        terminate are marked `truncated`, and so is the most recent transition.
        """
        n = len(memory)
        if n == 0:
            raise ValueError("OfflineDataset.from_replay_memory: the memory is empty")
        # A full ring buffer's oldest transition sits at the next slot to overwrite.
        order = np.arange(n)
        if n == memory.max_size:
            order = np.roll(order, -memory._curr_pos)
        obs, next_obs = memory.obs[order], memory.next_obs[order]
        terminated = memory.terminal[order].astype(bool)
        continues = np.zeros(n, dtype=bool)
        continues[:-1] = np.all((next_obs[:-1] == obs[1:]).reshape(n - 1, -1), axis=1)
        truncated = ~continues & ~terminated
        return cls(
            obs, memory.act[order], memory.reward[order], next_obs, terminated, truncated, seed=seed
        )

    @classmethod
    def collect(
        cls,
        env: Any,
        policy: Callable[[np.ndarray], Any],
        *,
        episodes: int,
        seed: int | None = None,
    ) -> OfflineDataset:
        """Run `policy` (observation -> action) for `episodes` episodes of `env` and keep them.

        `env` speaks gymnasium's API (`reset(seed=)`, `step` -> 5-tuple); `seed` seeds its
        first reset and the dataset's generator.
        """
        if int(episodes) <= 0:
            raise ValueError(f"OfflineDataset.collect: {episodes=} must be positive")
        rows: dict[str, list[Any]] = {name: [] for name in FIELDS}
        obs, _ = env.reset(seed=seed)
        for _ in range(int(episodes)):
            terminated = truncated = False
            while not (terminated or truncated):
                action = policy(obs)
                next_obs, reward, terminated, truncated, _ = env.step(action)
                row = (obs, action, reward, next_obs, terminated, truncated)
                for name, value in zip(FIELDS, row, strict=True):
                    rows[name].append(value)
                obs = next_obs
            obs, _ = env.reset()
        return cls(**{name: np.asarray(rows[name]) for name in FIELDS}, seed=seed)

    @classmethod
    def from_episodes(cls, episodes: Iterable[Any], *, seed: int | None = None) -> OfflineDataset:
        """Concatenate episodes in minari's layout into one dataset.

        Each episode has `observations` (`T + 1` rows: the first observation and one after each
        step), `actions`, `rewards`, `terminations` and `truncations` (`T` rows each). An
        episode that neither terminated nor was truncated at its end is marked truncated there.
        """
        parts: dict[str, list[np.ndarray]] = {name: [] for name in FIELDS}
        for i, episode in enumerate(episodes):
            observations = np.asarray(episode.observations)
            if observations.dtype == object or isinstance(episode.observations, dict):
                raise ValueError(
                    f"OfflineDataset.from_episodes: episode {i} has structured (dict or tuple) "
                    "observations; flatten them into one array first"
                )
            steps = len(episode.actions)
            if len(observations) != steps + 1:
                raise ValueError(
                    f"OfflineDataset.from_episodes: episode {i} has {len(observations)} "
                    f"observations for {steps} actions; expected {steps + 1}"
                )
            truncated = np.asarray(episode.truncations, dtype=bool).copy()
            terminated = np.asarray(episode.terminations, dtype=bool)
            if steps and not (terminated[-1] or truncated[-1]):
                truncated[-1] = True
            parts["obs"].append(observations[:-1])
            parts["next_obs"].append(observations[1:])
            parts["action"].append(np.asarray(episode.actions))
            parts["reward"].append(np.asarray(episode.rewards))
            parts["terminated"].append(terminated)
            parts["truncated"].append(truncated)
        if not parts["obs"]:
            raise ValueError("OfflineDataset.from_episodes: no episodes")
        return cls(**{name: np.concatenate(parts[name]) for name in FIELDS}, seed=seed)

    @classmethod
    def from_minari(
        cls, name: str, *, download: bool = False, seed: int | None = None
    ) -> OfflineDataset:
        """Load the minari dataset `name` (e.g. `"D4RL/pen/human-v2"`).

        Needs `minari` (`pip install minari`), which parl does not install. With
        `download=False` the dataset must already be in minari's local store.

        Raises:
            ImportError: minari is not installed.
        """
        try:
            import minari  # type: ignore[import-not-found]  # optional, not a dependency
        except ImportError as exc:
            raise ImportError(
                "OfflineDataset.from_minari needs the minari package: pip install minari "
                "(or save your data as a .npz and use OfflineDataset.load)"
            ) from exc
        dataset = minari.load_dataset(name, download=download)
        return cls.from_episodes(dataset.iterate_episodes(), seed=seed)

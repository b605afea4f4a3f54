"""The solver interface shared by every evolution strategy, and the bookkeeping they share.

A solver holds a search distribution at a *version* (its update count). `ask` names a
population of perturbations (`SamplingInfo`s), `candidate(info)` turns a name into the parameter
vector to evaluate, and `tell(infos, rewards)` updates the distribution and bumps the version.
Rewards are maximized. Because candidates are rebuilt from names, a sampler needs only the
solver's state and the infos, never the vectors themselves; and replicas of a solver that are
told the same infos and rewards stay identical.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike

from parl_evo._exceptions import (
    ConfigError,
    FutureSampleError,
    NoUsableSamplesError,
    SampleError,
    SolverStateError,
)
from parl_evo._noise import NoiseSource, SamplingInfo

__all__ = ["Solver", "UpdateStats", "centered_ranks"]


@dataclass(frozen=True, slots=True)
class UpdateStats:
    """What one `tell` (or `ESAgent.update`) did.

    Attributes:
        version: the solver's version after the update.
        used: how many samples went into the update.
        discarded: how many were dropped as too stale.
        reward_mean: mean reward of the used samples.
        reward_max: best reward of the used samples.
    """

    version: int
    used: int
    discarded: int
    reward_mean: float
    reward_max: float


def centered_ranks(rewards: np.ndarray) -> np.ndarray:
    """Fitness shaping: each reward's rank scaled to [-0.5, 0.5]; ties share their mean rank.

    Ranks make an update blind to the scale of rewards and to outliers (Salimans et al., 2017).
    A single reward gets 0.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    n = rewards.size
    if n < 2:
        return np.zeros(n)
    _, inverse, counts = np.unique(rewards, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # rank of the first member of each tie group
    ranks = (first + (counts - 1) / 2.0)[inverse]
    return ranks / (n - 1) - 0.5


class Solver(ABC):
    """Base class of every solver: a search distribution over `dim`-vectors at a version.

    Args:
        x0: the starting point (the mean of the first distribution).
        sigma: the perturbation scale (CMA-ES adapts it; the others keep it).
        noise: where perturbations come from.
        population_size: the number of candidates `ask` names; 0 for the solver's default.
    """

    #: the `solver.type` that selects this solver in a configuration
    type_name: ClassVar[str]
    #: whether `ask` names mirrored pairs (the same noise with both signs)
    mirrored: bool = False

    def __init__(
        self, *, x0: np.ndarray, sigma: float, noise: NoiseSource, population_size: int = 0
    ) -> None:
        x0 = np.array(x0, dtype=np.float64).ravel()
        if x0.size == 0:
            raise ConfigError(f"{type(self).__name__}: x0 is empty; it needs at least one value")
        if not np.all(np.isfinite(x0)):
            raise ConfigError(f"{type(self).__name__}: x0 has non-finite values")
        if not sigma > 0:
            raise ConfigError(f"{type(self).__name__}: sigma={sigma} must be positive")
        if population_size < 0:
            raise ConfigError(f"{type(self).__name__}: {population_size=} must be >= 0")
        self.dim = x0.size
        self.sigma = float(sigma)
        self.noise = noise
        self.version = 0
        self.population_size = population_size or self.default_population_size(self.dim)

    @staticmethod
    def default_population_size(dim: int) -> int:
        """Hansen's default, `4 + floor(3 ln dim)`."""
        return 4 + int(3 * np.log(dim))

    # -- the interface -------------------------------------------------------------------------
    @property
    @abstractmethod
    def mean(self) -> np.ndarray:
        """The solver's current best guess: the vector to deploy (a float64 copy)."""

    @abstractmethod
    def candidate(self, info: SamplingInfo) -> np.ndarray:
        """The float64 parameter vector that `info` names."""

    @abstractmethod
    def tell(self, infos: Sequence[SamplingInfo], rewards: ArrayLike) -> UpdateStats:
        """Update the distribution from evaluated candidates (higher reward is better)."""

    def ask(self, rng: np.random.Generator, n: int | None = None) -> list[SamplingInfo]:
        """Name `n` candidates (default: the population size) drawn with `rng`.

        Mirrored solvers return pairs `+e, -e`; `n` must then be even.
        """
        n = self.population_size if n is None else n
        if self.mirrored and n % 2:
            raise ConfigError(f"{type(self).__name__} samples mirrored pairs; {n=} must be even")
        infos = []
        for _ in range(n // 2 if self.mirrored else n):
            info = SamplingInfo(self.noise.draw_key(rng, self.dim), 1, self.version)
            infos.append(info)
            if self.mirrored:
                infos.append(info.mirrored())
        return infos

    def perturbation(self, info: SamplingInfo) -> np.ndarray:
        """`sign * noise(key)` as float64: the standard-normal vector a candidate was drawn with."""
        z = self.noise.noise(info.key, self.dim).astype(np.float64)
        if info.sign < 0:
            np.negative(z, out=z)
        return z

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything that changes as the solver runs (arrays copied)."""
        return {"version": self.version, "sigma": self.sigma}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state returned by `state_dict` of a solver of the same type and size."""
        self.version = int(state["version"])
        self.sigma = float(state["sigma"])

    def _load_vector(self, state: dict[str, Any], name: str) -> np.ndarray:
        array = np.array(state[name], dtype=np.float64)
        if array.shape[-1:] != (self.dim,):
            raise SolverStateError(
                f"{type(self).__name__}: saved {name!r} has shape {array.shape}, but this solver "
                f"has {self.dim} parameters; load a solver saved for the same model"
            )
        return array

    # -- shared bookkeeping ----------------------------------------------------------------------
    def _ages(
        self, infos: Sequence[SamplingInfo], rewards: ArrayLike
    ) -> tuple[np.ndarray, np.ndarray]:
        """Validate a batch; return each sample's age (versions behind) and the rewards."""
        values = np.asarray(rewards, dtype=np.float64).ravel()
        if len(infos) != values.size:
            raise SampleError(
                f"{type(self).__name__}.tell: {len(infos)} sampling infos but {values.size} "
                "rewards; pass one reward per info, in the same order"
            )
        if not np.all(np.isfinite(values)):
            bad = int(np.flatnonzero(~np.isfinite(values))[0])
            raise SampleError(
                f"{type(self).__name__}.tell: reward {bad} is {values[bad]}; rewards must be "
                "finite (clip or replace failed evaluations with a low finite reward)"
            )
        ages = np.array([self.version - info.version for info in infos], dtype=np.int64)
        if np.any(ages < 0):
            bad = int(np.flatnonzero(ages < 0)[0])
            raise FutureSampleError(
                f"{type(self).__name__}.tell: sample {bad} was drawn around version "
                f"{infos[bad].version}, but this solver is at version {self.version}; the "
                "replica that drew it is ahead of this one: give every replica the same updates "
                "(or load the same solver state) before sampling"
            )
        return ages, values

    def _require_current(self, info: SamplingInfo) -> None:
        if info.version != self.version:
            raise SampleError(
                f"{type(self).__name__} rebuilds candidates of its current version "
                f"{self.version} only; {info} is from version {info.version}"
            )

    def _require_enough(self, used: int, needed: int, discarded: int) -> None:
        if used < needed:
            raise NoUsableSamplesError(
                f"{type(self).__name__}.tell needs at least {needed} usable samples, got {used} "
                f"({discarded} discarded as stale); evaluate more candidates of version "
                f"{self.version} before updating"
            )


def _stats(version: int, rewards: np.ndarray, discarded: int) -> UpdateStats:
    return UpdateStats(
        version=version,
        used=int(rewards.size),
        discarded=int(discarded),
        reward_mean=float(rewards.mean()),
        reward_max=float(rewards.max()),
    )

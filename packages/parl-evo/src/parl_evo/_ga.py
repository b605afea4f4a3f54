"""A genetic algorithm: truncation selection, Gaussian mutation, elitism.

As in Such et al., "Deep Neuroevolution" (2017, https://arxiv.org/abs/1712.06567): each child
is a uniformly chosen parent plus `sigma * e`; the best `parents` individuals of the children
and the carried-over elites become the next parents; the best `elites` parents survive
unchanged (with their reward) into the next selection, so the best individual found is never
lost. No crossover.

A child is named by its info alone: the key picks the parent (`key mod parents`) and the noise.
Selection replaces the parents every update, so samples of older versions are discarded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from parl_evo._exceptions import ConfigError
from parl_evo._noise import NoiseSource, SamplingInfo
from parl_evo._solver import Solver, UpdateStats, _stats

__all__ = ["GA"]


class GA(Solver):
    """Truncation-selection GA with Gaussian mutation and elitism (`solver.type = "BASIC_GA"`).

    Args:
        x0: the first (only) parent.
        sigma: standard deviation of the mutation.
        noise: where mutations come from.
        population_size: children per generation; 0 for `max(10, 4 * (4 + floor(3 ln n)))`.
        parents: how many of the best become parents (truncation); 0 for a fifth of the
            population, at least 2.
        elites: how many of the best parents are carried into the next selection unchanged.
    """

    type_name = "BASIC_GA"

    def __init__(
        self,
        *,
        x0: np.ndarray,
        sigma: float,
        noise: NoiseSource,
        population_size: int = 0,
        parents: int = 0,
        elites: int = 1,
    ) -> None:
        super().__init__(x0=x0, sigma=sigma, noise=noise, population_size=population_size)
        self.parents = parents or max(2, self.population_size // 5)
        if not 1 <= self.parents <= self.population_size:
            raise ConfigError(
                f"GA: parents={self.parents} must be in [1, population_size={self.population_size}]"
            )
        if not 0 <= elites <= self.parents:
            raise ConfigError(f"GA: {elites=} must be in [0, parents={self.parents}]")
        self.elites = int(elites)
        self._population = np.array(x0, dtype=np.float64).reshape(1, -1)  # best first
        self._fitness = np.array([-np.inf])  # the start point was never evaluated

    @staticmethod
    def default_population_size(dim: int) -> int:
        """`max(10, 4 * (4 + floor(3 ln dim)))`: selection needs more children than CMA-ES."""
        return max(10, 4 * Solver.default_population_size(dim))

    @property
    def mean(self) -> np.ndarray:
        """The best individual found so far (the start point before the first update)."""
        return np.array(self._population[0])

    @property
    def best_reward(self) -> float:
        """The reward of `mean` (-inf before the first update)."""
        return float(self._fitness[0])

    def candidate(self, info: SamplingInfo) -> np.ndarray:
        """Parent number `key mod parents`, mutated by `sigma * noise(key)`."""
        self._require_current(info)
        parent: np.ndarray = self._population[info.key % len(self._population)]
        return parent + self.sigma * self.perturbation(info)

    def tell(self, infos: Sequence[SamplingInfo], rewards: ArrayLike) -> UpdateStats:
        """Select the next parents from this generation's children and the elites."""
        ages, scores = self._ages(infos, rewards)
        keep = np.flatnonzero(ages == 0)
        discarded = len(infos) - keep.size
        self._require_enough(keep.size, 1, discarded)
        children = np.array([self.candidate(infos[int(i)]) for i in keep])
        # Elites first: on a tie the incumbent stays (a stable sort keeps the pool order).
        pool = np.concatenate([self._population[: self.elites], children])
        fitness = np.concatenate([self._fitness[: self.elites], scores[keep]])
        best = np.argsort(-fitness, kind="stable")[: self.parents]
        self._population, self._fitness = pool[best], fitness[best]
        self.version += 1
        return _stats(self.version, scores[keep], discarded)

    def state_dict(self) -> dict[str, Any]:
        """Parents (best first), their rewards, version and sigma."""
        return {
            **super().state_dict(),
            "population": self._population.copy(),
            "fitness": self._fitness.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state returned by `state_dict`."""
        super().load_state_dict(state)
        self._population = self._load_vector(state, "population").reshape(-1, self.dim)
        self._fitness = np.array(state["fitness"], dtype=np.float64)

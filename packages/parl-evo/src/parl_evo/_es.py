"""OpenAI-ES: a Gaussian search distribution whose mean follows a gradient estimate.

Salimans, Ho, Chen, Sidor & Sutskever, "Evolution Strategies as a Scalable Alternative to
Reinforcement Learning", 2017 (https://arxiv.org/abs/1703.03864). The mean `theta` is perturbed
by `sigma * e`, `e ~ N(0, I)`, in mirrored pairs `+e, -e`; rewards are replaced by their
centered ranks `u`; the ascent direction is `g = sum(u_i e_i) / (n sigma)`, and an optimizer
(SGD, Momentum or Adam) steps on the loss gradient `-g + weight_decay * theta`.

Asynchronous samples (EvoKit's rule): a sample drawn around version `v - a` (age `a`) named the
candidate `x = theta_{v-a} + sigma e`. While `a <= max_staleness` the solver still holds
`theta_{v-a}` and uses the sample with its true offset from the current mean,
`e' = (x - theta_v) / sigma = e + (theta_{v-a} - theta_v) / sigma`, and weight
`staleness_decay ** a`; older samples are discarded (and counted in `UpdateStats.discarded`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from parl_evo._exceptions import ConfigError, SampleError
from parl_evo._noise import NoiseSource, SamplingInfo
from parl_evo._optimizers import Optimizer
from parl_evo._solver import Solver, UpdateStats, _stats, centered_ranks

__all__ = ["GaussianES"]


class GaussianES(Solver):
    """OpenAI-ES / basic Gaussian ES (`solver.type = "BASIC_ES"`).

    Args:
        x0: the starting mean.
        sigma: standard deviation of the perturbations.
        noise: where perturbations come from.
        optimizer: steps the mean along the estimated gradient.
        population_size: candidates per `ask` (even when mirrored); 0 for twice Hansen's
            default, rounded to even.
        mirrored: sample `+e, -e` pairs (antithetic sampling, lower variance).
        weight_decay: L2 coefficient added to the loss gradient (`weight_decay * theta`).
        max_staleness: how many versions old a sample may be and still count (see module doc).
        staleness_decay: weight factor per version of age, in (0, 1].
    """

    type_name = "BASIC_ES"

    def __init__(
        self,
        *,
        x0: np.ndarray,
        sigma: float,
        noise: NoiseSource,
        optimizer: Optimizer,
        population_size: int = 0,
        mirrored: bool = True,
        weight_decay: float = 0.0,
        max_staleness: int = 0,
        staleness_decay: float = 1.0,
    ) -> None:
        self.mirrored = bool(mirrored)
        super().__init__(x0=x0, sigma=sigma, noise=noise, population_size=population_size)
        if weight_decay < 0:
            raise ConfigError(f"GaussianES: {weight_decay=} must be >= 0")
        if max_staleness < 0:
            raise ConfigError(f"GaussianES: {max_staleness=} must be >= 0")
        if not 0 < staleness_decay <= 1:
            raise ConfigError(f"GaussianES: {staleness_decay=} must be in (0, 1]")
        self.optimizer = optimizer
        self.weight_decay = float(weight_decay)
        self.max_staleness = int(max_staleness)
        self.staleness_decay = float(staleness_decay)
        self._theta = np.array(x0, dtype=np.float64).ravel()
        self._history: list[np.ndarray] = []  # _history[a - 1] is the mean of version - a

    @staticmethod
    def default_population_size(dim: int) -> int:
        """Twice Hansen's default, so that it is even: `2 * (4 + floor(3 ln dim))`."""
        return 2 * Solver.default_population_size(dim)

    @property
    def mean(self) -> np.ndarray:
        """The current mean `theta`."""
        return self._theta.copy()

    def _theta_of(self, version: int) -> np.ndarray:
        age = self.version - version
        if age == 0:
            return self._theta
        if 0 < age <= len(self._history):
            return self._history[age - 1]
        raise SampleError(
            f"GaussianES keeps the means of versions {self.version - len(self._history)} to "
            f"{self.version}; cannot rebuild a candidate of version {version}"
        )

    def candidate(self, info: SamplingInfo) -> np.ndarray:
        """`theta_{info.version} + sign * sigma * noise(key)`."""
        return self._theta_of(info.version) + self.sigma * self.perturbation(info)

    def tell(self, infos: Sequence[SamplingInfo], rewards: ArrayLike) -> UpdateStats:
        """One optimizer step along the rank-weighted noise; stale samples as in the module doc."""
        ages, scores = self._ages(infos, rewards)
        keep = np.flatnonzero(ages <= self.max_staleness)
        discarded = len(infos) - keep.size
        self._require_enough(keep.size, 2, discarded)
        decay = self.staleness_decay ** ages[keep].astype(np.float64)
        utilities = centered_ranks(scores[keep]) * decay
        # Accumulate one sample at a time, in order, with elementwise float64 operations only:
        # no BLAS reduction, so every replica gets the same bits on any machine.
        g = np.zeros(self.dim)
        for index, utility in zip(keep, utilities, strict=True):
            e = self.perturbation(infos[int(index)])
            age = int(ages[index])
            if age:
                e += (self._history[age - 1] - self._theta) / self.sigma
            g += utility * e
        g /= self.sigma * decay.sum()
        delta = self.optimizer.step(-g + self.weight_decay * self._theta)
        if self.max_staleness:
            self._history.insert(0, self._theta)
            del self._history[self.max_staleness :]
        self._theta = self._theta + delta
        self.version += 1
        return _stats(self.version, scores[keep], discarded)

    def state_dict(self) -> dict[str, Any]:
        """Mean, kept means of past versions, optimizer state, version and sigma."""
        return {
            **super().state_dict(),
            "theta": self._theta.copy(),
            "history": np.array(self._history).reshape(len(self._history), self.dim),
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state returned by `state_dict`."""
        super().load_state_dict(state)
        self._theta = self._load_vector(state, "theta")
        self._history = list(self._load_vector(state, "history").reshape(-1, self.dim))
        self.optimizer.load_state_dict(state["optimizer"])

"""CMA-ES with full covariance, and its separable (diagonal) variant for large dimensions.

Written from N. Hansen, "The CMA Evolution Strategy: A Tutorial" (2016,
https://arxiv.org/abs/1604.00772): the default parameters of its Table 1 (with negative
"active" weights), cumulative step-size adaptation, the rank-one and rank-mu covariance updates
with the `h_sigma` stall, and a lazy eigendecomposition. The separable variant is Ros & Hansen,
"A Simple Modification in CMA-ES Achieving Linear Time and Space Complexity" (PPSN 2008): a
diagonal covariance with learning rates scaled up by `(n + 2) / 3`, positive weights only.

Candidates are `x = m + sigma * B D z` with `z = sign * noise(key)`: a sampler that holds the
current state rebuilds them from names alone. The distribution moves every update, so samples
of older versions are discarded (counted in `UpdateStats.discarded`). Rewards are maximized.
"""

from __future__ import annotations

import functools
import math
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from parl_evo._noise import NoiseSource, SamplingInfo
from parl_evo._solver import Solver, UpdateStats, _stats

__all__ = ["CMAES", "SepCMAES"]


@dataclass(frozen=True)
class _Parameters:
    """Strategy parameters of the tutorial's Table 1 for one `(n, lambda)`."""

    mu: int
    weights: np.ndarray  # lambda weights: positive for the mu best, negative (or 0) after
    mu_eff: float
    c_sigma: float
    d_sigma: float
    c_c: float
    c_1: float
    c_mu: float
    chi_n: float  # E||N(0, I)||


@functools.lru_cache(maxsize=32)
def _parameters(n: int, lam: int, separable: bool) -> _Parameters:
    mu = lam // 2
    w_prime = math.log((lam + 1) / 2) - np.log(np.arange(1, lam + 1))
    positive, negative = w_prime[:mu], w_prime[mu:]
    mu_eff = positive.sum() ** 2 / (positive**2).sum()
    c_sigma = (mu_eff + 2) / (n + mu_eff + 5)
    d_sigma = 1 + 2 * max(0.0, math.sqrt((mu_eff - 1) / (n + 1)) - 1) + c_sigma
    c_c = (4 + mu_eff / n) / (n + 4 + 2 * mu_eff / n)
    alpha_cov = 2.0
    c_1 = alpha_cov / ((n + 1.3) ** 2 + mu_eff)
    c_mu = min(
        1 - c_1, alpha_cov * (mu_eff - 2 + 1 / mu_eff) / ((n + 2) ** 2 + alpha_cov * mu_eff / 2)
    )
    if separable:  # Ros & Hansen: a diagonal model learns n numbers, not n^2 / 2
        c_1 *= (n + 2) / 3
        c_mu = min(1 - c_1, c_mu * (n + 2) / 3)
    weights = np.zeros(lam)
    weights[:mu] = positive / positive.sum()
    if not separable and negative.size and (negative**2).sum() > 0:
        mu_eff_minus = negative.sum() ** 2 / (negative**2).sum()
        alpha_mu = 1 + c_1 / c_mu
        alpha_mu_eff = 1 + 2 * mu_eff_minus / (mu_eff + 2)
        alpha_posdef = (1 - c_1 - c_mu) / (n * c_mu)
        weights[mu:] = min(alpha_mu, alpha_mu_eff, alpha_posdef) * negative / -negative.sum()
    weights.flags.writeable = False
    chi_n = math.sqrt(n) * (1 - 1 / (4 * n) + 1 / (21 * n**2))
    return _Parameters(mu, weights, mu_eff, c_sigma, d_sigma, c_c, c_1, c_mu, chi_n)


class _CMABase(Solver):
    """What full and separable CMA-ES share: mean, step size, both evolution paths."""

    separable: bool

    def __init__(
        self, *, x0: np.ndarray, sigma: float, noise: NoiseSource, population_size: int = 0
    ) -> None:
        super().__init__(x0=x0, sigma=sigma, noise=noise, population_size=population_size)
        self._m = np.array(x0, dtype=np.float64).ravel()
        self._p_sigma = np.zeros(self.dim)
        self._p_c = np.zeros(self.dim)
        self._sigma0 = self.sigma
        self._recent_best: list[float] = []  # best reward of each recent generation
        self._last_spread = np.inf  # max - min reward of the last generation
        self._init_covariance()

    @property
    def stop_reason(self) -> str | None:
        """Why this run has converged or stalled, or None while it is making progress.

        - `"tolfun"`: the best rewards of the last `10 + ceil(30 n / lambda)` generations, and
          the rewards of the last one, span less than 1e-12.
        - `"tolx"`: every coordinate's step `sigma * sqrt(C_ii)` is below 1e-12 times sigma0.
        - `"conditioncov"`: the covariance's condition number exceeds 1e14.

        Restart from another point with a larger population when it is not None (IPOP-CMA-ES,
        Auger & Hansen 2005): a single run ends in a local optimum of multimodal functions.
        """
        window = 10 + math.ceil(30 * self.dim / self.population_size)
        history = self._recent_best
        flat = len(history) >= window and max(history) - min(history) < 1e-12
        if flat and self._last_spread < 1e-12:
            return "tolfun"
        if self.sigma * math.sqrt(float(self._diagonal().max())) < 1e-12 * self._sigma0:
            return "tolx"
        if self._condition() > 1e14:
            return "conditioncov"
        return None

    @abstractmethod
    def _init_covariance(self) -> None:
        """Set up the covariance model at the identity."""

    @abstractmethod
    def _diagonal(self) -> np.ndarray:
        """The diagonal of C."""

    @abstractmethod
    def _condition(self) -> float:
        """The condition number of C (as of its last decomposition)."""

    @property
    def mean(self) -> np.ndarray:
        """The distribution mean `m`."""
        return self._m.copy()

    def candidate(self, info: SamplingInfo) -> np.ndarray:
        """`m + sigma * B D z`, for an info of the current version."""
        self._require_current(info)
        return self._m + self.sigma * self._y(self.perturbation(info))

    def tell(self, infos: Sequence[SamplingInfo], rewards: ArrayLike) -> UpdateStats:
        """One CMA-ES generation from the current version's samples (ranked by reward)."""
        ages, scores = self._ages(infos, rewards)
        keep = np.flatnonzero(ages == 0)
        discarded = len(infos) - keep.size
        self._require_enough(keep.size, 2, discarded)
        order = keep[np.argsort(-scores[keep], kind="stable")]  # best first
        n, lam = self.dim, order.size
        p = _parameters(n, lam, self.separable)
        z = np.array([self.perturbation(infos[i]) for i in order])  # lam x n, sorted
        y = self._y_rows(z)  # the steps (x - m) / sigma, sorted
        w_pos = p.weights[: p.mu]
        y_w = w_pos @ y[: p.mu]
        self._m = self._m + self.sigma * y_w  # c_m = 1
        # Step size: the path of C^{-1/2} y_w, which is B z_w.
        self._p_sigma = (1 - p.c_sigma) * self._p_sigma + math.sqrt(
            p.c_sigma * (2 - p.c_sigma) * p.mu_eff
        ) * self._whiten(w_pos @ z[: p.mu])
        generation = self.version + 1
        norm_p_sigma = float(np.linalg.norm(self._p_sigma))
        h_sigma = (
            norm_p_sigma / math.sqrt(1 - (1 - p.c_sigma) ** (2 * generation))
            < (1.4 + 2 / (n + 1)) * p.chi_n
        )
        self._p_c = (1 - p.c_c) * self._p_c
        if h_sigma:
            self._p_c += math.sqrt(p.c_c * (2 - p.c_c) * p.mu_eff) * y_w
        delta_h = (1 - h_sigma) * p.c_c * (2 - p.c_c)
        # Negative weights are rescaled by n / ||C^{-1/2} y||^2 = n / ||z||^2 (tutorial eq. 46).
        w_circ = p.weights.copy()
        negative = w_circ < 0
        if negative.any():
            w_circ[negative] *= n / np.maximum((z[negative] ** 2).sum(axis=1), 1e-300)
        decay = 1 + p.c_1 * delta_h - p.c_1 - p.c_mu * p.weights.sum()
        self._update_covariance(decay, p.c_1, p.c_mu, w_circ, y)
        self.sigma *= math.exp((p.c_sigma / p.d_sigma) * (norm_p_sigma / p.chi_n - 1))
        self.version = generation
        window = 10 + math.ceil(30 * n / self.population_size)
        self._recent_best = [*self._recent_best, float(scores[order[0]])][-window:]
        self._last_spread = float(scores[order[0]] - scores[order[-1]])
        self._after_update(p)
        return _stats(self.version, scores[keep], discarded)

    # -- what the covariance model decides -----------------------------------------------------
    def _y(self, z: np.ndarray) -> np.ndarray:
        """`B D z` for one standard-normal vector."""
        return np.asarray(self._y_rows(z[None, :])[0])

    @abstractmethod
    def _y_rows(self, z: np.ndarray) -> np.ndarray:
        """`B D z` for each row of `z`."""

    @abstractmethod
    def _whiten(self, z_w: np.ndarray) -> np.ndarray:
        """`C^{-1/2} y` for `y = B D z_w`, which is `B z_w`."""

    @abstractmethod
    def _update_covariance(
        self, decay: float, c_1: float, c_mu: float, w_circ: np.ndarray, y: np.ndarray
    ) -> None:
        """`C = decay C + c_1 p_c p_c^T + c_mu sum(w_circ_i y_i y_i^T)` in the model's form."""

    def _after_update(self, p: _Parameters) -> None:
        """Hook after the generation counter moved (the full model's lazy eigendecomposition)."""

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Mean, step size, evolution paths, covariance model and version."""
        return {
            **super().state_dict(),
            "m": self._m.copy(),
            "p_sigma": self._p_sigma.copy(),
            "p_c": self._p_c.copy(),
            "sigma0": self._sigma0,
            "recent_best": list(self._recent_best),
            "last_spread": self._last_spread,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state returned by `state_dict`."""
        super().load_state_dict(state)
        self._m = self._load_vector(state, "m")
        self._p_sigma = self._load_vector(state, "p_sigma")
        self._p_c = self._load_vector(state, "p_c")
        self._sigma0 = float(state["sigma0"])
        self._recent_best = [float(r) for r in state["recent_best"]]
        self._last_spread = float(state["last_spread"])


class CMAES(_CMABase):
    """CMA-ES with a full covariance matrix (`solver.type = "CMA_ES"`); O(n^2) memory.

    Good up to a few thousand parameters; beyond, use `SepCMAES` or `GaussianES`.

    Args:
        x0: the initial mean.
        sigma: the initial step size (about a quarter of the search range is a good start).
        noise: where perturbations come from.
        population_size: lambda; 0 for `4 + floor(3 ln n)`.
    """

    type_name = "CMA_ES"
    separable = False

    def _init_covariance(self) -> None:
        self._C = np.eye(self.dim)
        self._B = np.eye(self.dim)
        self._D = np.ones(self.dim)
        self._eigen_version = 0

    @property
    def covariance(self) -> np.ndarray:
        """The covariance matrix C (a copy); the sampling distribution is N(m, sigma^2 C)."""
        return self._C.copy()

    def _y_rows(self, z: np.ndarray) -> np.ndarray:
        return (z * self._D) @ self._B.T

    def _whiten(self, z_w: np.ndarray) -> np.ndarray:
        return np.asarray(self._B @ z_w)

    def _diagonal(self) -> np.ndarray:
        return np.diag(self._C)

    def _condition(self) -> float:
        return float((self._D.max() / self._D.min()) ** 2)

    def _update_covariance(
        self, decay: float, c_1: float, c_mu: float, w_circ: np.ndarray, y: np.ndarray
    ) -> None:
        rank_mu = (y * w_circ[:, None]).T @ y
        self._C = decay * self._C + c_1 * np.outer(self._p_c, self._p_c) + c_mu * rank_mu

    def _after_update(self, p: _Parameters) -> None:
        # Decompose C = B D^2 B^T every 1 / (10 n (c_1 + c_mu)) generations (tutorial, B.2).
        gap = max(1, int(1 / (10 * self.dim * (p.c_1 + p.c_mu))))
        if self.version - self._eigen_version >= gap:
            self._decompose()

    def _decompose(self) -> None:
        self._C = (self._C + self._C.T) / 2
        eigenvalues, self._B = np.linalg.eigh(self._C)
        self._D = np.sqrt(np.maximum(eigenvalues, 1e-300))
        self._eigen_version = self.version

    def state_dict(self) -> dict[str, Any]:
        """Adds C, its eigendecomposition B, D and the version it was taken at."""
        return {
            **super().state_dict(),
            "C": self._C.copy(),
            "B": self._B.copy(),
            "D": self._D.copy(),
            "eigen_version": self._eigen_version,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state returned by `state_dict`."""
        super().load_state_dict(state)
        self._C = self._load_vector(state, "C")
        self._B = self._load_vector(state, "B")
        self._D = self._load_vector(state, "D")
        self._eigen_version = int(state["eigen_version"])


class SepCMAES(_CMABase):
    """Separable CMA-ES (`solver.type = "SEP_CMA_ES"`): a diagonal covariance, O(n) per sample.

    Learns one scale per parameter, not their correlations; suits large models where full
    CMA-ES cannot even store its matrix.

    Args:
        x0: the initial mean.
        sigma: the initial step size.
        noise: where perturbations come from.
        population_size: lambda; 0 for `4 + floor(3 ln n)`.
    """

    type_name = "SEP_CMA_ES"
    separable = True

    def _init_covariance(self) -> None:
        self._c = np.ones(self.dim)  # the diagonal of C

    @property
    def covariance(self) -> np.ndarray:
        """The diagonal of the covariance matrix (a copy)."""
        return self._c.copy()

    def _y_rows(self, z: np.ndarray) -> np.ndarray:
        return z * np.sqrt(self._c)

    def _whiten(self, z_w: np.ndarray) -> np.ndarray:
        return z_w

    def _diagonal(self) -> np.ndarray:
        return self._c

    def _condition(self) -> float:
        return float(self._c.max() / self._c.min())

    def _update_covariance(
        self, decay: float, c_1: float, c_mu: float, w_circ: np.ndarray, y: np.ndarray
    ) -> None:
        self._c = decay * self._c + c_1 * self._p_c**2 + c_mu * (w_circ @ (y * y))

    def state_dict(self) -> dict[str, Any]:
        """Adds the diagonal covariance."""
        return {**super().state_dict(), "c": self._c.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state returned by `state_dict`."""
        super().load_state_dict(state)
        self._c = self._load_vector(state, "c")

"""First-order optimizers for gradient-based ES: SGD, Momentum and Adam, on numpy vectors.

An optimizer turns a gradient into a step: `params += optimizer.step(grad)`. The convention is
descent (as in torch): `grad` is the gradient of a loss to *minimize*; the ES solver hands in the
negated ascent direction plus its weight decay. State is float64 and goes into
`state_dict()`, so a solver reloaded from disk takes the very same next step.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from parl_evo._exceptions import ConfigError, SolverStateError

__all__ = ["Adam", "Momentum", "Optimizer", "SGD"]


class Optimizer(ABC):
    """Base class: `step(grad)` returns the change to add to the parameters.

    Args:
        lr: the learning rate (step size).
    """

    def __init__(self, *, lr: float) -> None:
        if not lr > 0:
            raise ConfigError(f"{type(self).__name__}: lr={lr} must be positive")
        self.lr = float(lr)

    @abstractmethod
    def step(self, grad: np.ndarray) -> np.ndarray:
        """Return the update for a gradient of the loss (a new float64 array)."""

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's running state (empty for stateless SGD)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the state returned by `state_dict`."""
        if state:
            raise SolverStateError(f"{type(self).__name__} has no state, got keys {sorted(state)}")


class SGD(Optimizer):
    """Plain gradient descent: `delta = -lr * grad`."""

    def step(self, grad: np.ndarray) -> np.ndarray:
        """`-lr * grad`."""
        return -self.lr * np.asarray(grad, dtype=np.float64)


class Momentum(Optimizer):
    """Heavy-ball momentum (torch's form): `v = momentum * v + grad`, `delta = -lr * v`.

    Args:
        lr: the learning rate.
        momentum: how much of the previous velocity is kept, in [0, 1).
    """

    def __init__(self, *, lr: float, momentum: float = 0.9) -> None:
        super().__init__(lr=lr)
        if not 0.0 <= momentum < 1.0:
            raise ConfigError(f"Momentum: momentum={momentum} must be in [0, 1)")
        self.momentum = float(momentum)
        self.velocity: np.ndarray | None = None

    def step(self, grad: np.ndarray) -> np.ndarray:
        """Update the velocity and return `-lr * velocity`."""
        grad = np.asarray(grad, dtype=np.float64)
        if self.velocity is None:
            self.velocity = np.zeros_like(grad)
        self.velocity = self.momentum * self.velocity + grad
        return -self.lr * self.velocity

    def state_dict(self) -> dict[str, Any]:
        """`{"velocity": array or None}`."""
        return {"velocity": None if self.velocity is None else self.velocity.copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the velocity."""
        velocity = state["velocity"]
        self.velocity = None if velocity is None else np.array(velocity, dtype=np.float64)


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015, https://arxiv.org/abs/1412.6980), with bias correction.

    `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g**2`, and at step `t` (from 1)
    `delta = -lr * (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + epsilon)`.

    Args:
        lr: the learning rate.
        beta1: decay of the first-moment average, in [0, 1).
        beta2: decay of the second-moment average, in [0, 1).
        epsilon: added to the denominator for numerical safety.
    """

    def __init__(
        self, *, lr: float, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8
    ) -> None:
        super().__init__(lr=lr)
        for name, beta in (("beta1", beta1), ("beta2", beta2)):
            if not 0.0 <= beta < 1.0:
                raise ConfigError(f"Adam: {name}={beta} must be in [0, 1)")
        if not epsilon > 0:
            raise ConfigError(f"Adam: epsilon={epsilon} must be positive")
        self.beta1 = float(beta1)
        self.beta2 = float(beta2)
        self.epsilon = float(epsilon)
        self.t = 0
        self.m: np.ndarray | None = None
        self.v: np.ndarray | None = None

    def step(self, grad: np.ndarray) -> np.ndarray:
        """Update the moment estimates and return the bias-corrected step."""
        grad = np.asarray(grad, dtype=np.float64)
        if self.m is None or self.v is None:
            self.m = np.zeros_like(grad)
            self.v = np.zeros_like(grad)
        self.t += 1
        self.m = self.beta1 * self.m + (1.0 - self.beta1) * grad
        self.v = self.beta2 * self.v + (1.0 - self.beta2) * grad * grad
        m_hat = self.m / (1.0 - self.beta1**self.t)
        v_hat = self.v / (1.0 - self.beta2**self.t)
        return -self.lr * m_hat / (np.sqrt(v_hat) + self.epsilon)

    def state_dict(self) -> dict[str, Any]:
        """`{"t": int, "m": array or None, "v": array or None}`."""
        return {
            "t": self.t,
            "m": None if self.m is None else self.m.copy(),
            "v": None if self.v is None else self.v.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the step count and both moment estimates."""
        self.t = int(state["t"])
        self.m = None if state["m"] is None else np.array(state["m"], dtype=np.float64)
        self.v = None if state["v"] is None else np.array(state["v"], dtype=np.float64)

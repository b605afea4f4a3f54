"""Small pieces of plumbing that several algorithms of the zoo share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import numpy as np
import torch
from numpy.typing import ArrayLike

__all__ = ["check_positive", "clip_grad_norm", "frozen", "soft_update", "to_tensor"]


def to_tensor(
    x: ArrayLike | torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """An array (or a number, or a list of them) as a tensor on `device`.

    The one place where the environment's numpy becomes the model's tensors: no copy on the
    CPU when the dtype already matches, one transfer to a GPU.

    Args:
        x: a numpy array, a tensor, a number or a (nested) list.
        device: the model's device (`agent.device`).
        dtype: the tensor's dtype (default: numpy's, e.g. float32 observations stay float32).
    """
    if not isinstance(x, torch.Tensor):
        x = np.asarray(x)
    return torch.as_tensor(x, dtype=dtype, device=device)


def clip_grad_norm(parameters: Iterable[torch.Tensor], max_norm: float | None) -> float:
    """Clip the global gradient norm to `max_norm` (None: leave it); return the norm before."""
    parameters = [p for p in parameters if p.grad is not None]
    if not parameters:
        return 0.0
    if max_norm is None:
        return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters])))
    return float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))


@torch.no_grad()
def soft_update(source: Iterable[torch.Tensor], target: Iterable[torch.Tensor], tau: float) -> None:
    """Polyak averaging of parameters: `target = (1 - tau) * target + tau * source`."""
    target = list(target)
    torch._foreach_lerp_(target, list(source), tau)


def check_positive(owner: str, **values: float) -> None:
    """Raise a ValueError naming each argument of `owner` that is not positive."""
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{owner}: {name}={value!r} must be positive")


@contextlib.contextmanager
def frozen(parameters: Iterable[torch.Tensor]) -> Iterator[None]:
    """Turn off `requires_grad` of `parameters` inside the block (gradients still flow through).

    An actor's loss backpropagates through the critic to the action; freezing the critic's
    weights skips computing gradients for them that nobody uses.
    """
    parameters = [p for p in parameters if p.requires_grad]
    for p in parameters:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in parameters:
            p.requires_grad_(True)

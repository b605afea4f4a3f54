"""What a policy network returns, as a `torch.distributions.Distribution`.

Actor-critic models in the zoo return either logits (a tensor: a categorical policy over
discrete actions) or a distribution object (for example `Independent(Normal(mu, std), 1)` for
continuous actions). The algorithms go through `as_distribution` so both work.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch.distributions import Categorical, Distribution, constraints
from torch.distributions.utils import _standard_normal

__all__ = ["DiagonalNormal", "as_distribution"]


class DiagonalNormal(Distribution):
    """`Independent(Normal(loc, scale), 1)` in one light object: a diagonal Gaussian.

    The same numbers to the bit as that pair (the same ops, in the same order), without its
    two objects and argument handling a call: for a small policy network these cost about as
    much as its forward pass, on every minibatch update. The last dimension is the event.

    Args:
        loc: `(..., d)` means.
        scale: `(..., d)` standard deviations (an expanded view is fine), positive.
    """

    arg_constraints: ClassVar[dict[str, constraints.Constraint]] = {
        "loc": constraints.real,
        "scale": constraints.positive,
    }
    support = constraints.independent(constraints.real, 1)
    has_rsample = True

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor) -> None:
        if loc.shape != scale.shape or loc.dim() < 1:
            raise ValueError(
                f"DiagonalNormal: loc {tuple(loc.shape)} and scale {tuple(scale.shape)} must "
                "have one shape, with the event's dimension last"
            )
        self.loc, self.scale = loc, scale
        self._batch_shape, self._event_shape = loc.shape[:-1], loc.shape[-1:]
        self._validate_args = False

    @property
    def mean(self) -> torch.Tensor:
        return self.loc

    @property
    def mode(self) -> torch.Tensor:
        return self.loc

    @property
    def stddev(self) -> torch.Tensor:
        return self.scale

    @property
    def variance(self) -> torch.Tensor:
        return self.scale.pow(2)

    def sample(self, sample_shape: torch.Size | tuple[int, ...] = ()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)
        with torch.no_grad():
            return torch.normal(self.loc.expand(shape), self.scale.expand(shape))

    def rsample(self, sample_shape: torch.Size | tuple[int, ...] = ()) -> torch.Tensor:
        shape = self._extended_shape(sample_shape)
        eps = _standard_normal(shape, dtype=self.loc.dtype, device=self.loc.device)
        return self.loc + eps * self.scale

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        var = self.scale**2
        log_prob = (
            -((value - self.loc) ** 2) / (2 * var)
            - self.scale.log()
            - math.log(math.sqrt(2 * math.pi))
        )
        return log_prob.sum(-1)

    def entropy(self) -> torch.Tensor:
        return (0.5 + 0.5 * math.log(2 * math.pi) + torch.log(self.scale)).sum(-1)


def as_distribution(policy_output: torch.Tensor | Distribution) -> Distribution:
    """Return `policy_output` itself if it is a distribution, else `Categorical(logits=...)`."""
    if isinstance(policy_output, Distribution):
        return policy_output
    if isinstance(policy_output, torch.Tensor):
        return Categorical(logits=policy_output)
    raise TypeError(
        "a policy must return logits (a torch.Tensor) or a torch.distributions.Distribution, "
        f"got {type(policy_output).__name__}"
    )

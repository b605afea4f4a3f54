"""What a policy network returns, as a `torch.distributions.Distribution`.

Actor-critic models in the zoo return either logits (a tensor: a categorical policy over
discrete actions) or a distribution object (for example `Independent(Normal(mu, std), 1)` for
continuous actions). The algorithms go through `as_distribution` so both work.
"""

from __future__ import annotations

import torch
from torch.distributions import Categorical, Distribution

__all__ = ["as_distribution"]


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

"""The part that A2C, PPO and IMPALA share: acting with a policy-and-value model.

Their model provides `policy(obs)` -> logits or a `torch.distributions.Distribution`, and
`value(obs)` -> `(batch,)` state values. This base class turns that into `predict` (the most
probable action), `sample` (an action drawn from the policy) and `value`, all without autograd:
exactly what an actor that only steps environments needs.
"""

from __future__ import annotations

import torch
from torch.distributions import Distribution

import parl
from parl_algos._distributions import as_distribution

__all__ = ["ActorCriticAlgorithm"]


class ActorCriticAlgorithm(parl.Algorithm):
    """Base of the on-policy actor-critic algorithms: acting and state values.

    Args:
        model: a `parl.Model` with `policy(obs)` (logits, or a distribution) and `value(obs)`.
    """

    def __init__(self, model: parl.Model) -> None:
        super().__init__(model)
        for method in ("policy", "value"):
            if not callable(getattr(model, method, None)):
                raise TypeError(
                    f"{type(self).__name__} needs a model with a {method}(obs) method; "
                    f"{type(model).__name__} has none"
                )

    def distribution(self, obs: torch.Tensor) -> Distribution:
        """Return the policy's action distribution for a batch of observations (with autograd)."""
        return as_distribution(self.model.policy(obs))

    @torch.no_grad()
    def predict(self, obs: torch.Tensor) -> torch.Tensor:
        """Return the most probable action for each observation (evaluation)."""
        return self.distribution(obs).mode

    @torch.no_grad()
    def sample(self, obs: torch.Tensor) -> torch.Tensor:
        """Return an action drawn from the policy for each observation (data collection)."""
        return self.distribution(obs).sample()

    @torch.no_grad()
    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """Return the state value `V(s)` of each observation, shape `(batch,)`."""
        return self.model.value(obs).reshape(-1)

"""The part that A2C, PPO and IMPALA share: acting with a policy-and-value model.

Their model provides `policy(obs)` -> logits or a `torch.distributions.Distribution`, and
`value(obs)` -> `(batch,)` state values; a model whose two heads share a torso (the Nature CNN
of `AtariActorCritic`) also has `policy_and_value(obs)`, both from one pass of it. This base
class turns that into `predict` (the most probable action), `sample` (an action drawn from the
policy) and `value`, all without autograd: exactly what an actor that only steps environments
needs; and into `policy_and_value` and `distribution_and_value` for the updates, which need
both with autograd.
"""

from __future__ import annotations

from typing import Any

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

    def policy_and_value(self, obs: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """Return the model's policy output and the state values `(batch,)` (with autograd).

        One pass where the model has `policy_and_value`, else `policy`'s and `value`'s.
        """
        both = getattr(self.model, "policy_and_value", None)
        if both is None:
            return self.model.policy(obs), self.model.value(obs).reshape(-1)
        policy, value = both(obs)
        return policy, value.reshape(-1)

    def distribution_and_value(self, obs: torch.Tensor) -> tuple[Distribution, torch.Tensor]:
        """Return the policy's distribution and the state values `(batch,)` (with autograd).

        As `policy_and_value` computes them.
        """
        policy, value = self.policy_and_value(obs)
        return as_distribution(policy), value

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

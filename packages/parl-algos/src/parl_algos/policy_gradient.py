"""REINFORCE, the Monte-Carlo policy gradient.

Williams, "Simple statistical gradient-following algorithms for connectionist reinforcement
learning", Machine Learning 8, 1992. https://doi.org/10.1007/BF00992696
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributions import Categorical

import parl

__all__ = ["PolicyGradient", "PolicyGradientStats"]


@dataclass(frozen=True)
class PolicyGradientStats:
    """What one `PolicyGradient.learn` call did."""

    loss: float
    """The surrogate loss `-mean(log pi(a|s) * G)`."""
    entropy: float
    """Mean entropy of the policy on the batch (falls as the policy becomes certain)."""


class PolicyGradient(parl.Algorithm):
    """REINFORCE for discrete actions: ascend `E[log pi(a|s) * G]`.

    The model maps a batch of observations to action probabilities (a softmax output). The
    returns `G` are computed by the caller (usually reward-to-go, normalised per batch), which
    keeps the algorithm independent of how episodes were collected.

    Args:
        model: a `parl.Model` returning action probabilities of shape `(batch, n_actions)`.
        lr: Adam learning rate.
    """

    def __init__(self, model: parl.Model, *, lr: float = 1e-3) -> None:
        super().__init__(model)
        if lr <= 0:
            raise ValueError(f"PolicyGradient: {lr=} must be positive")
        self.lr = lr
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    @torch.no_grad()
    def predict(self, obs: torch.Tensor) -> torch.Tensor:
        """Return the action probabilities for a batch of observations."""
        return self.model(obs)

    @torch.no_grad()
    def sample(self, obs: torch.Tensor) -> torch.Tensor:
        """Return actions sampled from the policy for a batch of observations."""
        return Categorical(probs=self.model(obs)).sample()

    def learn(
        self, obs: torch.Tensor, action: torch.Tensor, returns: torch.Tensor
    ) -> PolicyGradientStats:
        """One gradient step on a batch of `(obs, action, return)` triples."""
        dist = Categorical(probs=self.model(obs))
        log_prob = dist.log_prob(action)
        loss = -(log_prob * returns).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return PolicyGradientStats(loss=loss.item(), entropy=dist.entropy().mean().item())

"""BC, behaviour cloning: regress the policy onto the dataset's actions (the offline baseline).

Pomerleau, "ALVINN: An Autonomous Land Vehicle in a Neural Network", 1989; the deterministic
mean-squared form is the baseline of Fujimoto and Gu, "A Minimalist Approach to Offline
Reinforcement Learning", 2021, https://arxiv.org/abs/2106.06860.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import parl
from parl_algos._common import check_positive

__all__ = ["BC", "BCStats"]


@dataclass(frozen=True)
class BCStats:
    """What one `BC.learn` call did."""

    actor_loss: float
    """`mean((pi(s) - a)^2)` over the batch's dataset actions."""


class BC(parl.Algorithm):
    """Behaviour cloning of continuous actions: minimise `mean((pi(s) - a)^2)`.

    It learns the dataset's mean action in each state, whatever the rewards: the return it
    reaches is what offline RL (`CQL`, `IQL`) has to beat on the same data.

    Args:
        model: a `parl.Model` whose `policy(obs)` returns actions in the dataset's range (for
            example `ContinuousActorCriticMLP`, whose deterministic policy is a tanh in
            `[-1, 1]`), and whose `get_actor_params()`, when it has one, lists what to train.
        lr: Adam learning rate.
    """

    def __init__(self, model: parl.Model, *, lr: float = 1e-3) -> None:
        super().__init__(model)
        if not callable(getattr(model, "policy", None)):
            raise TypeError(f"BC needs a model with policy(obs); {type(model).__name__} lacks it")
        check_positive("BC", lr=lr)
        get_params = getattr(model, "get_actor_params", model.parameters)
        self.optimizer = torch.optim.Adam(get_params(), lr=lr)

    @torch.no_grad()
    def predict(self, obs: torch.Tensor) -> torch.Tensor:
        """Return the policy's action (evaluation)."""
        return self.model.policy(obs)

    @torch.no_grad()
    def sample(self, obs: torch.Tensor) -> torch.Tensor:
        """Return the policy's action (the cloned policy is deterministic)."""
        return self.model.policy(obs)

    def learn(self, obs: torch.Tensor, action: torch.Tensor, *rest: torch.Tensor) -> BCStats:
        """One step on a batch; `rest` (reward, next_obs, terminated of a `Batch`) is unused."""
        loss = F.mse_loss(self.model.policy(obs), action)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return BCStats(actor_loss=loss.item())

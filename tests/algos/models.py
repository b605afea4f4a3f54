"""Small models the algorithm tests share."""

from __future__ import annotations

import torch
from torch import nn

import parl
from parl_algos.nets import mlp


class QNet(parl.Model):
    """Observation -> Q-values, a small ReLU MLP."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 32) -> None:
        super().__init__()
        self.net = mlp(obs_dim, [hidden], n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class FixedGaussianPolicy(parl.Model):
    """A state-independent Gaussian policy and a zero critic, for checking SAC's log-probs."""

    def __init__(self, mean: list[float], log_std: list[float]) -> None:
        super().__init__()
        self.mean = nn.Parameter(torch.tensor(mean))
        self.log_std = nn.Parameter(torch.tensor(log_std))
        self.q = nn.Linear(1, 1)

    def policy(self, obs: torch.Tensor):
        shape = (obs.shape[0], self.mean.shape[0])
        return self.mean.expand(shape), self.log_std.expand(shape)

    def value(self, obs: torch.Tensor, action: torch.Tensor):
        q = self.q(obs).squeeze(-1)
        return q, q

    def get_actor_params(self):
        return [self.mean, self.log_std]

    def get_critic_params(self):
        return list(self.q.parameters())

"""DQN, deep Q-learning with a target network, optionally double and prioritized.

Mnih et al., "Human-level control through deep reinforcement learning", Nature 518, 2015,
https://doi.org/10.1038/nature14236; double Q-learning: van Hasselt et al., "Deep reinforcement
learning with double Q-learning", AAAI 2016, https://arxiv.org/abs/1509.06461.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

import parl
from parl_algos._common import check_positive, clip_grad_norm
from parl_algos.functional import td_target

__all__ = ["DQN", "DQNStats"]


@dataclass(frozen=True)
class DQNStats:
    """What one `DQN.learn` call did."""

    loss: float
    """The (importance-weighted) TD loss."""
    q_mean: float
    """Mean `Q(s, a)` of the batch's actions."""
    td_error: np.ndarray
    """`|y - Q(s, a)|` per sample: the new priorities for a prioritized replay memory."""


class DQN(parl.Algorithm):
    """Deep Q-network: regress `Q(s, a)` on `r + gamma * Q_target(s', a')`.

    With `double=True` the next action `a'` is chosen by the online network and evaluated by
    the target network (double DQN); otherwise `a' = argmax Q_target(s', .)`. The target network
    is a copy of the model refreshed by `sync_target`, which the agent calls on its schedule.
    The model may be dueling or not: it only has to map observations to one value per action.
    Exploration (epsilon-greedy) is the agent's choice of action and does not live here.

    Args:
        model: a `parl.Model` mapping observations to Q-values `(batch, n_actions)`.
        lr: Adam learning rate.
        gamma: discount factor.
        double: use the double-DQN target.
        loss: `"huber"` (smooth L1, as in the Nature paper's error clipping) or `"mse"`.
        max_grad_norm: clip the gradient's global norm to this (None: no clipping).
    """

    def __init__(
        self,
        model: parl.Model,
        *,
        lr: float = 1e-4,
        gamma: float = 0.99,
        double: bool = True,
        loss: Literal["huber", "mse"] = "huber",
        max_grad_norm: float | None = 10.0,
    ) -> None:
        super().__init__(model)
        check_positive("DQN", lr=lr)
        if loss not in ("huber", "mse"):
            raise ValueError(f"DQN: {loss=} must be 'huber' or 'mse'")
        self.gamma = gamma
        self.double = double
        self.loss = loss
        self.max_grad_norm = max_grad_norm
        self.target_model = copy.deepcopy(model)
        self.target_model.requires_grad_(False)
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    @torch.no_grad()
    def predict(self, obs: torch.Tensor) -> torch.Tensor:
        """Return the Q-values `(batch, n_actions)` of a batch of observations."""
        return self.model(obs)

    def sync_target(self, decay: float = 0.0) -> None:
        """Copy the model into the target network (`decay > 0`: a soft, Polyak update)."""
        self.model.sync_weights_to(self.target_model, decay=decay)

    def learn(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminal: torch.Tensor,
        weight: torch.Tensor | None = None,
    ) -> DQNStats:
        """One gradient step on a batch of transitions.

        Args:
            obs: `(B, *obs_shape)` observations.
            action: `(B,)` int64 actions taken.
            reward: `(B,)` rewards.
            next_obs: `(B, *obs_shape)` the observations after the actions.
            terminal: `(B,)` 1 where `next_obs` is a terminal state (not for truncations).
            weight: `(B,)` importance-sampling weights of a prioritized replay (default: 1).
        """
        with torch.no_grad():
            next_q_target = self.target_model(next_obs)
            if self.double:
                next_action = self.model(next_obs).argmax(dim=1, keepdim=True)
            else:
                next_action = next_q_target.argmax(dim=1, keepdim=True)
            next_q = next_q_target.gather(1, next_action).squeeze(1)
            y = td_target(reward, next_q, terminal, self.gamma)

        q = self.model(obs).gather(1, action.long().unsqueeze(1)).squeeze(1)
        if self.loss == "huber":
            elementwise = F.smooth_l1_loss(q, y, reduction="none")
        else:
            elementwise = F.mse_loss(q, y, reduction="none")
        loss = elementwise.mean() if weight is None else (weight * elementwise).mean()

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        return DQNStats(
            loss=loss.item(),
            q_mean=q.mean().item(),
            td_error=(y - q).abs().detach().cpu().numpy(),
        )

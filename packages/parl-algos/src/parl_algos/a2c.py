"""A2C, the synchronous advantage actor-critic.

Mnih et al., "Asynchronous methods for deep reinforcement learning", ICML 2016,
https://arxiv.org/abs/1602.01783 (A3C; A2C is its synchronous, batched form), with advantages
from generalized advantage estimation (Schulman et al., 2016, https://arxiv.org/abs/1506.02438).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import parl
from parl_algos._actor_critic import ActorCriticAlgorithm
from parl_algos._common import check_positive, clip_grad_norm

__all__ = ["A2C", "A2CStats"]


@dataclass(frozen=True)
class A2CStats:
    """What one `A2C.learn` call did."""

    policy_loss: float
    """`-mean(A * log pi(a|s))`."""
    value_loss: float
    """`mean((V(s) - target)^2)`."""
    entropy: float
    """Mean entropy of the policy on the batch."""
    grad_norm: float
    """Norm of the gradient before clipping."""


class A2C(ActorCriticAlgorithm):
    """Advantage actor-critic: one gradient step per batch of on-policy experience.

    The learner only needs flat batches `(obs, action, advantage, value_target)`; where they
    come from (a local `VectorCollector`, remote actors each stepping their own environments)
    is the caller's business, and `parl_algos.rollout.compute_advantages` computes them with
    GAE. The loss is `policy_loss + vf_coef * value_loss - ent_coef * entropy`, minimised with
    RMSprop as in the paper.

    Args:
        model: a `parl.Model` with `policy(obs)` (logits, or a distribution) and `value(obs)`.
        lr: RMSprop learning rate.
        vf_coef: weight of the value loss.
        ent_coef: weight of the entropy bonus.
        max_grad_norm: clip the gradient's global norm to this (None: no clipping).
        rms_alpha: RMSprop smoothing constant.
        rms_eps: RMSprop epsilon (inside the square root's denominator).
        normalize_advantage: standardise the advantages of each batch.
    """

    def __init__(
        self,
        model: parl.Model,
        *,
        lr: float = 7e-4,
        vf_coef: float = 0.5,
        ent_coef: float = 0.0,
        max_grad_norm: float | None = 0.5,
        rms_alpha: float = 0.99,
        rms_eps: float = 1e-5,
        normalize_advantage: bool = False,
    ) -> None:
        super().__init__(model)
        check_positive("A2C", lr=lr)
        self.vf_coef = vf_coef
        self.ent_coef = ent_coef
        self.max_grad_norm = max_grad_norm
        self.normalize_advantage = normalize_advantage
        self.optimizer = torch.optim.RMSprop(
            model.parameters(), lr=lr, alpha=rms_alpha, eps=rms_eps
        )

    def learn(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        advantage: torch.Tensor,
        value_target: torch.Tensor,
    ) -> A2CStats:
        """One gradient step on a flat batch of `(obs, action, advantage, value_target)`."""
        self.optimizer.zero_grad(set_to_none=True)
        stats = self.backward(obs, action, advantage, value_target)
        self.optimizer.step()
        return stats

    def backward(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        advantage: torch.Tensor,
        value_target: torch.Tensor,
    ) -> A2CStats:
        """Compute the loss of a batch and leave its (clipped) gradient in the model's `.grad`.

        `learn` is `zero_grad`, this, and the optimizer's step; `A3C`'s actors stop before
        the step and send the gradient instead.
        """
        if self.normalize_advantage and advantage.numel() > 1:
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        dist, value = self.distribution_and_value(obs)
        log_prob = dist.log_prob(action)

        policy_loss = -(advantage * log_prob).mean()
        value_loss = F.mse_loss(value, value_target)
        entropy = dist.entropy().mean()
        loss = policy_loss + self.vf_coef * value_loss - self.ent_coef * entropy

        loss.backward()
        grad_norm = clip_grad_norm(self.model.parameters(), self.max_grad_norm)
        return A2CStats(
            policy_loss=policy_loss.item(),
            value_loss=value_loss.item(),
            entropy=entropy.item(),
            grad_norm=grad_norm,
        )

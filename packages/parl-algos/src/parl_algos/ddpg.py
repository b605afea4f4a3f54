"""DDPG, deep deterministic policy gradient.

Lillicrap et al., "Continuous control with deep reinforcement learning", ICLR 2016,
https://arxiv.org/abs/1509.02971.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import parl
from parl_algos._common import frozen
from parl_algos._continuous import DeterministicActorCritic
from parl_algos.functional import td_target

__all__ = ["DDPG", "DDPGStats"]


@dataclass(frozen=True)
class DDPGStats:
    """What one `DDPG.learn` call did."""

    critic_loss: float
    """`mean((Q(s, a) - y)^2)` with `y = r + gamma Q'(s', mu'(s'))`."""
    actor_loss: float
    """`-mean(Q(s, mu(s)))`."""
    q_mean: float
    """Mean `Q(s, a)` of the batch."""


class DDPG(DeterministicActorCritic):
    """Deep deterministic policy gradient: a Q-function critic and an actor that climbs it.

    Each `learn` call takes one critic step towards the target networks' TD target, one actor
    step along `grad_a Q(s, a)` at `a = mu(s)`, and then moves the targets by `tau`.

    Args:
        model: a `parl.Model` with `policy(obs)` -> actions in `[-1, 1]`, `value(obs, action)`
            -> `(batch,)` Q-values, `get_actor_params()` and `get_critic_params()`.
        actor_lr: Adam learning rate of the actor.
        critic_lr: Adam learning rate of the critic.
        gamma: discount factor.
        tau: Polyak rate of the target networks.
        exploration_noise: standard deviation of the Gaussian noise `sample` adds to actions.
        seed: seed of the exploration noise.
    """

    def __init__(
        self,
        model: parl.Model,
        *,
        actor_lr: float = 1e-3,
        critic_lr: float = 1e-3,
        gamma: float = 0.99,
        tau: float = 0.005,
        exploration_noise: float = 0.1,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            model,
            actor_lr=actor_lr,
            critic_lr=critic_lr,
            gamma=gamma,
            tau=tau,
            exploration_noise=exploration_noise,
            seed=seed,
        )

    def learn(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminal: torch.Tensor,
    ) -> DDPGStats:
        """One critic step, one actor step and a target update on a batch of transitions."""
        with torch.no_grad():
            next_q = self.target_model.value(next_obs, self.target_model.policy(next_obs))
            y = td_target(reward, next_q.reshape(-1), terminal, self.gamma)
        q = self.model.value(obs, action).reshape(-1)
        critic_loss = F.mse_loss(q, y)
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optimizer.step()

        with frozen(self.model.get_critic_params()):
            actor_loss = -self.model.value(obs, self.model.policy(obs)).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optimizer.step()

        self.sync_target()
        return DDPGStats(
            critic_loss=critic_loss.item(), actor_loss=actor_loss.item(), q_mean=q.mean().item()
        )

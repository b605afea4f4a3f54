"""TD3, twin delayed deep deterministic policy gradient.

Fujimoto et al., "Addressing function approximation error in actor-critic methods", ICML 2018,
https://arxiv.org/abs/1802.09477.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import parl
from parl_algos._common import check_positive, frozen
from parl_algos._continuous import DeterministicActorCritic
from parl_algos.functional import td_target

__all__ = ["TD3", "TD3Stats"]


@dataclass(frozen=True)
class TD3Stats:
    """What one `TD3.learn` call did."""

    critic_loss: float
    """`mean((Q1 - y)^2) + mean((Q2 - y)^2)`."""
    actor_loss: float | None
    """`-mean(Q1(s, mu(s)))`, or None when this call did not update the actor (delay)."""
    q_mean: float
    """Mean `Q1(s, a)` of the batch."""


class TD3(DeterministicActorCritic):
    """DDPG with the three fixes of TD3.

    1. Clipped double Q-learning: two critics, and the TD target takes the smaller target
       estimate, `y = r + gamma * min(Q1', Q2')(s', a')`.
    2. Delayed policy updates: the actor and the target networks move once every
       `policy_delay` critic updates.
    3. Target policy smoothing: `a' = clip(mu'(s') + clip(N(0, policy_noise^2), -noise_clip,
       noise_clip), -1, 1)`.

    Args:
        model: a `parl.Model` with `policy(obs)` -> actions in `[-1, 1]`, `value(obs, action)`
            -> a pair `(Q1, Q2)` of `(batch,)` Q-values, `get_actor_params()` and
            `get_critic_params()`.
        actor_lr: Adam learning rate of the actor.
        critic_lr: Adam learning rate of both critics.
        gamma: discount factor.
        tau: Polyak rate of the target networks.
        policy_noise: standard deviation of the target policy smoothing noise.
        noise_clip: bound of the target policy smoothing noise.
        policy_delay: critic updates per actor (and target) update.
        exploration_noise: standard deviation of the Gaussian noise `sample` adds to actions.
        seed: seed of the exploration and smoothing noise.
    """

    _state_attrs = ("total_it",)

    def __init__(
        self,
        model: parl.Model,
        *,
        actor_lr: float = 1e-3,
        critic_lr: float = 1e-3,
        gamma: float = 0.99,
        tau: float = 0.005,
        policy_noise: float = 0.2,
        noise_clip: float = 0.5,
        policy_delay: int = 2,
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
        check_positive("TD3", policy_delay=policy_delay)
        self.policy_noise = policy_noise
        self.noise_clip = noise_clip
        self.policy_delay = policy_delay
        self.total_it = 0

    def learn(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminal: torch.Tensor,
    ) -> TD3Stats:
        """One critic step; every `policy_delay` calls also an actor step and a target update."""
        self.total_it += 1
        with torch.no_grad():
            next_action = self.target_model.policy(next_obs)
            noise = torch.randn(next_action.shape, generator=self._generator).to(next_action)
            noise = (noise * self.policy_noise).clamp(-self.noise_clip, self.noise_clip)
            next_action = (next_action + noise).clamp(-1.0, 1.0)
            next_q1, next_q2 = self.target_model.value(next_obs, next_action)
            next_q = torch.min(next_q1, next_q2).reshape(-1)
            y = td_target(reward, next_q, terminal, self.gamma)
        q1, q2 = self.model.value(obs, action)
        q1, q2 = q1.reshape(-1), q2.reshape(-1)
        critic_loss = F.mse_loss(q1, y) + F.mse_loss(q2, y)
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optimizer.step()

        actor_loss = None
        if self.total_it % self.policy_delay == 0:
            with frozen(self.model.get_critic_params()):
                q1_pi, _ = self.model.value(obs, self.model.policy(obs))
            actor_loss_t = -q1_pi.mean()
            self.actor_optimizer.zero_grad(set_to_none=True)
            actor_loss_t.backward()
            self.actor_optimizer.step()
            actor_loss = actor_loss_t.item()
            self.sync_target()
        return TD3Stats(
            critic_loss=critic_loss.item(), actor_loss=actor_loss, q_mean=q1.mean().item()
        )

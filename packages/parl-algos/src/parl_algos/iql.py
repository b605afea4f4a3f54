"""IQL, implicit Q-learning: offline RL that never queries Q on actions outside the dataset.

Kostrikov, Nair and Levine, "Offline Reinforcement Learning with Implicit Q-Learning", 2021,
https://arxiv.org/abs/2110.06169.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributions import Normal

import parl
from parl_algos._common import check_positive, soft_update
from parl_algos._continuous import check_actor_critic_model
from parl_algos.functional import td_target

__all__ = ["IQL", "IQLStats", "awr_weights", "expectile_loss"]

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def expectile_loss(diff: torch.Tensor, expectile: float) -> torch.Tensor:
    """The asymmetric squared loss `mean(|tau - 1(u < 0)| * u^2)` of `u = Q(s, a) - V(s)`.

    With `tau = 0.5` it is half the squared error (V learns the mean); as `tau -> 1`, V learns
    the maximum of Q over the dataset's actions (the paper's eq. 5).
    """
    weight = torch.where(diff < 0, 1.0 - expectile, expectile)
    return (weight * diff.pow(2)).mean()


def awr_weights(advantage: torch.Tensor, beta: float, max_weight: float) -> torch.Tensor:
    """Advantage-weighted regression's weights `min(exp(beta * A), max_weight)`, no gradient.

    The exponent is clipped before `exp`, so large advantages cannot overflow.
    """
    with torch.no_grad():
        return torch.exp((beta * advantage).clamp(max=math.log(max_weight)))


@dataclass(frozen=True)
class IQLStats:
    """What one `IQL.learn` call did."""

    value_loss: float
    """`expectile_loss(min(Q1', Q2')(s, a) - V(s))` with the target critics."""
    critic_loss: float
    """`0.5 * (mean((Q1 - y)^2) + mean((Q2 - y)^2))` with `y = r + gamma (1 - d) V(s')`."""
    actor_loss: float
    """`-mean(w * log pi(a|s))` over the dataset's actions, `w` the AWR weights."""
    advantage: float
    """Mean `min(Q1', Q2')(s, a) - V(s)` over the batch."""
    weight: float
    """Mean AWR weight (after clipping)."""
    clipped: float
    """Fraction of the batch whose weight was clipped at `max_weight`."""


class IQL(parl.Algorithm):
    """Implicit Q-learning: expectile value, Bellman Q on V, advantage-weighted policy.

    Each `learn` call takes three steps on one batch of dataset transitions: the state value V
    regresses on the target critics' `min(Q1, Q2)(s, a)` with the expectile loss; both critics
    regress on `r + gamma (1 - d) V(s')`; the policy maximises the log-likelihood of the
    dataset's actions weighted by `min(exp(beta * (Q(s, a) - V(s))), max_weight)`. The target
    critics then move by `tau`. No step evaluates Q on an action the dataset does not hold.

    The policy is a Gaussian over actions in `[-1, 1]` with mean `tanh(mean)` and standard
    deviation `exp(log_std)` (clipped to `[LOG_STD_MIN, LOG_STD_MAX]`); `predict` returns
    `tanh(mean)`, `sample` a clipped draw.

    Args:
        model: the actor-critic, as SAC's: `policy(obs)` -> `(mean, log_std)`,
            `value(obs, action)` -> `(Q1, Q2)`, `get_actor_params()`, `get_critic_params()`.
        value_model: a `parl.Model` whose `forward(obs)` is `V(s)`, `(batch,)` or `(batch, 1)`.
        actor_lr: Adam learning rate of the policy.
        critic_lr: Adam learning rate of both critics.
        value_lr: Adam learning rate of V.
        gamma: discount factor.
        tau: Polyak rate of the target critics.
        expectile: the expectile `tau` of V's loss, in `(0, 1)` (0.7 in the paper's MuJoCo runs).
        beta: inverse temperature of the advantage weights (3.0 in the paper's MuJoCo runs).
        max_weight: the advantage weights' upper clip.
    """

    def __init__(
        self,
        model: parl.Model,
        value_model: parl.Model,
        *,
        actor_lr: float = 3e-4,
        critic_lr: float = 3e-4,
        value_lr: float = 3e-4,
        gamma: float = 0.99,
        tau: float = 0.005,
        expectile: float = 0.7,
        beta: float = 3.0,
        max_weight: float = 100.0,
    ) -> None:
        super().__init__(model)
        check_actor_critic_model("IQL", model)
        if not isinstance(value_model, parl.Model):
            raise TypeError(f"IQL: value_model must be a parl.Model, got {type(value_model)}")
        check_positive(
            "IQL",
            actor_lr=actor_lr,
            critic_lr=critic_lr,
            value_lr=value_lr,
            tau=tau,
            beta=beta,
            max_weight=max_weight,
        )
        if not 0.0 < expectile < 1.0:
            raise ValueError(f"IQL: {expectile=} must lie in (0, 1)")
        self.gamma = gamma
        self.tau = tau
        self.expectile = expectile
        self.beta = beta
        self.max_weight = max_weight
        self.value_model = value_model
        self.target_model = copy.deepcopy(model)
        self.target_model.requires_grad_(False)
        self.actor_optimizer = torch.optim.Adam(model.get_actor_params(), lr=actor_lr)
        self.critic_optimizer = torch.optim.Adam(model.get_critic_params(), lr=critic_lr)
        self.value_optimizer = torch.optim.Adam(value_model.parameters(), lr=value_lr)

    def _distribution(self, obs: torch.Tensor) -> Normal:
        mean, log_std = self.model.policy(obs)
        return Normal(torch.tanh(mean), log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp())

    def _value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value_model(obs).reshape(-1)

    @torch.no_grad()
    def predict(self, obs: torch.Tensor) -> torch.Tensor:
        """Return the deterministic action `tanh(mean)` (evaluation)."""
        mean, _ = self.model.policy(obs)
        return torch.tanh(mean)

    @torch.no_grad()
    def sample(self, obs: torch.Tensor) -> torch.Tensor:
        """Return a draw of the Gaussian policy, clipped to `[-1, 1]`."""
        return self._distribution(obs).sample().clamp(-1.0, 1.0)

    def learn(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminal: torch.Tensor,
    ) -> IQLStats:
        """One step on V, the critics and the policy; then a target update."""
        # Value: V(s) -> the expectile of min Q'(s, a) over the dataset's actions at s.
        with torch.no_grad():
            target_q1, target_q2 = self.target_model.value(obs, action)
            target_q = torch.min(target_q1, target_q2).reshape(-1)
        v = self._value(obs)
        value_loss = expectile_loss(target_q - v, self.expectile)
        self.value_optimizer.zero_grad(set_to_none=True)
        value_loss.backward()
        self.value_optimizer.step()

        # Q-function: Q(s, a) -> r + gamma (1 - d) V(s'), no maximum over actions.
        with torch.no_grad():
            y = td_target(reward, self._value(next_obs), terminal, self.gamma)
        q1, q2 = self.model.value(obs, action)
        critic_loss = 0.5 * (F.mse_loss(q1.reshape(-1), y) + F.mse_loss(q2.reshape(-1), y))
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optimizer.step()

        # Policy: advantage-weighted regression onto the dataset's actions.
        advantage = target_q - v.detach()
        weight = awr_weights(advantage, self.beta, self.max_weight)
        log_prob = self._distribution(obs).log_prob(action).sum(-1)
        actor_loss = -(weight * log_prob).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optimizer.step()

        soft_update(self.model.get_critic_params(), self.target_model.get_critic_params(), self.tau)
        return IQLStats(
            value_loss=value_loss.item(),
            critic_loss=critic_loss.item(),
            actor_loss=actor_loss.item(),
            advantage=advantage.mean().item(),
            weight=weight.mean().item(),
            clipped=(self.beta * advantage >= math.log(self.max_weight)).float().mean().item(),
        )

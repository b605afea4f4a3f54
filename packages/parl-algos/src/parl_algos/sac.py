"""SAC, soft actor-critic, with automatic entropy tuning.

Haarnoja et al., "Soft actor-critic algorithms and applications", 2018,
https://arxiv.org/abs/1812.05905 (the version with two Q-functions and a learned temperature).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import parl
from parl_algos._common import check_positive, frozen, soft_update
from parl_algos._continuous import check_actor_critic_model
from parl_algos.functional import sac_actor_loss, sac_alpha_loss, td_target

__all__ = ["SAC", "SACStats"]

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


@dataclass(frozen=True)
class SACStats:
    """What one `SAC.learn` call did."""

    critic_loss: float
    """`0.5 * (mean((Q1 - y)^2) + mean((Q2 - y)^2))` with the soft TD target `y`."""
    actor_loss: float
    """`mean(alpha * log pi(a|s) - min(Q1, Q2)(s, a))`, `a ~ pi(.|s)`."""
    alpha: float
    """The temperature after this call."""
    alpha_loss: float
    """The temperature loss (0 when alpha is fixed)."""
    entropy: float
    """`-mean(log pi(a|s))`, the policy's entropy estimate."""


class SAC(parl.Algorithm):
    """Soft actor-critic: maximise reward plus `alpha` times the policy's entropy.

    The policy is a Gaussian squashed by tanh into `[-1, 1]` (rescale actions to the
    environment's bounds outside, e.g. with `gymnasium.wrappers.RescaleAction`); its log-std is
    clipped to `[LOG_STD_MIN, LOG_STD_MAX]`. Each `learn` call takes one step on the twin
    critics, one on the actor, one on the temperature (when it is learned), and moves the target
    critics by `tau`, in the order of the paper's Algorithm 1.

    Args:
        model: a `parl.Model` with `policy(obs)` -> `(mean, log_std)` of the pre-squash Gaussian,
            `value(obs, action)` -> a pair `(Q1, Q2)` of `(batch,)` Q-values,
            `get_actor_params()` and `get_critic_params()`.
        actor_lr: Adam learning rate of the actor.
        critic_lr: Adam learning rate of both critics.
        alpha_lr: Adam learning rate of `log alpha`.
        gamma: discount factor.
        tau: Polyak rate of the target critics.
        alpha: a fixed temperature; None learns it (automatic entropy tuning).
        initial_alpha: the learned temperature's starting value.
        target_entropy: the entropy the learned temperature aims for (default `-act_dim`,
            found from the model's first `policy` output).
    """

    _state_attrs = ("target_entropy",)

    def __init__(
        self,
        model: parl.Model,
        *,
        actor_lr: float = 3e-4,
        critic_lr: float = 3e-4,
        alpha_lr: float = 3e-4,
        gamma: float = 0.99,
        tau: float = 0.005,
        alpha: float | None = None,
        initial_alpha: float = 1.0,
        target_entropy: float | None = None,
    ) -> None:
        super().__init__(model)
        check_actor_critic_model("SAC", model)
        check_positive(
            "SAC",
            actor_lr=actor_lr,
            critic_lr=critic_lr,
            alpha_lr=alpha_lr,
            tau=tau,
            initial_alpha=initial_alpha if alpha is None else alpha,
        )
        self.gamma = gamma
        self.tau = tau
        self.auto_alpha = alpha is None
        self.target_entropy = target_entropy
        self.target_model = copy.deepcopy(model)
        self.target_model.requires_grad_(False)
        self.actor_optimizer = torch.optim.Adam(model.get_actor_params(), lr=actor_lr)
        self.critic_optimizer = torch.optim.Adam(model.get_critic_params(), lr=critic_lr)
        start = initial_alpha if alpha is None else alpha
        self.log_alpha = torch.tensor(math.log(start), requires_grad=self.auto_alpha)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=alpha_lr)

    @property
    def alpha(self) -> float:
        """The current temperature."""
        return self.log_alpha.exp().item()

    def _action_and_log_prob(
        self, model: parl.Model, obs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw `a = tanh(u)`, `u ~ N(mean, std)` (reparameterized); return `(a, log pi(a|s))`."""
        mean, log_std = model.policy(obs)
        return self._squashed_sample(mean, log_std)

    @staticmethod
    def _squashed_sample(
        mean: torch.Tensor, log_std: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(a, log pi(a))` of one draw of the squashed Gaussian per row of `mean, log_std`."""
        std = log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()
        u = mean + std * torch.randn_like(mean)
        gaussian_log_prob = (-0.5 * ((u - mean) / std) ** 2 - std.log()).sum(-1) - (
            0.5 * math.log(2 * math.pi) * u.shape[-1]
        )
        # log |d tanh(u)/du| = log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stably.
        log_det = (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)
        return torch.tanh(u), gaussian_log_prob - log_det

    @torch.no_grad()
    def predict(self, obs: torch.Tensor) -> torch.Tensor:
        """Return the deterministic action `tanh(mean)` (evaluation)."""
        mean, _ = self.model.policy(obs)
        return torch.tanh(mean)

    @torch.no_grad()
    def sample(self, obs: torch.Tensor) -> torch.Tensor:
        """Return an action drawn from the squashed Gaussian policy (data collection)."""
        return self._action_and_log_prob(self.model, obs)[0]

    def _critic_loss(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminal: torch.Tensor,
        alpha: torch.Tensor,
    ) -> torch.Tensor:
        """The twin critics' loss; subclasses (CQL) add their terms to it."""
        # Soft Q-function: y = r + gamma (1 - d) (min Q'(s', a') - alpha log pi(a'|s')).
        with torch.no_grad():
            next_action, next_log_prob = self._action_and_log_prob(self.model, next_obs)
            next_q1, next_q2 = self.target_model.value(next_obs, next_action)
            next_v = torch.min(next_q1, next_q2).reshape(-1) - alpha * next_log_prob
            y = td_target(reward, next_v, terminal, self.gamma)
        q1, q2 = self.model.value(obs, action)
        return 0.5 * (F.mse_loss(q1.reshape(-1), y) + F.mse_loss(q2.reshape(-1), y))

    def learn(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminal: torch.Tensor,
    ) -> SACStats:
        """One step on the critics, the actor and the temperature; then a target update."""
        alpha = self.log_alpha.detach().exp()
        if self.target_entropy is None:
            self.target_entropy = -float(action.shape[-1])

        critic_loss = self._critic_loss(obs, action, reward, next_obs, terminal, alpha)
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optimizer.step()

        # Policy: minimise alpha log pi(a|s) - min Q(s, a), a reparameterized.
        new_action, log_prob = self._action_and_log_prob(self.model, obs)
        with frozen(self.model.get_critic_params()):
            q1_pi, q2_pi = self.model.value(obs, new_action)
        actor_loss = sac_actor_loss(log_prob, torch.min(q1_pi, q2_pi).reshape(-1), alpha)
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optimizer.step()

        # Temperature: raise alpha while the entropy is below the target, lower it above.
        alpha_loss = torch.zeros(())
        if self.auto_alpha:
            alpha_loss = sac_alpha_loss(self.log_alpha, log_prob, self.target_entropy)
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_optimizer.step()

        soft_update(self.model.get_critic_params(), self.target_model.get_critic_params(), self.tau)
        return SACStats(
            critic_loss=critic_loss.item(),
            actor_loss=actor_loss.item(),
            alpha=self.alpha,
            alpha_loss=alpha_loss.item(),
            entropy=-log_prob.mean().item(),
        )

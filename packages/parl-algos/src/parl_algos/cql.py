"""CQL, conservative Q-learning, on top of SAC: offline RL from a fixed dataset.

Kumar et al., "Conservative Q-Learning for Offline Reinforcement Learning", 2020,
https://arxiv.org/abs/2006.04779 (the CQL(H) variant, eq. 4, with SAC as the actor-critic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import parl
from parl_algos._common import check_positive
from parl_algos.functional import td_target
from parl_algos.sac import SAC, SACStats

__all__ = ["CQL", "CQLStats", "cql_penalty"]


def cql_penalty(
    q_sampled: torch.Tensor,
    log_density: torch.Tensor,
    q_data: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """CQL(H)'s regulariser: a soft maximum of Q over actions minus Q on the dataset's actions.

    `mean_s[T * log((1/M) sum_j exp((Q(s, a_j) - log mu(a_j|s)) / T))] - mean_s[Q(s, a_data)]`:
    the importance-sampled estimate of `T log integral exp(Q(s, a) / T) da` (the paper's
    appendix F, with samples `a_j` drawn from distributions of density `mu`), minus the
    dataset's Q-values. Minimising it pushes Q down on actions the dataset does not hold and up
    on those it does.

    Args:
        q_sampled: `(batch, M)` Q-values of `M` sampled actions per state.
        log_density: `(batch, M)` log-density under which each sampled action was drawn
            (treated as a constant).
        q_data: `(batch,)` Q-values of the dataset's actions.
        temperature: `T`; small values make the soft maximum a hard one.
    """
    m = q_sampled.shape[-1]
    logits = (q_sampled - log_density.detach()) / temperature
    soft_max = temperature * (torch.logsumexp(logits, dim=-1) - math.log(m))
    return soft_max.mean() - q_data.mean()


@dataclass(frozen=True)
class CQLStats(SACStats):
    """What one `CQL.learn` call did (SAC's statistics and the conservative terms)."""

    cql_penalty: float
    """`cql_penalty` averaged over the two critics (before the weight)."""
    cql_weight: float
    """The penalty's weight this call (the Lagrange multiplier when it is learned)."""
    q_data: float
    """Mean `Q1(s, a)` over the batch's dataset actions."""


class CQL(SAC):
    """Conservative Q-learning: SAC whose critics are penalised for valuing unseen actions.

    Each critic's loss is SAC's soft Bellman error plus `cql_weight * cql_penalty`, with the
    soft maximum over actions estimated from `num_sampled_actions` actions per state of each of
    three kinds: uniform in `[-1, 1]^d` (density `2^-d`), drawn from the current policy at `s`,
    and drawn from it at `s'` (each divided by its density, the importance correction). With a
    `target_action_gap` the weight is a learned Lagrange multiplier that keeps the penalty near
    the gap (CQL-Lagrange). The actor and the temperature learn as in SAC.

    Args:
        model: the SAC model: `policy(obs)` -> `(mean, log_std)`, `value(obs, action)` ->
            `(Q1, Q2)`, `get_actor_params()` and `get_critic_params()`.
        actor_lr: Adam learning rate of the actor.
        critic_lr: Adam learning rate of both critics.
        alpha_lr: Adam learning rate of SAC's `log alpha`.
        gamma: discount factor.
        tau: Polyak rate of the target critics.
        alpha: a fixed SAC temperature; None learns it.
        initial_alpha: the learned temperature's starting value.
        target_entropy: the entropy the learned temperature aims for (default `-act_dim`).
        cql_weight: the penalty's weight (`alpha` in the CQL paper); with a
            `target_action_gap`, the Lagrange multiplier's starting value.
        num_sampled_actions: actions of each of the three kinds per state.
        temperature: the soft maximum's temperature.
        target_action_gap: None for a fixed weight; otherwise the penalty the learned
            multiplier aims for (CQL-Lagrange, the paper's eq. 30).
        lagrange_lr: Adam learning rate of the multiplier's logarithm.
    """

    def __init__(
        self,
        model: parl.Model,
        *,
        actor_lr: float = 1e-4,
        critic_lr: float = 3e-4,
        alpha_lr: float = 1e-4,
        gamma: float = 0.99,
        tau: float = 0.005,
        alpha: float | None = None,
        initial_alpha: float = 1.0,
        target_entropy: float | None = None,
        cql_weight: float = 5.0,
        num_sampled_actions: int = 10,
        temperature: float = 1.0,
        target_action_gap: float | None = None,
        lagrange_lr: float = 3e-4,
    ) -> None:
        super().__init__(
            model,
            actor_lr=actor_lr,
            critic_lr=critic_lr,
            alpha_lr=alpha_lr,
            gamma=gamma,
            tau=tau,
            alpha=alpha,
            initial_alpha=initial_alpha,
            target_entropy=target_entropy,
        )
        check_positive(
            "CQL",
            cql_weight=cql_weight,
            num_sampled_actions=num_sampled_actions,
            temperature=temperature,
            lagrange_lr=lagrange_lr,
        )
        self.num_sampled_actions = int(num_sampled_actions)
        self.temperature = temperature
        self.target_action_gap = target_action_gap
        self.lagrange = target_action_gap is not None
        self.log_cql_weight = torch.tensor(math.log(cql_weight), requires_grad=self.lagrange)
        self.lagrange_optimizer = torch.optim.Adam([self.log_cql_weight], lr=lagrange_lr)
        self._last: tuple[float, float, float] = (0.0, cql_weight, 0.0)

    def _critic_loss(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminal: torch.Tensor,
        alpha: torch.Tensor,
    ) -> torch.Tensor:
        """SAC's soft Bellman error plus the weighted conservative penalty of each critic.

        One forward pass of the policy over the states `s` and `s'` gives the Gaussians of
        every policy sample (the TD target's at `s'` and the penalty's at `s` and `s'`); one
        forward pass of each critic values the dataset's action and the `3N` sampled ones.
        """
        batch, act_dim = action.shape[0], action.shape[-1]
        n = self.num_sampled_actions
        with torch.no_grad():
            mean, log_std = self.model.policy(torch.cat([obs, next_obs]))
            # N draws at s and N + 1 at s' (the last for the TD target) from those Gaussians.
            shape = (batch, n, act_dim)
            pi, log_pi = self._squashed_sample(
                mean[:batch, None].expand(shape), log_std[:batch, None].expand(shape)
            )
            shape = (batch, n + 1, act_dim)
            next_pi, next_log_pi = self._squashed_sample(
                mean[batch:, None].expand(shape), log_std[batch:, None].expand(shape)
            )
            # Soft Q-function: y = r + gamma (1 - d) (min Q'(s', a') - alpha log pi(a'|s')).
            next_q1, next_q2 = self.target_model.value(next_obs, next_pi[:, n])
            next_v = torch.min(next_q1, next_q2).reshape(-1) - alpha * next_log_pi[:, n]
            y = td_target(reward, next_v, terminal, self.gamma)
            # The penalty's samples: uniform in [-1, 1]^d (density 2^-d), pi(.|s), pi(.|s').
            uniform = torch.rand(batch, n, act_dim, device=obs.device) * 2.0 - 1.0
            sampled = torch.cat([uniform, pi, next_pi[:, :n]], dim=1)
            log_density = torch.cat(
                [torch.full_like(log_pi, -act_dim * math.log(2.0)), log_pi, next_log_pi[:, :n]],
                dim=1,
            )
        m = sampled.shape[1]
        all_actions = torch.cat([action.unsqueeze(1), sampled], dim=1).reshape(-1, act_dim)
        q1, q2 = self.model.value(obs.repeat_interleave(m + 1, 0), all_actions)
        q1, q2 = q1.reshape(batch, m + 1), q2.reshape(batch, m + 1)
        bellman_loss = 0.5 * (F.mse_loss(q1[:, 0], y) + F.mse_loss(q2[:, 0], y))
        penalty = 0.5 * (
            cql_penalty(q1[:, 1:], log_density, q1[:, 0], self.temperature)
            + cql_penalty(q2[:, 1:], log_density, q2[:, 0], self.temperature)
        )
        weight = self.log_cql_weight.exp().clamp(max=1e6)
        if self.lagrange:
            # The multiplier rises while the penalty exceeds the gap and falls below it.
            lagrange_loss = -weight * (penalty.detach() - self.target_action_gap)
            self.lagrange_optimizer.zero_grad(set_to_none=True)
            lagrange_loss.backward()
            self.lagrange_optimizer.step()
            weight = self.log_cql_weight.detach().exp().clamp(max=1e6)
            penalty_term = weight * (penalty - self.target_action_gap)
        else:
            penalty_term = weight.detach() * penalty
        self._last = (penalty.item(), weight.item(), q1[:, 0].mean().item())
        return bellman_loss + penalty_term

    def learn(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        next_obs: torch.Tensor,
        terminal: torch.Tensor,
    ) -> CQLStats:
        """One conservative step on the critics, then SAC's actor, temperature and target steps."""
        stats = super().learn(obs, action, reward, next_obs, terminal)
        penalty, weight, q_data = self._last
        return CQLStats(**vars(stats), cql_penalty=penalty, cql_weight=weight, q_data=q_data)

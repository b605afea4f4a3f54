"""IMPALA's learner: actor-critic with V-trace off-policy correction.

Espeholt et al., "IMPALA: Scalable distributed deep-RL with importance weighted actor-learner
architectures", ICML 2018, https://arxiv.org/abs/1802.01561.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributions import Categorical

import parl
from parl_algos._actor_critic import ActorCriticAlgorithm
from parl_algos._common import check_positive, clip_grad_norm
from parl_algos._distributions import as_distribution
from parl_algos.functional import vtrace

__all__ = ["IMPALA", "IMPALAStats"]


@dataclass(frozen=True)
class IMPALAStats:
    """What one `IMPALA.learn` call did."""

    policy_loss: float
    """`-mean(rho_s (r_s + gamma v_{s+1} - V(x_s)) log pi(a_s|x_s))`."""
    value_loss: float
    """`0.5 * mean((v_s - V(x_s))^2)`."""
    entropy: float
    """Mean entropy of the learner's policy on the batch."""
    mean_rho: float
    """Mean importance weight `pi/mu` before clipping (1 when actors are up to date)."""
    grad_norm: float
    """Norm of the gradient before clipping."""


class IMPALA(ActorCriticAlgorithm):
    """The IMPALA learner: one gradient step per batch of trajectories from behaviour policies.

    Actors (local or remote) run a possibly stale copy of the policy, `mu`, and send
    trajectories together with `mu`'s logits; the learner corrects for the lag with V-trace
    (`parl_algos.functional.vtrace`) and minimises
    `policy_loss + vf_coef * value_loss - ent_coef * entropy` with RMSprop, as the paper does.
    Environment stepping and inference stay with the actors: the learner never touches an
    environment. The actors need only `sample` (or `distribution`) and `get_weights`.

    Batches are time-major: `T` steps of `B` trajectories. An episode end (termination or
    truncation) cuts the trace there (discount 0).

    Args:
        model: a `parl.Model` with `policy(obs)` -> logits and `value(obs)`.
        lr: RMSprop learning rate.
        gamma: discount factor.
        vf_coef: weight of the value loss (the paper's baseline cost).
        ent_coef: weight of the entropy bonus.
        rho_bar: truncation of the importance weights in V-trace's TD errors.
        c_bar: truncation of V-trace's trace coefficients.
        max_grad_norm: clip the gradient's global norm to this (None: no clipping).
        rms_alpha: RMSprop smoothing constant.
        rms_eps: RMSprop epsilon.
    """

    def __init__(
        self,
        model: parl.Model,
        *,
        lr: float = 6e-4,
        gamma: float = 0.99,
        vf_coef: float = 0.5,
        ent_coef: float = 0.01,
        rho_bar: float = 1.0,
        c_bar: float = 1.0,
        max_grad_norm: float | None = 40.0,
        rms_alpha: float = 0.99,
        rms_eps: float = 0.01,
    ) -> None:
        super().__init__(model)
        check_positive("IMPALA", lr=lr, rho_bar=rho_bar, c_bar=c_bar)
        self.gamma = gamma
        self.vf_coef = vf_coef
        self.ent_coef = ent_coef
        self.rho_bar = rho_bar
        self.c_bar = c_bar
        self.max_grad_norm = max_grad_norm
        self.optimizer = torch.optim.RMSprop(
            model.parameters(), lr=lr, alpha=rms_alpha, eps=rms_eps
        )

    def learn(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        behaviour_logits: torch.Tensor,
        reward: torch.Tensor,
        done: torch.Tensor,
    ) -> IMPALAStats:
        """One gradient step on a batch of trajectories.

        Args:
            obs: `(T + 1, B, *obs_shape)`: the observations, the last one after the last step.
            action: `(T, B)` actions taken by the behaviour policy.
            behaviour_logits: `(T, B, n_actions)` the behaviour policy's logits at each step.
            reward: `(T, B)` rewards.
            done: `(T, B)` 1 where the step ended an episode.
        """
        steps, batch = reward.shape
        flat_obs = obs.reshape(-1, *obs.shape[2:])
        # One pass for the values of every observation and the policy (the last row's
        # policy unused): a torso both heads share runs once.
        policy_all, value_all = self.policy_and_value(flat_obs)
        value_all = value_all.reshape(steps + 1, batch)
        value, bootstrap_value = value_all[:-1], value_all[-1]
        dist = as_distribution(policy_all[: steps * batch])
        target_log_prob = dist.log_prob(action.reshape(-1)).reshape(steps, batch)
        behaviour_log_prob = Categorical(logits=behaviour_logits).log_prob(action)
        log_rho = target_log_prob.detach() - behaviour_log_prob
        discount = self.gamma * (1.0 - done.to(reward.dtype))

        vs, pg_advantage = vtrace(
            log_rho,
            discount,
            reward,
            value.detach(),
            bootstrap_value.detach(),
            rho_bar=self.rho_bar,
            c_bar=self.c_bar,
        )
        policy_loss = -(pg_advantage * target_log_prob).mean()
        value_loss = 0.5 * ((vs - value) ** 2).mean()
        entropy = dist.entropy().mean()
        loss = policy_loss + self.vf_coef * value_loss - self.ent_coef * entropy

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = clip_grad_norm(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        return IMPALAStats(
            policy_loss=policy_loss.item(),
            value_loss=value_loss.item(),
            entropy=entropy.item(),
            mean_rho=log_rho.exp().mean().item(),
            grad_norm=grad_norm,
        )

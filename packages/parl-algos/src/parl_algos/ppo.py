"""PPO, proximal policy optimization, with its clipped and adaptive-KL-penalty objectives.

Schulman et al., "Proximal policy optimization algorithms", 2017,
https://arxiv.org/abs/1707.06347. The implementation details (advantage normalisation per
minibatch, value clipping, a global gradient-norm clip, Adam's epsilon of 1e-5) are those of the
paper's reference code, as catalogued by Huang et al., "The 37 implementation details of PPO",
ICLR blog track 2022.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

import parl
from parl_algos._actor_critic import ActorCriticAlgorithm
from parl_algos._common import check_positive, clip_grad_norm
from parl_algos._optim import FlatAdamStep
from parl_algos.functional import ppo_clip_loss

__all__ = ["PPO", "PPOStats"]


@dataclass(frozen=True)
class PPOStats:
    """What one `PPO.learn` call did (losses are means over its minibatch updates)."""

    policy_loss: float
    """The surrogate loss (clipped, or with the KL penalty)."""
    value_loss: float
    """Squared error of the value function (of its clipped prediction, where larger)."""
    entropy: float
    """Mean entropy of the policy."""
    approx_kl: float
    """`KL(pi_old || pi)` estimated on the batch after the last update."""
    clip_fraction: float
    """Fraction of samples whose probability ratio left `[1 - clip, 1 + clip]`."""
    kl_coef: float
    """The KL-penalty coefficient beta in use after this call (0 for the clip variant)."""
    updates: int
    """How many minibatch gradient steps were taken."""


class PPO(ActorCriticAlgorithm):
    """Proximal policy optimization: several epochs of minibatch updates per batch.

    `learn` takes one batch of on-policy experience (a flat `AdvantageBatch`'s fields) and
    runs `update_epochs` passes over it in shuffled minibatches of `minibatch_size`.

    Variants (`variant`):

    - `"clip"`: maximise `min(r A, clip(r, 1 - clip_coef, 1 + clip_coef) A)` (paper eq. 7).
    - `"kl"`: maximise `r A - beta KL(pi_old, pi)` (eq. 8), with beta adapted after each call:
      halved when the KL fell below `kl_target / 1.5`, doubled above `kl_target * 1.5`. The KL is
      estimated from the sampled actions as `mean((r - 1) - log r)`, unbiased and non-negative.

    Args:
        model: a `parl.Model` with `policy(obs)` (logits, or a distribution) and `value(obs)`.
        lr: Adam learning rate (change `optimizer.param_groups` to anneal it).
        variant: `"clip"` or `"kl"`, see above.
        clip_coef: epsilon of the clipped objective.
        kl_target: the KL per update that the `"kl"` variant aims for.
        kl_coef: the initial beta of the `"kl"` variant.
        update_epochs: passes over each batch.
        minibatch_size: samples per gradient step.
        normalize_advantage: standardise the advantages of each minibatch.
        clip_value: clip the value prediction to within this of its value at collection time,
            and take the larger of the clipped and unclipped errors (None: no clipping).
        vf_coef: weight of the value loss.
        ent_coef: weight of the entropy bonus.
        max_grad_norm: clip the gradient's global norm to this (None: no clipping).
        adam_eps: Adam's epsilon.
        seed: seed of the minibatch shuffling.
    """

    _state_attrs = ("kl_coef",)

    def __init__(
        self,
        model: parl.Model,
        *,
        lr: float = 3e-4,
        variant: Literal["clip", "kl"] = "clip",
        clip_coef: float = 0.2,
        kl_target: float = 0.01,
        kl_coef: float = 1.0,
        update_epochs: int = 10,
        minibatch_size: int = 64,
        normalize_advantage: bool = True,
        clip_value: float | None = None,
        vf_coef: float = 0.5,
        ent_coef: float = 0.0,
        max_grad_norm: float | None = 0.5,
        adam_eps: float = 1e-5,
        seed: int | None = None,
    ) -> None:
        super().__init__(model)
        if variant not in ("clip", "kl"):
            raise ValueError(f"PPO: {variant=} must be 'clip' or 'kl'")
        check_positive(
            "PPO",
            lr=lr,
            clip_coef=clip_coef,
            kl_target=kl_target,
            kl_coef=kl_coef,
            update_epochs=update_epochs,
            minibatch_size=minibatch_size,
        )
        self.variant = variant
        self.clip_coef = clip_coef
        self.kl_target = kl_target
        self.kl_coef = kl_coef if variant == "kl" else 0.0
        self.update_epochs = update_epochs
        self.minibatch_size = minibatch_size
        self.normalize_advantage = normalize_advantage
        self.clip_value = clip_value
        self.vf_coef = vf_coef
        self.ent_coef = ent_coef
        self.max_grad_norm = max_grad_norm
        # One list, kept: listing a model's parameters on every minibatch update is a cost of
        # its own on a small model; Adam's multi-tensor kernels take the same steps bit for bit.
        self._parameters = list(model.parameters())
        self.optimizer = torch.optim.Adam(self._parameters, lr=lr, eps=adam_eps, foreach=True)
        self._steps: list[tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]] = [
            (self.optimizer, self._parameters)
        ]
        """Each optimizer and the parameters whose gradient it clips (to `max_grad_norm`) and
        steps: PPO's one, over every parameter; MAPPO's actor and critic, each its own."""
        self._flat_step = FlatAdamStep()
        """Clips and steps on flat tensors where it can, bit for bit torch's (`_optim`)."""
        self._generator = torch.Generator().manual_seed(
            int(torch.randint(2**62, ()).item()) if seed is None else seed
        )

    def learn(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        advantage: torch.Tensor,
        value_target: torch.Tensor,
        value: torch.Tensor | None = None,
        old_log_prob: torch.Tensor | None = None,
        weight: torch.Tensor | None = None,
    ) -> PPOStats:
        """Run `update_epochs` epochs of minibatch updates on one batch.

        Args:
            obs: `(B, *obs_shape)` observations.
            action: `(B, ...)` actions taken.
            advantage: `(B,)` advantage estimates.
            value_target: `(B,)` return estimates for the value function.
            value: `(B,)` the value estimates at collection time; needed for value clipping.
            old_log_prob: `(B,)` `log pi_old(a|s)` of the policy that collected the batch. Leave
                it out when that policy is the current one (synchronous single-process
                training): it is then computed here before the first update.
            weight: `(B,)` importance weights of the surrogate's samples (None: all 1). With
                data from an older behaviour policy `mu`, `old_log_prob` of the current policy
                (the proximal one the ratio is clipped around) and `weight = pi_old / mu`
                make the decoupled objective of Hilton et al., "Batch size-invariance for
                policy optimization", 2021, https://arxiv.org/abs/2110.00641: each call gets
                a full trust region however stale its batch, and the weights correct for
                whose samples they are.
        """
        b_size = obs.shape[0]
        if value is None:
            if self.clip_value is not None:
                raise ValueError("PPO.learn: value clipping (clip_value) needs `value=`")
            value = value_target  # unused without value clipping
        if old_log_prob is None:
            with torch.no_grad():
                old_log_prob = self.distribution(obs).log_prob(action)
        sums = torch.zeros(4)  # policy loss, value loss, entropy, clip fraction
        updates = 0
        batch = (obs, action, advantage, value_target, value, old_log_prob)
        if weight is not None:
            batch += (weight,)
        for _ in range(self.update_epochs):
            b_inds = torch.randperm(b_size, generator=self._generator)
            # One gather an epoch, then contiguous slices (views): the same minibatches as
            # indexing each one, without six gathers for every gradient step.
            shuffled = [x[b_inds] for x in batch]
            for start in range(0, b_size, self.minibatch_size):
                end = start + self.minibatch_size
                sums += self._update(*(x[start:end] for x in shuffled))
                updates += 1
        with torch.no_grad():
            log_ratio = self.distribution(obs).log_prob(action) - old_log_prob
            approx_kl = ((log_ratio.exp() - 1) - log_ratio).mean().item()
        if self.variant == "kl":
            if approx_kl < self.kl_target / 1.5:
                self.kl_coef /= 2
            elif approx_kl > self.kl_target * 1.5:
                self.kl_coef *= 2
        policy_loss, value_loss, entropy, clip_fraction = (sums / updates).tolist()
        return PPOStats(
            policy_loss=policy_loss,
            value_loss=value_loss,
            entropy=entropy,
            approx_kl=approx_kl,
            clip_fraction=clip_fraction,
            kl_coef=self.kl_coef,
            updates=updates,
        )

    def _update(
        self,
        mb_obs: torch.Tensor,
        mb_action: torch.Tensor,
        mb_advantage: torch.Tensor,
        mb_value_target: torch.Tensor,
        mb_old_value: torch.Tensor,
        mb_old_log_prob: torch.Tensor,
        mb_weight: torch.Tensor | None = None,
    ) -> torch.Tensor:
        dist, new_value = self.distribution_and_value(mb_obs)
        log_ratio = dist.log_prob(mb_action) - mb_old_log_prob
        ratio = log_ratio.exp()
        if self.normalize_advantage and mb_advantage.numel() > 1:
            mb_advantage = (mb_advantage - mb_advantage.mean()) / (mb_advantage.std() + 1e-8)

        if mb_weight is not None:  # the decoupled objective (see `learn`)
            if self.variant == "clip":
                clipped = ratio.clamp(1.0 - self.clip_coef, 1.0 + self.clip_coef)
                surrogate = torch.min(ratio * mb_advantage, clipped * mb_advantage)
                policy_loss = -(mb_weight * surrogate).mean()
            else:
                kl = (ratio - 1) - log_ratio
                policy_loss = (mb_weight * (self.kl_coef * kl - ratio * mb_advantage)).mean()
        elif self.variant == "clip":
            policy_loss = ppo_clip_loss(ratio, mb_advantage, self.clip_coef)
        else:
            kl = (ratio - 1) - log_ratio
            policy_loss = -(ratio * mb_advantage).mean() + self.kl_coef * kl.mean()

        if self.clip_value is None:
            value_loss = F.mse_loss(new_value, mb_value_target)
        else:
            clipped = mb_old_value + (new_value - mb_old_value).clamp(
                -self.clip_value, self.clip_value
            )
            value_loss = torch.max(
                (new_value - mb_value_target) ** 2, (clipped - mb_value_target) ** 2
            ).mean()

        entropy = dist.entropy().mean()
        loss = policy_loss + self.vf_coef * value_loss - self.ent_coef * entropy

        for p in self._parameters:  # Optimizer.zero_grad(set_to_none=True), without its hooks
            p.grad = None
        loss.backward()
        for optimizer, params in self._steps:
            if not self._lean_step(optimizer, params):
                clip_grad_norm(params, self.max_grad_norm)
                optimizer.step()
        with torch.no_grad():
            clip_fraction = ((ratio - 1.0).abs() > self.clip_coef).float().mean()
            return torch.stack([policy_loss, value_loss, entropy, clip_fraction]).detach()

    def _lean_step(
        self, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter]
    ) -> bool:
        """Clip the gradient and take Adam's step on flat tensors (`FlatAdamStep`), if it can."""
        return self._flat_step(optimizer, params, self.max_grad_norm)

    def __setstate__(self, state: dict) -> None:
        state.pop("_flat", None)  # an earlier PPO's own flat tensors
        state.setdefault("_flat_step", FlatAdamStep())
        self.__dict__.update(state)

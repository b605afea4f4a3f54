"""The DQN family as options of one implementation, and its members by the names users know.

`DQN` (Mnih et al., "Human-level control through deep reinforcement learning", Nature 518, 2015,
https://doi.org/10.1038/nature14236) with, each as an option:

- double Q-learning (van Hasselt et al., AAAI 2016, https://arxiv.org/abs/1509.06461): `DDQN`;
- a dueling network (Wang et al., ICML 2016, https://arxiv.org/abs/1511.06581): `DuelingDQN`;
- n-step returns (the data from `parl.utils.NStepAdder`, the bootstrap discounted by
  `gamma^n`, or by the `gamma^k` of a shorter window at the end of a truncated episode, which
  the adder's batches carry);
- noisy networks for exploration (Fortunato et al., ICLR 2018, https://arxiv.org/abs/1706.10295);
- a categorical return distribution (Bellemare et al., ICML 2017,
  https://arxiv.org/abs/1707.06887): `C51`;
- quantile regression of the return distribution (Dabney et al., AAAI 2018,
  https://arxiv.org/abs/1710.10044): `QRDQN`;
- all of C51, n-step, double, dueling and noisy, learned from a prioritized replay memory
  (Hessel et al., AAAI 2018, https://arxiv.org/abs/1710.02298): `Rainbow`.

The network (`parl_algos.nets.QNetwork` or the user's own, with `DuelingHead`/`NoisyLinear`
from `parl_algos.nets`) and the replay memory stay outside the algorithm, as in PARL.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F

import parl
from parl_algos._common import check_positive, clip_grad_norm
from parl_algos.functional import categorical_projection, quantile_huber_loss
from parl_algos.nets import DuelingHead, NoisyLinear, reset_noise

__all__ = ["C51", "DDQN", "DQN", "DQNStats", "DuelingDQN", "QRDQN", "Rainbow"]


@dataclass(frozen=True)
class DQNStats:
    """What one `learn` call of the DQN family did."""

    loss: float
    """The (importance-weighted) loss of the batch."""
    q_mean: float
    """Mean `Q(s, a)` of the batch's actions (the distribution's mean when distributional)."""
    td_error: np.ndarray
    """Per sample, what a prioritized replay memory takes as the new priority: `|y - Q(s, a)|`,
    or the sample's distributional loss (C51's KL divergence, or its cross-entropy with
    `c51_priority="cross_entropy"`; QR-DQN's quantile Huber loss)."""


class DQN(parl.Algorithm):
    """Deep Q-network: regress `Q(s, a)` on `r + gamma^n * Q_target(s', a')`, with options.

    The target network is a copy of the model refreshed by `sync_target`, which the agent calls
    on its schedule. With `double=True` the next action `a'` is chosen by the online network and
    evaluated by the target network; otherwise `a' = argmax Q_target(s', .)`. With
    `distributional` the model outputs a distribution per action, `(B, n_actions, n_atoms)`:
    C51's logits over the fixed `support` or QR-DQN's quantiles, and the greedy action is that
    of the largest mean. Exploration (epsilon-greedy) is the agent's, except with noisy
    networks, where each `learn` draws new noise for both networks and the agent acts greedily.
    Mnih et al. 2015, https://doi.org/10.1038/nature14236; each option's paper is linked in
    this module's docstring and in the named variants'.

    Args:
        model: a `parl.Model` mapping observations to Q-values `(B, n_actions)`, or with
            `distributional` to `(B, n_actions, n_atoms)`; `parl_algos.nets.QNetwork` builds
            every kind.
        lr: Adam learning rate.
        gamma: discount factor of one step.
        double: use the double-DQN target.
        dueling: the model has a `parl_algos.nets.DuelingHead` (checked).
        n_step: steps each stored transition spans (its reward is the n-step return, as
            `parl.utils.NStepAdder` writes it): the bootstrap is discounted by `gamma^n_step`
            (by each transition's own `discount` where `learn` is given one).
        noisy: the model has `parl_algos.nets.NoisyLinear` layers (checked); their noise is
            drawn anew at each `learn`.
        distributional: None (expected values), `"c51"` (a categorical distribution on
            `n_atoms` atoms from `v_min` to `v_max`) or `"qr"` (`n_atoms` quantiles).
        n_atoms: atoms or quantiles per action (default: 51 for C51, 200 for QR-DQN, as the
            papers).
        v_min: C51's smallest return atom.
        v_max: C51's largest return atom.
        kappa: QR-DQN's Huber threshold (0: the plain quantile loss).
        loss: the expected-value loss, `"huber"` (smooth L1, as the Nature paper's error
            clipping) or `"mse"`.
        max_grad_norm: clip the gradient's global norm to this (None: no clipping).
        adam_eps: Adam's epsilon, the term added to the root of its second-moment estimate
            (the QR-DQN paper uses `0.01 / batch_size`, which damps the steps of parameters
            with small gradients).
        c51_priority: what C51 gives a prioritized replay as a sample's priority (its
            `td_error`): `"kl"`, the KL divergence of the prediction from the projected
            target (the Rainbow paper's), or `"cross_entropy"`, the same plus the target's
            own entropy (as Dopamine's, Kaixhin's and Tianshou's Rainbow prioritize): flatter
            priorities, since a bootstrapped target's entropy, up to `log(n_atoms)`, outweighs
            the divergence. The loss, and so the gradient, is the same either way.
    """

    def __init__(
        self,
        model: parl.Model,
        *,
        lr: float = 1e-4,
        gamma: float = 0.99,
        double: bool = True,
        dueling: bool = False,
        n_step: int = 1,
        noisy: bool = False,
        distributional: Literal["c51", "qr"] | None = None,
        n_atoms: int | None = None,
        v_min: float = -10.0,
        v_max: float = 10.0,
        kappa: float = 1.0,
        loss: Literal["huber", "mse"] = "huber",
        max_grad_norm: float | None = 10.0,
        adam_eps: float = 1e-8,
        c51_priority: Literal["kl", "cross_entropy"] = "kl",
    ) -> None:
        super().__init__(model)
        name = type(self).__name__
        check_positive(name, lr=lr, n_step=n_step, adam_eps=adam_eps)
        if c51_priority not in ("kl", "cross_entropy"):
            raise ValueError(f"{name}: {c51_priority=} must be 'kl' or 'cross_entropy'")
        if loss not in ("huber", "mse"):
            raise ValueError(f"{name}: {loss=} must be 'huber' or 'mse'")
        if distributional not in (None, "c51", "qr"):
            raise ValueError(f"{name}: {distributional=} must be None, 'c51' or 'qr'")
        _check_has(name, model, "dueling", dueling, DuelingHead)
        _check_has(name, model, "noisy", noisy, NoisyLinear)
        self.gamma = gamma
        self.double = double
        self.dueling = dueling
        self.n_step = int(n_step)
        self.noisy = noisy
        self.distributional = distributional
        self.loss = loss
        self.kappa = kappa
        self.max_grad_norm = max_grad_norm
        self.c51_priority = c51_priority
        self.n_atoms = 1
        if distributional is not None:
            self.n_atoms = n_atoms or (51 if distributional == "c51" else 200)
            if self.n_atoms < 2:
                raise ValueError(f"{name}: n_atoms={self.n_atoms} must be at least 2")
        if distributional == "c51":
            if not v_min < v_max:
                raise ValueError(f"{name}: {v_min=} must be below {v_max=}")
            device = next(model.parameters()).device
            self.support = torch.linspace(v_min, v_max, self.n_atoms, device=device)
        self.target_model = copy.deepcopy(model)
        self.target_model.requires_grad_(False)
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr, eps=adam_eps)

    @torch.no_grad()
    def predict(self, obs: torch.Tensor) -> torch.Tensor:
        """Return the Q-values `(batch, n_actions)` of a batch of observations."""
        return self.q_values(self.model(obs))

    def q_values(self, out: torch.Tensor) -> torch.Tensor:
        """The Q-values `(B, n_actions)` of a model output: the distribution's mean, if one."""
        self._check_shape(out)
        if self.distributional == "c51":
            return (out.softmax(dim=-1) * self.support).sum(dim=-1)
        if self.distributional == "qr":
            return out.mean(dim=-1)
        return out

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
        discount: torch.Tensor | None = None,
    ) -> DQNStats:
        """One gradient step on a batch of transitions.

        Args:
            obs: `(B, *obs_shape)` observations.
            action: `(B,)` int64 actions taken.
            reward: `(B,)` rewards (the n-step returns when `n_step > 1`).
            next_obs: `(B, *obs_shape)` the observations `n_step` steps after `obs` (fewer at
                the end of a truncated episode: see `discount`).
            terminal: `(B,)` 1 where `next_obs` is a terminal state (not for truncations).
            weight: `(B,)` importance-sampling weights of a prioritized replay (default: 1).
            discount: `(B,)` each transition's bootstrap discount, `gamma^k` for one spanning
                `k` steps (an `NStepBatch`'s; default: `gamma^n_step` for every one).
        """
        if self.noisy:
            reset_noise(self.model)
            reset_noise(self.target_model)
        b = torch.arange(obs.shape[0], device=obs.device)
        with torch.no_grad():
            next_out = self._check_shape(self.target_model(next_obs))
            chooser = self.model(next_obs) if self.double else next_out
            next_action = self.q_values(chooser).argmax(dim=1)
            next_target = next_out[b, next_action]
        out = self._check_shape(self.model(obs))[b, action.long()]

        full = self.gamma**self.n_step if discount is None else discount.to(reward.dtype)
        discount = full * (1.0 - terminal.to(reward.dtype))
        elementwise, q, priority = self._loss(out, reward, discount, next_target)
        loss = elementwise.mean() if weight is None else (weight * elementwise).mean()

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        return DQNStats(
            loss=loss.item(),
            q_mean=q.mean().item(),
            td_error=priority.detach().cpu().numpy(),
        )

    @torch.no_grad()
    def priority(
        self,
        out: torch.Tensor,
        reward: torch.Tensor,
        discount: torch.Tensor,
        next_out: torch.Tensor,
    ) -> torch.Tensor:
        """The priority `learn` gives transitions (its `td_error`), from given model outputs.

        What an Ape-X actor computes with its own copy of the network (Horgan et al. 2018,
        https://arxiv.org/abs/1803.00933): the bootstrap is `next_out` at its greedy action,
        the copy standing for both the online and the target network.

        Args:
            out: `(B,)`, or `(B, n_atoms)` when distributional: the model's output at each
                transition's observation and action.
            reward: `(B,)` the transitions' (n-step) returns.
            discount: `(B,)` the bootstrap's discount, `gamma^n (1 - terminal)`.
            next_out: `(B, n_actions)` or `(B, n_actions, n_atoms)`: the model's output at the
                observations the transitions bootstrap from.
        """
        b = torch.arange(next_out.shape[0], device=next_out.device)
        next_target = next_out[b, self.q_values(next_out).argmax(dim=1)]
        return self._loss(out, reward, discount, next_target)[2]

    def _loss(
        self,
        out: torch.Tensor,
        reward: torch.Tensor,
        discount: torch.Tensor,
        next_target: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per sample: the loss, `Q(s, a)` and the priority, by the kind of output."""
        loss_fn = {None: self._td_loss, "c51": self._c51_loss, "qr": self._qr_loss}
        return loss_fn[self.distributional](out, reward, discount, next_target)

    def _td_loss(
        self, q: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor, next_q: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """DQN: Huber (or squared) error to `y = r + gamma^n (1 - terminal) Q_target(s', a')`."""
        y = reward + discount * next_q
        if self.loss == "huber":
            elementwise = F.smooth_l1_loss(q, y, reduction="none")
        else:
            elementwise = F.mse_loss(q, y, reduction="none")
        return elementwise, q, (y - q).abs()

    def _c51_loss(
        self,
        logits: torch.Tensor,
        reward: torch.Tensor,
        discount: torch.Tensor,
        next_logits: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """C51: KL(m || p), `m` the target distribution projected onto the support.

        The priority is the KL divergence, or with `c51_priority="cross_entropy"` the
        cross-entropy `-sum m log p` (the divergence plus the target's entropy).
        """
        m = categorical_projection(next_logits.softmax(dim=-1), reward, discount, self.support)
        log_p = logits.log_softmax(dim=-1)
        # The cross-entropy less the target's own entropy: the same gradient, and a priority
        # that is zero where p matches m.
        cross_entropy = -(m * log_p).sum(dim=-1)
        kl = torch.special.xlogy(m, m).sum(dim=-1) + cross_entropy
        priority = kl if self.c51_priority == "kl" else cross_entropy
        return kl, (log_p.exp() * self.support).sum(dim=-1), priority

    def _qr_loss(
        self,
        theta: torch.Tensor,
        reward: torch.Tensor,
        discount: torch.Tensor,
        next_theta: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """QR-DQN: quantile Huber loss of `theta` against `r + gamma^n (1 - terminal) theta'`."""
        target = reward.unsqueeze(1) + discount.unsqueeze(1) * next_theta
        loss = quantile_huber_loss(theta, target, self.kappa)
        return loss, theta.mean(dim=-1), loss

    def _check_shape(self, out: torch.Tensor) -> torch.Tensor:
        if self.distributional is None:
            if out.dim() != 2:
                raise ValueError(
                    f"{type(self).__name__}: the model returned shape {tuple(out.shape)}; "
                    "expected Q-values (B, n_actions)"
                )
        elif out.dim() != 3 or out.shape[2] != self.n_atoms:
            raise ValueError(
                f"{type(self).__name__}: the model returned shape {tuple(out.shape)}; "
                f"{self.distributional!r} expects (B, n_actions, n_atoms={self.n_atoms}): "
                f"build it with QNetwork(..., n_atoms={self.n_atoms})"
            )
        return out


def _check_has(owner: str, model: parl.Model, flag: str, value: bool, layer: type) -> None:
    has = any(isinstance(m, layer) for m in model.modules())
    if has != bool(value):
        what = "has no" if value else "has a"
        raise ValueError(
            f"{owner}: {flag}={value} but the model {what} {layer.__name__}; build the model "
            f"with parl_algos.nets.QNetwork(..., {flag}={bool(value)}) or pass {flag}={has}"
        )


class _Variant(DQN):
    """A `DQN` whose defaults are those of a named variant (`_DEFAULTS`)."""

    _DEFAULTS: ClassVar[dict[str, Any]] = {}

    def __init__(self, model: parl.Model, **kwargs: Any) -> None:
        super().__init__(model, **{**self._DEFAULTS, **kwargs})


class DDQN(_Variant):
    """Double DQN: the online network picks the next action, the target network values it.

    van Hasselt et al., "Deep reinforcement learning with double Q-learning", AAAI 2016,
    https://arxiv.org/abs/1509.06461. `DQN(model, double=True)`.

    Args:
        model: a `parl.Model` mapping observations to Q-values `(B, n_actions)`.
        **kwargs: `DQN`'s other keyword arguments.
    """

    _DEFAULTS: ClassVar[dict[str, Any]] = {"double": True}


class DuelingDQN(_Variant):
    """Double DQN on a dueling network, `Q = V + A - mean(A)`.

    Wang et al., "Dueling network architectures for deep reinforcement learning", ICML 2016,
    https://arxiv.org/abs/1511.06581. `DQN(model, double=True, dueling=True)`.

    Args:
        model: a `parl.Model` with a `parl_algos.nets.DuelingHead`, e.g.
            `QNetwork(obs_dim, n_actions, dueling=True)`.
        **kwargs: `DQN`'s other keyword arguments.
    """

    _DEFAULTS: ClassVar[dict[str, Any]] = {"double": True, "dueling": True}


class C51(_Variant):
    """C51: a categorical return distribution on 51 fixed atoms, learned by cross-entropy.

    Bellemare et al., "A distributional perspective on reinforcement learning", ICML 2017,
    https://arxiv.org/abs/1707.06887. `DQN(model, double=False, distributional="c51")`: the
    target distribution of `argmax_a E[Z_target(s', a)]` shifted by the reward, shrunk by the
    discount and projected back onto the support (`functional.categorical_projection`); the
    loss is the KL divergence from it (the paper's cross-entropy, less a constant).

    Args:
        model: a `parl.Model` returning logits `(B, n_actions, n_atoms)`, e.g.
            `QNetwork(obs_dim, n_actions, n_atoms=51)`.
        **kwargs: `DQN`'s other keyword arguments (`n_atoms`, `v_min`, `v_max` among them).
    """

    _DEFAULTS: ClassVar[dict[str, Any]] = {"double": False, "distributional": "c51"}


class QRDQN(_Variant):
    """QR-DQN: the return distribution as quantiles, learned by quantile Huber regression.

    Dabney et al., "Distributional reinforcement learning with quantile regression", AAAI 2018,
    https://arxiv.org/abs/1710.10044. `DQN(model, double=False, distributional="qr")` with 200
    quantiles at the midpoints `(2i + 1) / 2N` and `kappa = 1`
    (`functional.quantile_huber_loss`).

    Args:
        model: a `parl.Model` returning quantiles `(B, n_actions, n_atoms)`, e.g.
            `QNetwork(obs_dim, n_actions, n_atoms=200)`.
        **kwargs: `DQN`'s other keyword arguments (`n_atoms`, `kappa` among them).
    """

    _DEFAULTS: ClassVar[dict[str, Any]] = {"double": False, "distributional": "qr"}


class Rainbow(_Variant):
    """Rainbow: C51 with 3-step returns, double Q, a dueling noisy network, prioritized replay.

    Hessel et al., "Rainbow: combining improvements in deep reinforcement learning", AAAI 2018,
    https://arxiv.org/abs/1710.02298. `DQN(model, double=True, dueling=True, noisy=True,
    n_step=3, distributional="c51")`. The rest of the recipe is the data's: transitions go
    through `parl.utils.NStepAdder(memory, n_step=3, gamma=gamma)` into a
    `parl.utils.PrioritizedReplayMemory`, whose priorities are the per-sample KL losses
    (`DQNStats.td_error`), as the paper's; the agent acts greedily (the noise explores).

    Args:
        model: a `parl.Model` with a noisy dueling head returning logits, e.g.
            `QNetwork(obs_dim, n_actions, dueling=True, noisy=True, n_atoms=51)`.
        **kwargs: `DQN`'s other keyword arguments.
    """

    _DEFAULTS: ClassVar[dict[str, Any]] = {
        "double": True,
        "dueling": True,
        "noisy": True,
        "n_step": 3,
        "distributional": "c51",
    }

"""MAPPO, multi-agent PPO with decentralized actors and a centralized value function.

Yu et al., "The surprising effectiveness of PPO in cooperative multi-agent games", NeurIPS 2022
datasets and benchmarks, https://arxiv.org/abs/2103.01955. Each agent acts on its own
observation (one actor shared by all, fed the agent's id, or one actor per agent); the value
function reads the global state and the agent's id. Everything else is PPO's clipped update.

The update is PPO's own (`parl_algos.ppo`): `MAPPO.learn` packs each (step, agent) pair into
one row `[obs_i, onehot(i), state]` (`pack_agent_inputs`), the model's `policy` reads the first
two parts and `value` the last two, and PPO's minibatches run over those rows. With
`value_norm=True` (the paper's setting) the value network learns returns standardised by their
running mean and standard deviation (`ValueNormalizer`), which `MAPPO.value` undoes.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

import parl
from parl_algos.nets import mlp
from parl_algos.ppo import PPO, PPOStats

__all__ = ["MAPPO", "MAPPOStats", "MultiAgentPPOMLP", "ValueNormalizer", "pack_agent_inputs"]


def pack_agent_inputs(obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """`(..., n_agents, obs_dim)` observations and `(..., state_dim)` states -> one row per agent.

    Row `i` is `[obs_i, onehot(i), state]`: `(..., n_agents, obs_dim + n_agents + state_dim)`.
    """
    n_agents = obs.shape[-2]
    ids = torch.eye(n_agents, dtype=obs.dtype, device=obs.device).expand(*obs.shape[:-1], n_agents)
    state = state.unsqueeze(-2).expand(*obs.shape[:-1], state.shape[-1])
    return torch.cat([obs, ids, state.to(obs.dtype)], dim=-1)


class ValueNormalizer(nn.Module):
    """Running mean and variance of value targets, to standardise them and to undo that.

    The statistics are a bias-corrected exponential moving average (weight `beta` on the past)
    of the batch mean and mean square of every `update`, as in MAPPO's reference
    implementation; they are buffers, so they are saved and restored with the algorithm.

    Args:
        beta: weight of the past statistics in each update (1 - 1e-5 in the paper).
        epsilon: floor of the variance.
    """

    def __init__(self, beta: float = 0.99999, epsilon: float = 1e-5) -> None:
        super().__init__()
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"ValueNormalizer: beta={beta!r} must be in [0, 1)")
        self.beta, self.epsilon = beta, epsilon
        self.register_buffer("mean", torch.zeros(()))
        self.register_buffer("mean_sq", torch.zeros(()))
        self.register_buffer("debias", torch.zeros(()))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold a batch of targets into the running statistics."""
        x = x.detach().to(self.mean.dtype)
        self.mean.mul_(self.beta).add_((1 - self.beta) * x.mean())
        self.mean_sq.mul_(self.beta).add_((1 - self.beta) * (x**2).mean())
        self.debias.mul_(self.beta).add_(1 - self.beta)

    def stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The debiased `(mean, std)`."""
        debias = self.debias.clamp_min(self.epsilon)
        mean, mean_sq = self.mean / debias, self.mean_sq / debias
        return mean, (mean_sq - mean**2).clamp_min(self.epsilon).sqrt()

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """`(x - mean) / std`."""
        mean, std = self.stats()
        return (x - mean) / std

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        """`x * std + mean`."""
        mean, std = self.stats()
        return x * std + mean


@dataclass(frozen=True)
class MAPPOStats(PPOStats):
    """What one `MAPPO.learn` call did (PPO's statistics over every agent's samples)."""


class MultiAgentPPOMLP(parl.Model):
    """MAPPO's model on packed rows `[obs_i, onehot(i), state]`: tanh MLPs for actors and value.

    Args:
        obs_dim: every agent's observation size (zero-pad shorter ones).
        state_dim: the global state's size.
        n_agents: number of agents.
        n_actions: number of discrete actions of every agent, or one number per agent where
            they differ: the actors then give the largest number of logits, and each row's
            logits past its own agent's count are masked out (they have probability zero).
        hidden: widths of the hidden layers.
        shared_actor: one actor for all agents (fed the id); otherwise one per agent.
        centralized: the value function reads the global state (MAPPO); otherwise only the
            agent's own observation (independent PPO, the baseline).
    """

    def __init__(
        self,
        obs_dim: int,
        state_dim: int,
        n_agents: int,
        n_actions: int | Sequence[int],
        hidden: Sequence[int] = (64, 64),
        *,
        shared_actor: bool = True,
        centralized: bool = True,
    ) -> None:
        super().__init__()
        self.obs_dim, self.state_dim, self.n_agents = obs_dim, state_dim, n_agents
        self.shared_actor, self.centralized = shared_actor, centralized
        if isinstance(n_actions, numbers.Integral):
            counts = [int(n_actions)] * n_agents
        else:
            counts = [int(n) for n in n_actions]
        if len(counts) != n_agents or min(counts) < 1:
            raise ValueError(
                f"MultiAgentPPOMLP: {n_actions=} must be a positive int or one per agent "
                f"({n_agents=})"
            )
        self.n_actions = max(counts)
        # Row i: agent i's valid actions (not in the state dict: the sizes rebuild it).
        valid = torch.arange(self.n_actions) < torch.tensor(counts).unsqueeze(-1)
        self.register_buffer("valid_actions", valid, persistent=False)
        self._masked = min(counts) < self.n_actions
        actor_in = obs_dim + n_agents if shared_actor else obs_dim
        self.actors = nn.ModuleList(
            mlp(actor_in, hidden, self.n_actions, activation=nn.Tanh, orthogonal_gain=0.01)
            for _ in range(1 if shared_actor else n_agents)
        )
        critic_in = (state_dim if centralized else obs_dim) + n_agents
        self.critic = mlp(critic_in, hidden, 1, activation=nn.Tanh, orthogonal_gain=1.0)

    def policy(self, x: torch.Tensor) -> torch.Tensor:
        """Action logits `(..., n_actions)` of packed rows (an agent's invalid ones masked)."""
        obs, ids = x[..., : self.obs_dim], x[..., self.obs_dim : self.obs_dim + self.n_agents]
        if self.shared_actor:
            logits = self.actors[0](torch.cat([obs, ids], dim=-1))
        else:
            every = torch.stack([actor(obs) for actor in self.actors], dim=-2)
            logits = (ids.unsqueeze(-1) * every).sum(-2)  # each row's own agent's actor
        if not self._masked:
            return logits
        valid = (ids @ self.valid_actions.to(ids.dtype)) > 0.5
        return logits.masked_fill(~valid, torch.finfo(logits.dtype).min)

    def value(self, x: torch.Tensor) -> torch.Tensor:
        """State values `(...)` of packed rows."""
        ids = x[..., self.obs_dim : self.obs_dim + self.n_agents]
        own = x[..., self.obs_dim + self.n_agents :] if self.centralized else x[..., : self.obs_dim]
        return self.critic(torch.cat([own, ids], dim=-1)).squeeze(-1)

    def policy_parameters(self) -> list[nn.Parameter]:
        """The actors' parameters (MAPPO's `separate_optimizers` steps them on their own)."""
        return list(self.actors.parameters())

    def value_parameters(self) -> list[nn.Parameter]:
        """The value function's parameters."""
        return list(self.critic.parameters())


class MAPPO(PPO):
    """Multi-agent PPO: each agent's clipped surrogate, a value function on the global state.

    Every agent's samples enter one PPO update: `learn` flattens `(B, n_agents)` into
    `B * n_agents` rows packed by `pack_agent_inputs`, with per-agent advantages (e.g. GAE of
    each agent's reward under its centralized value). With a model whose value reads only the
    agent's own observation this is independent PPO, the baseline. `sample`, `predict` and
    `value` take packed rows too (`(n_agents, row)` for one step of all agents).

    Args:
        model: a `parl.Model` with `policy(rows)` (logits, or a distribution) and
            `value(rows)` -> `(...)` on packed rows, e.g. `MultiAgentPPOMLP`.
        lr: Adam learning rate.
        clip_coef: epsilon of the clipped objective.
        update_epochs: passes over each batch.
        minibatch_size: rows (agent-steps) per gradient step.
        normalize_advantage: standardise the advantages of each minibatch.
        clip_value: clip the value prediction to within this of its value at collection time
            (None: no clipping).
        vf_coef: weight of the value loss.
        ent_coef: weight of the entropy bonus.
        max_grad_norm: clip the gradient's global norm to this (None: no clipping); with
            `separate_optimizers`, the actor's and the critic's gradients each to this.
        value_norm: the value network learns standardised returns (`ValueNormalizer`);
            `value` returns them in the returns' own scale, `learn` takes them so too.
        separate_optimizers: the MAPPO paper's setting: one Adam for the actor's parameters
            (`optimizer`, at `lr`) and one for the value function's (`critic_optimizer`, at
            `critic_lr`), each with its own gradient-norm clip, so that neither part's
            gradient scales the other's step. The model names its parts by
            `policy_parameters()` and `value_parameters()` (disjoint). False: one Adam and
            one clip over every parameter, as PPO does. The two differ only where the
            gradient's norm exceeds `max_grad_norm` (Adam's state is per parameter).
        critic_lr: the critic's learning rate with `separate_optimizers` (None: `lr`).
        seed: seed of the minibatch shuffling.
    """

    def __init__(
        self,
        model: parl.Model,
        *,
        lr: float = 7e-4,
        clip_coef: float = 0.2,
        update_epochs: int = 10,
        minibatch_size: int = 256,
        normalize_advantage: bool = True,
        clip_value: float | None = None,
        vf_coef: float = 0.5,
        ent_coef: float = 0.01,
        max_grad_norm: float | None = 10.0,
        value_norm: bool = False,
        separate_optimizers: bool = False,
        critic_lr: float | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(
            model,
            lr=lr,
            clip_coef=clip_coef,
            update_epochs=update_epochs,
            minibatch_size=minibatch_size,
            normalize_advantage=normalize_advantage,
            clip_value=clip_value,
            vf_coef=vf_coef,
            ent_coef=ent_coef,
            max_grad_norm=max_grad_norm,
            seed=seed,
        )
        self.value_normalizer = ValueNormalizer() if value_norm else None
        self.critic_optimizer: torch.optim.Optimizer | None = None
        if separate_optimizers:
            self._separate_optimizers(critic_lr or lr)
        elif critic_lr is not None:
            raise ValueError("MAPPO: critic_lr needs separate_optimizers=True")

    def _separate_optimizers(self, critic_lr: float) -> None:
        """Replace PPO's one Adam by the actor's (`optimizer`) and the critic's."""
        parts = []
        for method in ("policy_parameters", "value_parameters"):
            if not callable(getattr(self.model, method, None)):
                raise TypeError(
                    f"MAPPO(separate_optimizers=True) needs a model with {method}(); "
                    f"{type(self.model).__name__} has none"
                )
            parts.append(list(getattr(self.model, method)()))
        actor, critic = parts
        a, c = {id(p) for p in actor}, {id(p) for p in critic}
        if a & c or a | c != {id(p) for p in self._parameters}:
            raise ValueError(
                "MAPPO(separate_optimizers=True): the model's policy_parameters() and "
                "value_parameters() must split its parameters in two disjoint parts"
            )
        group = self.optimizer.param_groups[0]
        self.optimizer = torch.optim.Adam(actor, lr=group["lr"], eps=group["eps"], foreach=True)
        self.critic_optimizer = torch.optim.Adam(
            critic, lr=critic_lr, eps=group["eps"], foreach=True
        )
        self._steps = [(self.optimizer, actor), (self.critic_optimizer, critic)]

    @torch.no_grad()
    def value(self, rows: torch.Tensor) -> torch.Tensor:
        """State values of packed rows, shaped `(..., n_agents)` like the rows' leading axes.

        In the returns' scale: with `value_norm` the network's output, denormalised.
        """
        value = self.model.value(rows)
        if self.value_normalizer is not None:
            value = self.value_normalizer.denormalize(value)
        return value

    def learn(  # type: ignore[override]
        self,
        obs: torch.Tensor,
        state: torch.Tensor,
        action: torch.Tensor,
        advantage: torch.Tensor,
        value_target: torch.Tensor,
        value: torch.Tensor | None = None,
        old_log_prob: torch.Tensor | None = None,
    ) -> MAPPOStats:
        """PPO's epochs of minibatch updates over every agent's samples.

        Args:
            obs: `(B, n_agents, obs_dim)` observations.
            state: `(B, state_dim)` global states.
            action: `(B, n_agents)` actions taken.
            advantage: `(B, n_agents)` advantage estimates.
            value_target: `(B, n_agents)` return estimates for the value function.
            value: `(B, n_agents)` values at collection time (needed for value clipping).
            old_log_prob: `(B, n_agents)` `log pi_old(a|o)`; computed here when left out.

        With `value_norm`, `value_target` and `value` are in the returns' scale (as `value`
        gives them): the statistics take in `value_target` first, then both are standardised.
        """
        rows = pack_agent_inputs(obs, state).flatten(0, 1)
        if self.value_normalizer is not None:
            self.value_normalizer.update(value_target)
            value_target = self.value_normalizer.normalize(value_target)
            if value is not None:
                value = self.value_normalizer.normalize(value)

        def flat(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.flatten(0, 1)

        stats = super().learn(
            rows,
            flat(action),
            flat(advantage),
            flat(value_target),
            flat(value),
            flat(old_log_prob),
        )
        return MAPPOStats(**dataclasses.asdict(stats))

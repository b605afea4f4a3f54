"""MADDPG, multi-agent deep deterministic policy gradient.

Lowe et al., "Multi-agent actor-critic for mixed cooperative-competitive environments",
NeurIPS 2017, https://arxiv.org/abs/1706.02275. Each agent has its own actor, which sees only
its own observation, and its own critic, which sees every agent's observation and action
(centralized training, decentralized execution). Discrete actions go through the Gumbel-softmax
straight-through estimator, as in the paper's particle-environment experiments.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import parl
from parl_algos._common import check_positive, clip_grad_norm, frozen
from parl_algos.functional import td_target
from parl_algos.multiagent import gumbel_softmax
from parl_algos.nets import mlp

__all__ = ["MADDPG", "MADDPGStats", "MultiAgentActorCriticMLP"]


@dataclass(frozen=True)
class MADDPGStats:
    """What one `MADDPG.learn` call did (means over the agents)."""

    critic_loss: float
    """`mean((Q_i(x, a_1..a_N) - y_i)^2)` with `y_i = r_i + gamma Q'_i(x', mu'_1(o'_1)..)`."""
    actor_loss: float
    """`-mean(Q_i(x, a_1..mu_i(o_i)..a_N))`, without the logit regulariser."""
    q_mean: float
    """Mean `Q_i(x, a)` of the batch."""


class MultiAgentActorCriticMLP(parl.Model):
    """One actor and one critic per agent, all MLPs: MADDPG's model, or independent DDPG's.

    Actor `i` maps `o_i` to logits (discrete actions) or to a `tanh` action in `[-1, 1]`.
    With `centralized=True` critic `i` reads every agent's observation and action (MADDPG);
    with `centralized=False` only agent `i`'s own (independent DDPG, the baseline).

    Args:
        obs_dims: observation size of each agent.
        act_dims: action size of each agent (number of actions for discrete ones).
        hidden: widths of the hidden layers of every actor and critic.
        discrete: the actors return logits instead of `tanh` actions.
        centralized: the critics see all agents (see above).
    """

    def __init__(
        self,
        obs_dims: Sequence[int],
        act_dims: Sequence[int],
        hidden: Sequence[int] = (64, 64),
        *,
        discrete: bool = True,
        centralized: bool = True,
    ) -> None:
        super().__init__()
        if len(obs_dims) != len(act_dims) or not obs_dims:
            raise ValueError(f"{obs_dims=} and {act_dims=} must have one entry per agent")
        self.n_agents = len(obs_dims)
        self.discrete = discrete
        self.centralized = centralized
        joint = sum(obs_dims) + sum(act_dims)
        self.actors = nn.ModuleList(
            mlp(o, hidden, a) for o, a in zip(obs_dims, act_dims, strict=True)
        )
        self.critics = nn.ModuleList(
            mlp(joint if centralized else o + a, hidden, 1)
            for o, a in zip(obs_dims, act_dims, strict=True)
        )

    def policy(self, i: int, obs: torch.Tensor) -> torch.Tensor:
        """Agent `i`'s logits `(B, n_actions)`, or its action `(B, act_dim)` in `[-1, 1]`."""
        out = self.actors[i](obs)
        return out if self.discrete else torch.tanh(out)

    def value(
        self, i: int, obs: Sequence[torch.Tensor], action: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        """Agent `i`'s `Q_i` `(B,)` of the joint observations and actions (lists by agent)."""
        if self.centralized:
            x = torch.cat([*obs, *action], dim=-1)
        else:
            x = torch.cat([obs[i], action[i]], dim=-1)
        return self.critics[i](x).squeeze(-1)

    def get_actor_params(self, i: int) -> list[nn.Parameter]:
        """The parameters of agent `i`'s actor."""
        return list(self.actors[i].parameters())

    def get_critic_params(self, i: int) -> list[nn.Parameter]:
        """The parameters of agent `i`'s critic."""
        return list(self.critics[i].parameters())


class MADDPG(parl.Algorithm):
    """Multi-agent DDPG: decentralized actors, each climbing its own centralized critic.

    Each `learn` call takes, for every agent `i`, one critic step towards
    `y_i = r_i + gamma (1 - terminal_i) Q'_i(o', mu'_1(o'_1), ..., mu'_N(o'_N))` (target
    actors and critics), one actor step along `grad Q_i(o, a_1, ..., mu_i(o_i), ..., a_N)` with
    the other agents' actions from the batch, and then moves the targets by `tau`. Discrete
    actions are one-hot vectors: the actor's action is a Gumbel-softmax sample with the
    straight-through gradient, and a small penalty on the squared logits keeps them bounded
    (as in the paper's code). With a model whose critics see only their own agent, this is
    independent DDPG, the baseline the paper compares against.

    Args:
        model: a `parl.Model` with `n_agents`, `policy(i, obs_i)` (logits, or actions in
            `[-1, 1]`), `value(i, obs_list, action_list)` -> `(B,)`, `get_actor_params(i)` and
            `get_critic_params(i)`, e.g. `MultiAgentActorCriticMLP`.
        discrete: the actions are discrete (one-hot, Gumbel-softmax) rather than continuous.
        actor_lr: Adam learning rate of the actors.
        critic_lr: Adam learning rate of the critics.
        gamma: discount factor.
        tau: Polyak rate of the target networks.
        gumbel_tau: temperature of the Gumbel-softmax relaxation (discrete actions).
        logit_reg: weight of the `mean(logits^2)` penalty of the actor loss (discrete actions).
        exploration_noise: standard deviation of the Gaussian noise `sample` adds to continuous
            actions (discrete actions explore by sampling from the policy).
        max_grad_norm: clip each agent's actor and critic gradient norm to this (None: no clip).
        seed: seed of the exploration and Gumbel noise.
    """

    def __init__(
        self,
        model: parl.Model,
        *,
        discrete: bool = True,
        actor_lr: float = 1e-2,
        critic_lr: float = 1e-2,
        gamma: float = 0.95,
        tau: float = 0.01,
        gumbel_tau: float = 1.0,
        logit_reg: float = 1e-3,
        exploration_noise: float = 0.1,
        max_grad_norm: float | None = 0.5,
        seed: int | None = None,
    ) -> None:
        super().__init__(model)
        for method in ("policy", "value", "get_actor_params", "get_critic_params"):
            if not callable(getattr(model, method, None)):
                raise TypeError(
                    f"MADDPG needs a model with policy(i, obs), value(i, obs, action), "
                    f"get_actor_params(i) and get_critic_params(i); {type(model).__name__} "
                    f"lacks {method}()"
                )
        n_agents = getattr(model, "n_agents", None)
        if not isinstance(n_agents, int) or n_agents < 1:
            raise TypeError(f"MADDPG needs model.n_agents, a positive int; got {n_agents!r}")
        check_positive("MADDPG", actor_lr=actor_lr, critic_lr=critic_lr, tau=tau)
        check_positive("MADDPG", gumbel_tau=gumbel_tau)
        self.n_agents = n_agents
        self.discrete = discrete
        self.gamma = gamma
        self.tau = tau
        self.gumbel_tau = gumbel_tau
        self.logit_reg = logit_reg
        self.exploration_noise = exploration_noise
        self.max_grad_norm = max_grad_norm
        self.target_model = copy.deepcopy(model)
        self.target_model.requires_grad_(False)
        agents = range(n_agents)
        self.actor_optimizer = torch.optim.Adam(
            [p for i in agents for p in model.get_actor_params(i)], lr=actor_lr
        )
        self.critic_optimizer = torch.optim.Adam(
            [p for i in agents for p in model.get_critic_params(i)], lr=critic_lr
        )
        self._generator = torch.Generator().manual_seed(
            int(torch.randint(2**62, ()).item()) if seed is None else seed
        )

    @torch.no_grad()
    def predict(self, obs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each agent's greedy action (one-hot, or in `[-1, 1]`) for its `(B, obs_dim)` batch."""
        out = [self.model.policy(i, o) for i, o in enumerate(obs)]
        if self.discrete:
            return [F.one_hot(x.argmax(-1), x.shape[-1]).to(x.dtype) for x in out]
        return out

    @torch.no_grad()
    def sample(self, obs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each agent's exploratory action: a policy sample (one-hot), or `mu + noise` clipped."""
        actions = []
        for i, o in enumerate(obs):
            out = self.model.policy(i, o)
            if self.discrete:
                actions.append(gumbel_softmax(out, self.gumbel_tau, generator=self._generator))
            else:
                noise = torch.randn(out.shape, generator=self._generator).to(out.device)
                actions.append((out + self.exploration_noise * noise).clamp(-1.0, 1.0))
        return actions

    @torch.no_grad()
    def critic_targets(
        self,
        reward: torch.Tensor,
        next_obs: Sequence[torch.Tensor],
        terminal: torch.Tensor,
    ) -> torch.Tensor:
        """The TD targets `y` `(B, n_agents)` of every critic, from the target networks."""
        target = self.target_model
        next_action = []
        for i, o in enumerate(next_obs):
            out = target.policy(i, o)
            if self.discrete:
                out = gumbel_softmax(out, self.gumbel_tau, generator=self._generator)
            next_action.append(out)
        next_q = torch.stack(
            [target.value(i, next_obs, next_action) for i in range(self.n_agents)], dim=1
        )
        return td_target(reward, next_q, terminal, self.gamma)

    def learn(
        self,
        obs: Sequence[torch.Tensor],
        action: Sequence[torch.Tensor],
        reward: torch.Tensor,
        next_obs: Sequence[torch.Tensor],
        terminal: torch.Tensor,
    ) -> MADDPGStats:
        """One critic and one actor step for every agent, then a target update.

        Args:
            obs: per agent, `(B, obs_dim_i)` observations.
            action: per agent, `(B, act_dim_i)` actions taken (one-hot for discrete actions).
            reward: `(B, n_agents)` rewards.
            next_obs: per agent, `(B, obs_dim_i)` the observations after the step.
            terminal: `(B, n_agents)` 1 where the agent reached a terminal state.
        """
        if len(obs) != self.n_agents or len(action) != self.n_agents:
            raise ValueError(
                f"MADDPG.learn: got {len(obs)} observations and {len(action)} actions "
                f"for {self.n_agents} agents"
            )
        y = self.critic_targets(reward, next_obs, terminal)
        q = torch.stack([self.model.value(i, obs, action) for i in range(self.n_agents)], dim=1)
        critic_loss = F.mse_loss(q, y, reduction="none").mean(0).sum()
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        for i in range(self.n_agents):
            clip_grad_norm(self.model.get_critic_params(i), self.max_grad_norm)
        self.critic_optimizer.step()

        actor_losses = []
        regulariser = torch.zeros(())
        critic_params = [p for i in range(self.n_agents) for p in self.model.get_critic_params(i)]
        with frozen(critic_params):
            for i in range(self.n_agents):
                out = self.model.policy(i, obs[i])
                if self.discrete:
                    own = gumbel_softmax(out, self.gumbel_tau, generator=self._generator)
                    regulariser = regulariser + self.logit_reg * out.pow(2).mean()
                else:
                    own = out
                joint = [own if j == i else a for j, a in enumerate(action)]
                actor_losses.append(-self.model.value(i, obs, joint).mean())
        actor_loss = torch.stack(actor_losses).sum()
        self.actor_optimizer.zero_grad(set_to_none=True)
        (actor_loss + regulariser).backward()
        for i in range(self.n_agents):
            clip_grad_norm(self.model.get_actor_params(i), self.max_grad_norm)
        self.actor_optimizer.step()

        self.sync_target()
        return MADDPGStats(
            critic_loss=critic_loss.item() / self.n_agents,
            actor_loss=actor_loss.item() / self.n_agents,
            q_mean=q.mean().item(),
        )

    def sync_target(self, decay: float | None = None) -> None:
        """Move the target networks a step `tau` towards the model (`decay`: `1 - tau`)."""
        self.model.sync_weights_to(
            self.target_model, decay=1.0 - self.tau if decay is None else decay
        )

"""QMIX, monotonic value-function factorisation for cooperative multi-agent Q-learning.

Rashid et al., "QMIX: monotonic value function factorisation for deep multi-agent reinforcement
learning", ICML 2018, https://arxiv.org/abs/1803.11485. Each agent has a recurrent Q-network on
its own observations; a mixing network combines the agents' chosen Q-values into `Q_tot`, with
weights produced from the global state by hypernetworks and kept non-negative (absolute values),
so that `dQ_tot/dQ_i >= 0` and each agent's greedy action is the team's. `VDNMixer` (a plain
sum; Sunehag et al., 2018, https://arxiv.org/abs/1706.05296) is the simpler factorisation to
compare with; `mixer=None` leaves the agents independent Q-learners (Tan, 1993), the baseline
that a mixer has to beat.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import parl
from parl_algos._common import check_positive, clip_grad_norm
from parl_algos.functional import td_target

__all__ = ["QMIX", "QMIXStats", "QMixer", "RNNAgent", "VDNMixer"]


@dataclass(frozen=True)
class QMIXStats:
    """What one `QMIX.learn` call did."""

    loss: float
    """Masked mean of `(Q_tot - y)^2` over the steps that happened (without a mixer: of every
    agent's `(Q_i - y_i)^2`)."""
    q_tot_mean: float
    """Mean `Q_tot` of the batch's joint actions (without a mixer: mean chosen `Q_i`)."""
    target_mean: float
    """Mean TD target `y`."""
    grad_norm: float
    """Global gradient norm before clipping."""


class RNNAgent(parl.Model):
    """The per-agent Q-network of QMIX: a linear layer, a GRU cell, and a linear Q head.

    Shared by all agents (parameter sharing); feed the agent's one-hot id with its observation
    (`QMIX(add_agent_id=True)` does) so the agents may still act differently.

    Args:
        input_dim: the agent's input size (observation, plus `n_agents` with agent ids).
        n_actions: number of discrete actions.
        hidden_dim: size of the GRU's hidden state.
    """

    def __init__(self, input_dim: int, n_actions: int, hidden_dim: int = 64) -> None:
        super().__init__()
        self.hidden_dim = hidden_dim
        self.fc1 = nn.Linear(input_dim, hidden_dim)
        self.rnn = nn.GRUCell(hidden_dim, hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, n_actions)

    def init_hidden(self, *batch_shape: int) -> torch.Tensor:
        """A zero hidden state of shape `(*batch_shape, hidden_dim)`."""
        return torch.zeros(*batch_shape, self.hidden_dim)

    def forward(
        self, inputs: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: `(..., input_dim)` inputs and hidden states -> Q-values, next hidden."""
        shape = inputs.shape[:-1]
        x = F.relu(self.fc1(inputs.reshape(-1, inputs.shape[-1])))
        h = self.rnn(x, hidden.reshape(-1, self.hidden_dim))
        return self.fc2(h).reshape(*shape, -1), h.reshape(*shape, self.hidden_dim)


class QMixer(parl.Model):
    """QMIX's mixing network: `Q_tot = elu(q W1 + b1) W2 + V(s)`, weights from hypernetworks.

    `W1 (n_agents, embed_dim)` and `W2 (embed_dim, 1)` are `|hyper(s)|`, so `Q_tot` is monotonic
    in every agent's `q_i`; the biases `b1` and `V(s)` may have any sign.

    Args:
        n_agents: number of agents.
        state_dim: size of the global state.
        embed_dim: width of the mixing layer.
        hypernet_dim: width of the hidden layer of the weight hypernetworks.
    """

    def __init__(
        self, n_agents: int, state_dim: int, embed_dim: int = 32, hypernet_dim: int = 64
    ) -> None:
        super().__init__()
        self.n_agents, self.embed_dim = n_agents, embed_dim
        self.hyper_w1 = nn.Sequential(
            nn.Linear(state_dim, hypernet_dim),
            nn.ReLU(),
            nn.Linear(hypernet_dim, n_agents * embed_dim),
        )
        self.hyper_b1 = nn.Linear(state_dim, embed_dim)
        self.hyper_w2 = nn.Sequential(
            nn.Linear(state_dim, hypernet_dim), nn.ReLU(), nn.Linear(hypernet_dim, embed_dim)
        )
        self.hyper_v = nn.Sequential(
            nn.Linear(state_dim, embed_dim), nn.ReLU(), nn.Linear(embed_dim, 1)
        )

    def forward(self, q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Mix `(..., n_agents)` agent Q-values under `(..., state_dim)` states into `(...)`."""
        shape = q.shape[:-1]
        q = q.reshape(-1, 1, self.n_agents)
        s = state.reshape(-1, state.shape[-1])
        w1 = self.hyper_w1(s).abs().view(-1, self.n_agents, self.embed_dim)
        b1 = self.hyper_b1(s).view(-1, 1, self.embed_dim)
        hidden = F.elu(torch.bmm(q, w1) + b1)
        w2 = self.hyper_w2(s).abs().view(-1, self.embed_dim, 1)
        v = self.hyper_v(s).view(-1, 1, 1)
        return (torch.bmm(hidden, w2) + v).reshape(shape)


class VDNMixer(parl.Model):
    """Value decomposition networks' mixer: `Q_tot = sum_i q_i` (the state is not used)."""

    def forward(self, q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Return `q.sum(-1)`."""
        return q.sum(-1)


class QMIX(parl.Algorithm):
    """QMIX: recurrent agent Q-networks trained end to end through a monotonic mixer.

    `learn` takes a batch of whole episodes (`EpisodeMemory.sample`), unrolls the agent network
    and its target over every step, mixes the Q-values of the actions taken into `Q_tot(s, u)`,
    and regresses it on `y = r + gamma (1 - terminated) Q_tot'(s', u')`, masked to the steps that
    happened. With `double_q=True` the next joint action `u'` is each agent's argmax of the
    online network (over its available actions), evaluated by the target networks. Exploration
    is epsilon-greedy per agent (`sample`), with the schedule left to the caller.

    With `mixer=None` nothing is mixed: every agent regresses its own chosen `Q_i(o_i, u_i)` on
    `y_i = r + gamma (1 - terminated) Q'_i(o'_i, u'_i)` with the team reward `r`, so the agents
    are independent Q-learners (their network is still shared, fed the agent's id), the
    baseline that shows what the mixing network brings.

    Args:
        model: the agent network, e.g. `RNNAgent`: `model(inputs, hidden)` -> `(q, hidden)`
            with `(..., n_actions)` Q-values, and `model.init_hidden(*batch_shape)`.
        mixer: the mixing network `mixer(q (..., n_agents), state (..., state_dim))` -> `(...)`:
            `QMixer`, or `VDNMixer` for VDN; None for independent Q-learners (see above).
        n_agents: number of agents.
        add_agent_id: append each agent's one-hot id to its observation.
        lr: Adam learning rate (the pymarl reference uses RMSprop; Adam is steadier here).
        gamma: discount factor.
        double_q: use the double-Q target (see above).
        max_grad_norm: clip the gradient's global norm to this (None: no clipping).
        seed: seed of the exploration.
    """

    def __init__(
        self,
        model: parl.Model,
        mixer: parl.Model | None,
        *,
        n_agents: int,
        add_agent_id: bool = True,
        lr: float = 5e-4,
        gamma: float = 0.99,
        double_q: bool = True,
        max_grad_norm: float | None = 10.0,
        seed: int | None = None,
    ) -> None:
        super().__init__(model)
        if mixer is not None and not isinstance(mixer, parl.Model):
            raise TypeError(f"QMIX: mixer must be a parl.Model or None, got {type(mixer).__name__}")
        if not callable(getattr(model, "init_hidden", None)):
            raise TypeError(
                f"QMIX needs an agent model with init_hidden(*batch_shape); "
                f"{type(model).__name__} has none"
            )
        check_positive("QMIX", lr=lr, n_agents=n_agents)
        self.n_agents = n_agents
        self.add_agent_id = add_agent_id
        self.gamma = gamma
        self.double_q = double_q
        self.max_grad_norm = max_grad_norm
        self.mixer = mixer
        self.target_model = copy.deepcopy(model)
        self.target_mixer = copy.deepcopy(mixer)
        self.target_model.requires_grad_(False)
        if self.target_mixer is not None:
            self.target_mixer.requires_grad_(False)
        self.optimizer = torch.optim.Adam(self._parameters(), lr=lr)
        self._rng = np.random.default_rng(seed)

    def agent_inputs(self, obs: torch.Tensor) -> torch.Tensor:
        """`(..., n_agents, obs_dim)` observations -> the agent network's inputs."""
        if not self.add_agent_id:
            return obs
        ids = torch.eye(self.n_agents, dtype=obs.dtype, device=obs.device)
        return torch.cat([obs, ids.expand(*obs.shape[:-1], self.n_agents)], dim=-1)

    def init_hidden(self, batch: int | None = None) -> torch.Tensor:
        """A zero hidden state for `n_agents` (or `(batch, n_agents)`) agents."""
        shape = (self.n_agents,) if batch is None else (batch, self.n_agents)
        return self.model.init_hidden(*shape)

    @torch.no_grad()
    def q_values(
        self, obs: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return `(q (..., n_agents, n_actions), next hidden)` for one step of acting."""
        return self.model(self.agent_inputs(obs), hidden)

    def predict(
        self, obs: torch.Tensor, hidden: torch.Tensor, avail_actions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy actions `(..., n_agents)` over the available ones, and the next hidden state."""
        return self.sample(obs, hidden, 0.0, avail_actions)

    def sample(
        self,
        obs: torch.Tensor,
        hidden: torch.Tensor,
        epsilon: float,
        avail_actions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Epsilon-greedy actions per agent (random ones among the available), next hidden."""
        q, hidden = self.q_values(obs, hidden)
        avail = torch.ones_like(q) if avail_actions is None else avail_actions.to(q.dtype)
        action = q.masked_fill(avail == 0, -float("inf")).argmax(-1)
        if epsilon > 0:
            explore = torch.from_numpy(self._rng.random(action.shape) < epsilon)
            # A uniform choice among the available actions: the first whose cumulative share
            # of them exceeds a uniform draw.
            cum = (avail / avail.sum(-1, keepdim=True)).cumsum(-1)
            u = torch.from_numpy(self._rng.random((*action.shape, 1))).to(cum.dtype)
            random = (cum <= u).sum(-1).clamp_max(q.shape[-1] - 1)
            action = torch.where(explore, random, action)
        return action, hidden

    def sync_target(self, decay: float = 0.0) -> None:
        """Copy the agent network and the mixer into their targets (`decay > 0`: Polyak)."""
        self.model.sync_weights_to(self.target_model, decay=decay)
        if self.mixer is not None and self.target_mixer is not None:
            self.mixer.sync_weights_to(self.target_mixer, decay=decay)

    def _parameters(self) -> list[nn.Parameter]:
        mixer = [] if self.mixer is None else list(self.mixer.parameters())
        return [*self.model.parameters(), *mixer]

    def _mix(self, mixer: nn.Module | None, q: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """`(B, T, n_agents)` -> `Q_tot (B, T)`; without a mixer the agents' own Q-values."""
        return q if mixer is None else mixer(q, state)

    def learn(
        self,
        obs: torch.Tensor,
        state: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        mask: torch.Tensor,
        avail_actions: torch.Tensor | None = None,
    ) -> QMIXStats:
        """One gradient step on a batch of padded episodes (the fields of an `EpisodeBatch`).

        Args:
            obs: `(B, T + 1, n_agents, obs_dim)` observations.
            state: `(B, T + 1, state_dim)` global states.
            action: `(B, T, n_agents)` int64 actions taken.
            reward: `(B, T)` team rewards.
            terminated: `(B, T)` 1 where the step ended the episode in a terminal state.
            mask: `(B, T)` 1 for real steps, 0 for padding.
            avail_actions: `(B, T + 1, n_agents, n_actions)` 1 for allowed actions (default all).
        """
        inputs = self.agent_inputs(obs)
        q_online = self._unroll(self.model, inputs)
        with torch.no_grad():
            q_target = self._unroll(self.target_model, inputs)
        chosen = q_online[:, :-1].gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        q_tot = self._mix(self.mixer, chosen, state[:, :-1])

        with torch.no_grad():
            next_online = q_online[:, 1:].detach()
            next_target = q_target[:, 1:]
            if avail_actions is not None:
                unavailable = avail_actions[:, 1:] == 0
                next_online = next_online.masked_fill(unavailable, -float("inf"))
                next_target = next_target.masked_fill(unavailable, -float("inf"))
            if self.double_q:
                next_q = next_target.gather(-1, next_online.argmax(-1, keepdim=True)).squeeze(-1)
            else:
                next_q = next_target.max(-1).values
            next_q = torch.nan_to_num(next_q, neginf=0.0)  # no action available: a padded step
            next_q = self._mix(self.target_mixer, next_q, state[:, 1:])
            if self.mixer is None:  # every agent's own target, from the team reward
                reward, terminated = reward.unsqueeze(-1), terminated.unsqueeze(-1)
            y = td_target(reward, next_q, terminated, self.gamma)

        mask = mask.to(q_tot.dtype)
        if self.mixer is None:
            mask = mask.unsqueeze(-1).expand_as(q_tot)
        n = mask.sum().clamp_min(1.0)
        loss = (mask * (q_tot - y) ** 2).sum() / n
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = clip_grad_norm(self._parameters(), self.max_grad_norm)
        self.optimizer.step()
        return QMIXStats(
            loss=loss.item(),
            q_tot_mean=((mask * q_tot).sum() / n).item(),
            target_mean=((mask * y).sum() / n).item(),
            grad_norm=grad_norm,
        )

    def _unroll(self, network: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
        """Run the recurrent agent network over `(B, T + 1, N, in)` inputs -> `(B, T + 1, N, A)`."""
        hidden = network.init_hidden(inputs.shape[0], self.n_agents).to(inputs.device)
        qs = []
        for t in range(inputs.shape[1]):
            q, hidden = network(inputs[:, t], hidden)
            qs.append(q)
        return torch.stack(qs, dim=1)

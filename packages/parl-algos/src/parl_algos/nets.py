"""Building blocks for the small networks of the examples and tests.

Models stay the user's to define (a `parl.Model` per task); these helpers only save writing the
same stack of linear layers again.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import nn

import parl

__all__ = ["ActorCriticMLP", "ContinuousActorCriticMLP", "ValueMLP", "mlp"]


def mlp(
    in_dim: int,
    hidden: Sequence[int],
    out_dim: int,
    *,
    activation: type[nn.Module] = nn.ReLU,
    orthogonal_gain: float | None = None,
) -> nn.Sequential:
    """A multilayer perceptron `in_dim -> hidden... -> out_dim` with `activation` in between.

    Args:
        in_dim: input features.
        hidden: widths of the hidden layers.
        out_dim: output features (no activation after the last layer).
        activation: the nonlinearity class.
        orthogonal_gain: when set, initialise the weights orthogonally (gain `sqrt(2)` for hidden
            layers, this gain for the output layer) and the biases to zero, as is usual for
            on-policy actor-critics; otherwise keep torch's default initialisation.
    """
    sizes = [in_dim, *hidden, out_dim]
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        linear = nn.Linear(a, b)
        last = i == len(sizes) - 2
        if orthogonal_gain is not None:
            nn.init.orthogonal_(linear.weight, orthogonal_gain if last else math.sqrt(2))
            nn.init.zeros_(linear.bias)
        layers.append(linear)
        if not last:
            layers.append(activation())
    return nn.Sequential(*layers)


class ActorCriticMLP(parl.Model):
    """Separate tanh MLPs for a categorical policy (logits) and a state value.

    The model interface of `A2C`, `PPO` and `IMPALA` for discrete actions, initialised as
    on-policy implementations usually are (orthogonal weights, a near-uniform first policy).

    Args:
        obs_dim: observation features.
        n_actions: number of discrete actions.
        hidden: widths of the hidden layers of each network.
    """

    def __init__(self, obs_dim: int, n_actions: int, hidden: Sequence[int] = (64, 64)) -> None:
        super().__init__()
        self.actor = mlp(obs_dim, hidden, n_actions, activation=nn.Tanh, orthogonal_gain=0.01)
        self.critic = mlp(obs_dim, hidden, 1, activation=nn.Tanh, orthogonal_gain=1.0)

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """Return the action logits `(batch, n_actions)`."""
        return self.actor(obs)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """Return the state values `(batch,)`."""
        return self.critic(obs).squeeze(-1)


class ContinuousActorCriticMLP(parl.Model):
    """An actor and a Q-function critic for continuous actions in `[-1, 1]`, both ReLU MLPs.

    The model interface of `DDPG` (the defaults), `TD3` (`twin=True`) and `SAC`
    (`stochastic=True, twin=True`).

    Args:
        obs_dim: observation features.
        act_dim: action dimensions.
        hidden: widths of the hidden layers of the actor and of each critic.
        stochastic: the policy returns `(mean, log_std)` of a Gaussian (for SAC) instead of a
            deterministic `tanh` action.
        twin: two independent critics; `value` returns the pair `(Q1, Q2)`.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (256, 256),
        *,
        stochastic: bool = False,
        twin: bool = False,
    ) -> None:
        super().__init__()
        self.stochastic = stochastic
        self.actor = mlp(obs_dim, hidden, 2 * act_dim if stochastic else act_dim)
        self.critics = nn.ModuleList(
            mlp(obs_dim + act_dim, hidden, 1) for _ in range(2 if twin else 1)
        )

    def policy(self, obs: torch.Tensor):
        """Return `tanh(actor(obs))`, or `(mean, log_std)` when stochastic."""
        out = self.actor(obs)
        if self.stochastic:
            mean, log_std = out.chunk(2, dim=-1)
            return mean, log_std
        return torch.tanh(out)

    def value(self, obs: torch.Tensor, action: torch.Tensor):
        """Return `Q(s, a)` `(batch,)`, or the pair `(Q1, Q2)` with twin critics."""
        x = torch.cat([obs, action], dim=-1)
        q = tuple(critic(x).squeeze(-1) for critic in self.critics)
        return q if len(q) == 2 else q[0]

    def get_actor_params(self) -> list[nn.Parameter]:
        """The parameters the actor's optimizer updates."""
        return list(self.actor.parameters())

    def get_critic_params(self) -> list[nn.Parameter]:
        """The parameters the critics' optimizer updates."""
        return list(self.critics.parameters())


class ValueMLP(parl.Model):
    """A state-value network `V(s)`, a ReLU MLP (IQL's value model).

    Args:
        obs_dim: observation features.
        hidden: widths of the hidden layers.
    """

    def __init__(self, obs_dim: int, hidden: Sequence[int] = (256, 256)) -> None:
        super().__init__()
        self.net = mlp(obs_dim, hidden, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Return `V(obs)`, `(batch,)`."""
        return self.net(obs).squeeze(-1)

"""Building blocks for the networks of the examples and tests, and the DQN family's layers.

Models stay the user's to define (a `parl.Model` per task); these helpers only save writing the
same stack of layers again. For the DQN family: `NoisyLinear` (factorised Gaussian NoisyNet
layers), `DuelingHead` (value and advantage streams), `QHead` (the plain one) and `QNetwork`, an
MLP with either head, noisy or not, with one output or a distribution per action;
`NatureQNetwork` puts the same heads on `NatureCNN`, the convolutional torso of the Nature DQN
for stacked Atari frames, and `AtariActorCritic` a policy and a value on it (PPO, IMPALA).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

import parl
from parl_algos._distributions import DiagonalNormal

__all__ = [
    "ActorCriticMLP",
    "AtariActorCritic",
    "ContinuousActorCriticMLP",
    "DuelingHead",
    "GaussianActorCriticMLP",
    "NatureCNN",
    "NatureQNetwork",
    "NoisyLinear",
    "QHead",
    "QNetwork",
    "ValueMLP",
    "mlp",
    "noise_free",
    "reset_noise",
]


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


class GaussianActorCriticMLP(parl.Model):
    """Separate tanh MLPs for a diagonal Gaussian policy and a state value.

    The model interface of `A2C` and `PPO` for continuous actions: `policy` returns
    `Normal(mean(obs), exp(log_std))` over the action's dimensions as one event, with a
    learned log standard deviation that does not depend on the state (as PPO's MuJoCo setting,
    Schulman et al. 2017, https://arxiv.org/abs/1707.06347). The environment clips the actions
    drawn to its bounds.

    Args:
        obs_dim: observation features.
        act_dim: action dimensions.
        hidden: widths of the hidden layers of each network.
        log_std_init: the first log standard deviation of every dimension.
    """

    def __init__(
        self,
        obs_dim: int,
        act_dim: int,
        hidden: Sequence[int] = (64, 64),
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        self.actor = mlp(obs_dim, hidden, act_dim, activation=nn.Tanh, orthogonal_gain=0.01)
        self.log_std = nn.Parameter(torch.full((act_dim,), float(log_std_init)))
        self.critic = mlp(obs_dim, hidden, 1, activation=nn.Tanh, orthogonal_gain=1.0)

    def policy(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        """Return the action distribution of a batch of observations (batch shape `(B,)`)."""
        mean = self.actor(obs)
        # `Independent(Normal(...), 1)`'s numbers without its argument handling, which costs
        # about as much as the small network's forward pass (every environment step while
        # collecting, every minibatch update while learning).
        return DiagonalNormal(mean, self.log_std.exp().expand_as(mean))

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

    def policy(self, obs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Return `tanh(actor(obs))`, or `(mean, log_std)` when stochastic."""
        out = self.actor(obs)
        if self.stochastic:
            mean, log_std = out.chunk(2, dim=-1)
            return mean, log_std
        return torch.tanh(out)

    def value(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
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


class NoisyLinear(nn.Module):
    """A linear layer whose weights are Gaussian, with factorised noise (NoisyNet).

    Fortunato et al., "Noisy networks for exploration", ICLR 2018,
    https://arxiv.org/abs/1706.10295, section 3.2: `y = (mu_w + sigma_w * eps_w) x + mu_b +
    sigma_b * eps_b` with `eps_w = f(eps_out) f(eps_in)^T`, `eps_b = f(eps_out)`,
    `f(x) = sign(x) sqrt(|x|)` and `eps_in`, `eps_out` standard normal. The noise stays fixed
    until `reset_noise()`; in evaluation mode (`module.eval()`) the layer uses the means only,
    so acting greedily is deterministic. The noise is not part of the `state_dict`.

    Args:
        in_features: input features.
        out_features: output features.
        sigma0: the initial noise scale; each sigma starts at `sigma0 / sqrt(in_features)`.
    """

    def __init__(self, in_features: int, out_features: int, sigma0: float = 0.5) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features)
        sigma = sigma0 / math.sqrt(in_features)
        self.weight_mu = nn.Parameter(
            torch.empty(out_features, in_features).uniform_(-bound, bound)
        )
        self.weight_sigma = nn.Parameter(torch.full((out_features, in_features), sigma))
        self.bias_mu = nn.Parameter(torch.empty(out_features).uniform_(-bound, bound))
        self.bias_sigma = nn.Parameter(torch.full((out_features,), sigma))
        self.register_buffer("weight_epsilon", torch.zeros(out_features, in_features), False)
        self.register_buffer("bias_epsilon", torch.zeros(out_features), False)
        self.reset_noise()

    @torch.no_grad()
    def reset_noise(self) -> None:
        """Draw new factorised noise (from torch's global generator)."""
        eps_in = _scaled_noise(self.in_features, self.weight_mu.device)
        eps_out = _scaled_noise(self.out_features, self.weight_mu.device)
        self.weight_epsilon.copy_(torch.outer(eps_out, eps_in))
        self.bias_epsilon.copy_(eps_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`(B, in_features)` -> `(B, out_features)`, noisy in training mode."""
        if not self.training:
            return F.linear(x, self.weight_mu, self.bias_mu)
        weight = self.weight_mu + self.weight_sigma * self.weight_epsilon
        bias = self.bias_mu + self.bias_sigma * self.bias_epsilon
        return F.linear(x, weight, bias)


def _scaled_noise(size: int, device: torch.device) -> torch.Tensor:
    x = torch.randn(size, device=device)
    return x.sign() * x.abs().sqrt()


def reset_noise(module: nn.Module) -> None:
    """Draw new noise in every `NoisyLinear` inside `module`."""
    for m in module.modules():
        if isinstance(m, NoisyLinear):
            m.reset_noise()


@contextlib.contextmanager
def noise_free(module: nn.Module) -> Iterator[None]:
    """Within the block, every `NoisyLinear` of `module` in training mode uses its means only.

    How a noisy network acts greedily on its means (as Tianshou's collector acts with its
    Rainbow in evaluation mode) while the rest of `module` keeps its mode.
    """
    layers = [m for m in module.modules() if isinstance(m, NoisyLinear) and m.training]
    for m in layers:
        m.train(False)
    try:
        yield
    finally:
        for m in layers:
            m.train(True)


def _linear(in_features: int, out_features: int, noisy: bool) -> nn.Module:
    return NoisyLinear(in_features, out_features) if noisy else nn.Linear(in_features, out_features)


class QHead(nn.Module):
    """Features -> one output per action: `(B, n_actions)`, or `(B, n_actions, n_atoms)`.

    Args:
        in_features: features of the body's output.
        n_actions: number of discrete actions.
        n_atoms: outputs per action (1: a Q-value; more: C51's logits or QR-DQN's quantiles).
        noisy: a `NoisyLinear` layer instead of a linear one.
    """

    def __init__(
        self, in_features: int, n_actions: int, *, n_atoms: int = 1, noisy: bool = False
    ) -> None:
        super().__init__()
        self.n_actions, self.n_atoms = n_actions, n_atoms
        self.out = _linear(in_features, n_actions * n_atoms, noisy)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """`(B, in_features)` -> `(B, n_actions)` or `(B, n_actions, n_atoms)`."""
        out = self.out(features)
        return out if self.n_atoms == 1 else out.view(-1, self.n_actions, self.n_atoms)


class DuelingHead(nn.Module):
    """The dueling architecture: `Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a')`.

    Wang et al., "Dueling network architectures for deep reinforcement learning", ICML 2016,
    https://arxiv.org/abs/1511.06581, equation 9. With `n_atoms > 1` the streams are combined
    atom by atom, as Rainbow does for its logits (and as works for quantiles).

    Args:
        in_features: features of the body's output.
        n_actions: number of discrete actions.
        n_atoms: outputs per action (1: a Q-value; more: C51's logits or QR-DQN's quantiles).
        noisy: `NoisyLinear` layers in both streams.
    """

    def __init__(
        self, in_features: int, n_actions: int, *, n_atoms: int = 1, noisy: bool = False
    ) -> None:
        super().__init__()
        self.n_actions, self.n_atoms = n_actions, n_atoms
        self.advantage = _linear(in_features, n_actions * n_atoms, noisy)
        self.value = _linear(in_features, n_atoms, noisy)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """`(B, in_features)` -> `(B, n_actions)` or `(B, n_actions, n_atoms)`."""
        value = self.value(features).view(-1, 1, self.n_atoms)
        advantage = self.advantage(features).view(-1, self.n_actions, self.n_atoms)
        q = value + advantage - advantage.mean(dim=1, keepdim=True)
        return q.squeeze(-1) if self.n_atoms == 1 else q


class QNetwork(parl.Model):
    """A ReLU MLP with a `QHead` or a `DuelingHead`: the network of the DQN family.

    `QNetwork(obs_dim, n_actions)` is DQN's; `dueling=True` DuelingDQN's; C51 and QR-DQN need
    `n_atoms`; Rainbow's is `QNetwork(obs_dim, n_actions, dueling=True, noisy=True, n_atoms=51)`.

    Args:
        obs_dim: observation features.
        n_actions: number of discrete actions.
        hidden: widths of the hidden layers (all plain linear layers, each followed by a ReLU).
        dueling: a `DuelingHead` instead of a `QHead`.
        noisy: `NoisyLinear` layers in the head.
        n_atoms: outputs per action (1: Q-values `(B, n_actions)`; more: `(B, n_actions,
            n_atoms)`).
    """

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        hidden: Sequence[int] = (64, 64),
        *,
        dueling: bool = False,
        noisy: bool = False,
        n_atoms: int = 1,
    ) -> None:
        super().__init__()
        if not hidden:
            raise ValueError(f"QNetwork: {hidden=} needs at least one hidden layer")
        self.body = nn.Sequential(mlp(obs_dim, hidden[:-1], hidden[-1]), nn.ReLU())
        self.head = _q_head(hidden[-1], n_actions, dueling=dueling, noisy=noisy, n_atoms=n_atoms)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """`(B, obs_dim)` -> `(B, n_actions)` or `(B, n_actions, n_atoms)`."""
        return self.head(self.body(obs))


def _q_head(
    in_features: int, n_actions: int, *, dueling: bool, noisy: bool, n_atoms: int
) -> nn.Module:
    head = DuelingHead if dueling else QHead
    return head(in_features, n_actions, n_atoms=n_atoms, noisy=noisy)


class NatureCNN(nn.Module):
    """The torso of the Nature DQN: stacked uint8 frames `(B, C, 84, 84)` -> `(B, features)`.

    Mnih et al., "Human-level control through deep reinforcement learning", Nature 2015,
    https://doi.org/10.1038/nature14236: the frames scaled to `[0, 1]`, then three convolutions
    (32 8x8 filters with stride 4, 64 4x4 with stride 2, 64 3x3 with stride 1) and a dense layer,
    each followed by a ReLU. The frames stay uint8 up to here (in replay memories and on the
    wire: a quarter of float32's bytes).

    Args:
        in_channels: the stacked frames (4 from `make_atari_env`).
        features: width of the dense layer (the Nature DQN's 512).
    """

    def __init__(self, in_channels: int = 4, features: int = 512) -> None:
        super().__init__()
        self.out_features = features
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, features),
            nn.ReLU(),
        )

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """`(B, in_channels, 84, 84)` frames (uint8, 0-255) -> `(B, features)`."""
        return self.net(frames.float() / 255.0)


class AtariActorCritic(parl.Model):
    """`NatureCNN` shared by a categorical policy and a state value: PPO's and IMPALA's on Atari.

    The policy's layer starts orthogonal with gain 0.01 (near-uniform first actions), as in the
    PPO paper's Atari setting.

    Args:
        n_actions: number of discrete actions.
        hidden: width of the torso's dense layer (the Nature CNN's 512).
        in_channels: the stacked frames of an observation.
    """

    def __init__(self, n_actions: int, hidden: int = 512, in_channels: int = 4) -> None:
        super().__init__()
        self.trunk = NatureCNN(in_channels, hidden)
        self.actor = nn.Linear(hidden, n_actions)
        self.critic = nn.Linear(hidden, 1)
        nn.init.orthogonal_(self.actor.weight, 0.01)
        nn.init.zeros_(self.actor.bias)

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """Return the action logits `(batch, n_actions)` of uint8 frames."""
        return self.actor(self.trunk(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """Return the state values `(batch,)` of uint8 frames."""
        return self.critic(self.trunk(obs)).squeeze(-1)

    def policy_and_value(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the logits and the state values of uint8 frames, the CNN run once for both.

        An update that needs both pays for one pass of the torso, forward and backward.
        """
        features = self.trunk(obs)
        return self.actor(features), self.critic(features).squeeze(-1)


class NatureQNetwork(parl.Model):
    """`NatureCNN` with a `QHead` or a `DuelingHead`: the DQN family's network on Atari frames.

    `NatureQNetwork(n_actions)` is the Nature DQN's; the options are `QNetwork`'s, so that
    Rainbow's is `NatureQNetwork(n_actions, dueling=True, noisy=True, n_atoms=51)` (noisy
    layers in the head only, as `QNetwork`'s).

    Args:
        n_actions: number of discrete actions.
        in_channels: the stacked frames of an observation.
        hidden: width of the torso's dense layer.
        dueling: a `DuelingHead` instead of a `QHead`.
        noisy: `NoisyLinear` layers in the head.
        n_atoms: outputs per action (1: Q-values `(B, n_actions)`; more: `(B, n_actions,
            n_atoms)`).
    """

    def __init__(
        self,
        n_actions: int,
        *,
        in_channels: int = 4,
        hidden: int = 512,
        dueling: bool = False,
        noisy: bool = False,
        n_atoms: int = 1,
    ) -> None:
        super().__init__()
        self.body = NatureCNN(in_channels, hidden)
        self.head = _q_head(hidden, n_actions, dueling=dueling, noisy=noisy, n_atoms=n_atoms)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """`(B, in_channels, 84, 84)` frames -> `(B, n_actions)` or `(B, n_actions, n_atoms)`."""
        return self.head(self.body(obs))


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

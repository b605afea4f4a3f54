"""R2D2: a recurrent Q-network learned from replayed sequences, with distributed actors.

Kapturowski et al., "Recurrent experience replay in distributed reinforcement learning",
ICLR 2019, https://openreview.net/forum?id=r1lyTjAqYX. Its pieces, each in its own name:

- `RecurrentQNetwork`: an MLP encoder, an LSTM and a Q (or dueling) head, unrolled over
  time-major sequences from a recurrent state held as one `(B, state_size)` tensor;
- `value_rescale` / `inverse_value_rescale`: the invertible `h(x) = sign(x)(sqrt(|x| + 1) - 1)
  + eps x` that the targets are squashed with (Pohlen et al. 2018,
  https://arxiv.org/abs/1805.11593);
- `sequence_n_step_returns`: n-step returns inside a sequence, cut at the episode's end and
  at the sequence's;
- `sequence_priority`: a sequence's priority, `eta max_t |td_t| + (1 - eta) mean_t |td_t|`;
- `R2D2`: the loss, with a burn-in that only warms the stored state up (no gradient) and the
  n-step double-Q target on rescaled values;
- `FeedForwardQNetwork`: the memoryless ablation, an MLP with the same interface;
- `R2D2Args`: the hyperparameters of a run (sequences, actors, replay, schedules);
- `R2D2Agent`: epsilon-greedy acting that carries the recurrent state, and learning from a
  `parl_algos.sequence_replay.SequenceReplayMemory`;
- `R2D2Actor`: a few environments with per-environment epsilons, folding their steps into
  sequences (with the states the actor had) and their initial priorities; `RemoteR2D2Actor` is
  it as a `@parl.remote_class(wait=False)` actor of the cluster;
- `GreedyPolicy` and `StateReset`: the agent's greedy policy one observation at a time, its
  state reset with every reset of the environment it is evaluated in.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import parl
from parl_algos._common import check_positive, clip_grad_norm, to_tensor
from parl_algos.nets import DuelingHead, QHead, mlp
from parl_algos.sequence_replay import (
    SequenceAdder,
    SequenceBatch,
    SequenceRecord,
    SequenceReplayMemory,
)

__all__ = [
    "ActorOutput",
    "FeedForwardQNetwork",
    "GreedyPolicy",
    "R2D2",
    "R2D2Actor",
    "R2D2Agent",
    "R2D2Args",
    "R2D2Stats",
    "RecurrentQNetwork",
    "RemoteR2D2Actor",
    "StateReset",
    "apex_epsilons",
    "inverse_value_rescale",
    "sequence_n_step_returns",
    "sequence_priority",
    "value_rescale",
]


def value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """`h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x`: squashes large returns, invertibly."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def inverse_value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """`h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)`."""
    root = (torch.sqrt(1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return torch.sign(x) * (root.square() - 1.0)


def sequence_n_step_returns(
    reward: torch.Tensor,
    terminal: torch.Tensor,
    mask: torch.Tensor,
    bootstrap: torch.Tensor,
    gamma: float,
    n_step: int,
) -> torch.Tensor:
    """n-step returns of every step of time-major sequences, cut at their ends.

    For step `t` with `k = min(n_step, end - t)` steps left before the sequence's last real
    step `end - 1`: `sum_{i<k} gamma^i r_{t+i} + gamma^k bootstrap_{t+k}`, without the
    bootstrap where step `t + k - 1` terminated. Steps at or past `end` get 0.

    Args:
        reward: `(T, B)` rewards.
        terminal: `(T, B)` 1 on a step that reached a terminal state.
        mask: `(T, B)` 1 on real steps (a sequence's real steps end at its last 1).
        bootstrap: `(T + 1, B)` the value of each observation (`obs[t]` for row `t`).
        gamma: discount of one step.
        n_step: the most steps a return spans.
    """
    t_len = reward.shape[0]
    t = torch.arange(t_len, device=reward.device).unsqueeze(1)
    steps = torch.arange(1, t_len + 1, device=reward.device, dtype=mask.dtype).unsqueeze(1)
    end = (mask * steps).amax(dim=0).long()  # (B,) one past the last real step
    k = (end.unsqueeze(0) - t).clamp(min=0, max=n_step)  # (T, B)
    ret = torch.zeros_like(reward)
    for i in range(n_step):
        row = reward.gather(0, (t + i).clamp(max=t_len - 1).expand_as(reward))
        ret = ret + torch.where(k > i, gamma**i * row, torch.zeros_like(row))
    last = (t + k - 1).clamp(min=0)
    done = terminal.gather(0, last)
    discount = torch.pow(torch.full_like(reward, gamma), k.to(reward.dtype)) * (1.0 - done)
    value = ret + discount * bootstrap.gather(0, t + k)
    return torch.where(k > 0, value, torch.zeros_like(value))


def sequence_priority(td_error: torch.Tensor, mask: torch.Tensor, eta: float) -> torch.Tensor:
    """R2D2's priority of each sequence: `eta max_t |td| + (1 - eta) mean_t |td|` (real steps).

    Args:
        td_error: `(T, B)` TD errors.
        mask: `(T, B)` 1 on the steps that count.
        eta: weight of the maximum (0.9 in the paper).
    """
    td = td_error.abs() * mask
    count = mask.sum(dim=0)
    mean = td.sum(dim=0) / count.clamp(min=1.0)
    return torch.where(count > 0, eta * td.amax(dim=0) + (1.0 - eta) * mean, torch.zeros_like(mean))


def apex_epsilons(n: int, base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """Ape-X's exploration rates of `n` actors: `base ** (1 + alpha * i / (n - 1))`.

    One actor gets `base` itself. R2D2's actors and `parl-train`'s Ape-X (a DQN-family agent
    in async mode) both explore at these rates.
    """
    if n < 1:
        raise ValueError(f"apex_epsilons: {n=} actors; there must be at least 1")
    if n == 1:
        return np.array([base])
    return base ** (1.0 + alpha * np.arange(n) / (n - 1))


class RecurrentQNetwork(parl.Model):
    """A ReLU encoder, an LSTM and a Q (or dueling) head, over time-major sequences.

    The recurrent state is one tensor `(B, state_size)`, the LSTM's `h` and `c` side by side
    (`state_size = 2 * lstm_size`), so that memories store it as one array.

    Args:
        obs_dim: observation features.
        n_actions: number of discrete actions.
        hidden: width of the encoder's layer.
        lstm_size: the LSTM's hidden size.
        dueling: a `parl_algos.nets.DuelingHead` instead of a `QHead`.
    """

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        hidden: int = 64,
        lstm_size: int = 64,
        *,
        dueling: bool = False,
    ) -> None:
        super().__init__()
        self.n_actions = n_actions
        self.lstm_size = lstm_size
        self.encoder = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU())
        self.lstm = nn.LSTM(hidden, lstm_size)
        head = DuelingHead if dueling else QHead
        self.head = head(lstm_size, n_actions)

    @property
    def state_size(self) -> int:
        """Length of the recurrent state vector."""
        return 2 * self.lstm_size

    def initial_state(self, batch_size: int) -> torch.Tensor:
        """The state at an episode's start: zeros `(batch_size, state_size)`."""
        device = next(self.parameters()).device
        return torch.zeros(batch_size, self.state_size, device=device)

    def forward(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(T, B, obs_dim)` and `(B, state_size)` -> Q-values `(T, B, n_actions)`, new state."""
        t_len, b = obs.shape[:2]
        x = self.encoder(obs.reshape(t_len * b, -1)).view(t_len, b, -1)
        h, c = state.chunk(2, dim=-1)
        out, (h, c) = self.lstm(x, (h.unsqueeze(0).contiguous(), c.unsqueeze(0).contiguous()))
        q = self.head(out.reshape(t_len * b, -1)).view(t_len, b, -1)
        return q, torch.cat([h[0], c[0]], dim=-1)


class FeedForwardQNetwork(parl.Model):
    """The memoryless ablation: an MLP with `RecurrentQNetwork`'s interface, ignoring the state.

    Args:
        obs_dim: observation features.
        n_actions: number of discrete actions.
        hidden: width of the two hidden layers.
    """

    state_size = 1

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.n_actions = n_actions
        self.net = mlp(obs_dim, (hidden, hidden), n_actions)

    def initial_state(self, batch_size: int) -> torch.Tensor:
        """A dummy state of one zero per row."""
        return torch.zeros(batch_size, 1, device=next(self.parameters()).device)

    def forward(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(T, B, obs_dim)` -> Q-values `(T, B, n_actions)`; the state passes through."""
        return self.net(obs), state


@dataclass
class R2D2Args:
    """The hyperparameters of an R2D2 run: `examples/r2d2`'s flags, `parl-train`'s `[agent]`."""

    memory: bool = True
    """The LSTM network; false swaps in a feed-forward one (same pipeline, no memory)."""
    envs_per_actor: int = 4
    """Environments each actor steps, each with its own exploration rate."""
    collect_steps: int = 32
    """Steps of every environment of an actor per call."""
    burn_in: int = 8
    """Steps at the start of each sequence that only warm the recurrent state up."""
    learn_len: int = 16
    """Steps of each sequence that are learned from (and the stride between sequences)."""
    n_step: int = 3
    """Steps of the n-step returns."""
    gamma: float = 0.99
    """Discount factor."""
    lr: float = 2e-3
    """Adam learning rate."""
    batch_size: int = 32
    """Sequences per update."""
    buffer_size: int = 4000
    """Sequences the replay memory holds."""
    learning_starts: int = 64
    """Sequences in the memory before learning starts."""
    updates_per_collect: int = 8
    """Updates after each actor call that returned sequences."""
    target_update_interval: int = 100
    """Updates between two copies of the model into the target network."""
    sync_every: int = 20
    """Updates between two weight sends to the actors."""
    hidden_size: int = 64
    """Width of the encoder's layer."""
    lstm_size: int = 64
    """The LSTM's hidden size."""
    eps_base: float = 0.4
    """Exploration rates `eps_base ** (1 + eps_alpha * i / (n - 1))` over the n environments."""
    eps_alpha: float = 7.0
    """How fast the exploration rates fall from environment to environment."""
    alpha: float = 0.9
    """Prioritization exponent of the replay memory."""
    beta: float = 0.6
    """Importance-sampling exponent (rises to 1 over a quarter of total_steps' updates)."""
    eta: float = 0.9
    """Weight of the maximum TD error in a sequence's priority."""


@dataclass(frozen=True)
class R2D2Stats:
    """What one `R2D2.learn` call did."""

    loss: float
    """The importance-weighted squared TD loss (on rescaled values) of the batch."""
    q_mean: float
    """Mean `Q(s, a)` of the learned steps (rescaled values, as the network outputs)."""
    priority: np.ndarray
    """`(B,)` each sequence's new priority (`sequence_priority` of its TD errors)."""


class R2D2(parl.Algorithm):
    """R2D2: n-step double Q-learning on replayed sequences of a recurrent network.

    Each sequence of `T` steps starts from the recurrent state its actor had; the first
    `burn_in` steps are unrolled without gradient to warm that state up (stale after the
    network changed), in both the online and the target network; the steps after them are
    learned from. A step's target is `h(sum_{i<n} gamma^i r_{t+i} + gamma^n h^-1(Q_target(s_{t+n},
    argmax_a Q(s_{t+n}, a))))`, cut short at the episode's and the sequence's end
    (`sequence_n_step_returns`), `h` the value rescaling. The loss is half the squared TD error,
    averaged over a sequence's real steps and weighted by its importance weight; the new
    priority of a sequence is `sequence_priority(td, eta)`. Kapturowski et al., ICLR 2019,
    https://openreview.net/forum?id=r1lyTjAqYX.

    Args:
        model: a `parl.Model` with `forward(obs (T, B, ...), state (B, S)) -> (q (T, B, A),
            state)`, e.g. `RecurrentQNetwork`.
        lr: Adam learning rate.
        gamma: discount factor of one step.
        n_step: steps of the returns.
        burn_in: steps at the start of every sequence that only warm the state up.
        double: choose the bootstrap action with the online network (double Q).
        rescale_eps: the `eps` of the value rescaling (None: no rescaling).
        eta: weight of the maximum in a sequence's priority.
        max_grad_norm: clip the gradient's global norm to this (None: no clipping).
    """

    def __init__(
        self,
        model: parl.Model,
        *,
        lr: float = 1e-3,
        gamma: float = 0.997,
        n_step: int = 5,
        burn_in: int = 40,
        double: bool = True,
        rescale_eps: float | None = 1e-3,
        eta: float = 0.9,
        max_grad_norm: float | None = 40.0,
    ) -> None:
        super().__init__(model)
        check_positive("R2D2", lr=lr, n_step=n_step)
        if burn_in < 0:
            raise ValueError(f"R2D2: {burn_in=} must be >= 0")
        if not 0.0 <= eta <= 1.0:
            raise ValueError(f"R2D2: {eta=} must be in [0, 1]")
        self.gamma = gamma
        self.n_step = int(n_step)
        self.burn_in = int(burn_in)
        self.double = double
        self.rescale_eps = rescale_eps
        self.eta = eta
        self.max_grad_norm = max_grad_norm
        self.target_model = copy.deepcopy(model)
        self.target_model.requires_grad_(False)
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    @torch.no_grad()
    def predict(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Q-values `(B, n_actions)` of one step of observations `(B, ...)`, and the new state."""
        q, state = self.model(obs.unsqueeze(0), state)
        return q[0], state

    def sync_target(self, decay: float = 0.0) -> None:
        """Copy the model into the target network (`decay > 0`: a soft, Polyak update)."""
        self.model.sync_weights_to(self.target_model, decay=decay)

    def learn(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        terminal: torch.Tensor,
        mask: torch.Tensor,
        state: torch.Tensor,
        weight: torch.Tensor | None = None,
    ) -> R2D2Stats:
        """One gradient step on a batch of sequences, time-major.

        Args:
            obs: `(T + 1, B, ...)` observations.
            action: `(T, B)` int64 actions.
            reward: `(T, B)` rewards.
            terminal: `(T, B)` 1 on a step that reached a terminal state.
            mask: `(T, B)` 1 on real steps, 0 on padding.
            state: `(B, S)` the recurrent state before each sequence's first real step.
            weight: `(B,)` importance-sampling weights (default: 1).
        """
        td, q, m = self._td_errors(obs, action, reward, terminal, mask, state, self.target_model)
        per_sequence = (0.5 * td.square() * m).sum(dim=0) / m.sum(dim=0).clamp(min=1.0)
        loss = per_sequence.mean() if weight is None else (weight * per_sequence).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip_grad_norm(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        q_mean = (q * m).sum() / m.sum().clamp(min=1.0)
        return R2D2Stats(
            loss=loss.item(),
            q_mean=q_mean.item(),
            priority=sequence_priority(td.detach(), m, self.eta).cpu().numpy(),
        )

    @torch.no_grad()
    def priorities(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        terminal: torch.Tensor,
        mask: torch.Tensor,
        state: torch.Tensor,
    ) -> torch.Tensor:
        """`(B,)` the sequences' priorities under the model alone (an actor's initial ones).

        The model stands in for the target network too, as actors hold no target network.
        """
        td, _, m = self._td_errors(obs, action, reward, terminal, mask, state, self.model)
        return sequence_priority(td, m, self.eta)

    def _td_errors(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        reward: torch.Tensor,
        terminal: torch.Tensor,
        mask: torch.Tensor,
        state: torch.Tensor,
        target_model: nn.Module,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """TD errors, Q(s, a) and the mask of the learned steps `[burn_in, T)`: `(T - bi, B)`."""
        bi = self.burn_in
        if obs.shape[0] - 1 <= bi:
            raise ValueError(
                f"R2D2: sequences of {obs.shape[0] - 1} steps leave nothing to learn after "
                f"{bi} burn-in steps; make them longer or lower burn_in"
            )
        hold = mask[:bi] == 0
        online_state = self._burn_in(self.model, obs[:bi], state, hold)
        target_state = self._burn_in(target_model, obs[:bi], state, hold)
        q_all, _ = self.model(obs[bi:], online_state)  # (T + 1 - bi, B, A)
        with torch.no_grad():
            q_next, _ = target_model(obs[bi:], target_state)
            chooser = q_all.detach() if self.double else q_next
            boot = q_next.gather(2, chooser.argmax(dim=2, keepdim=True)).squeeze(2)
            if self.rescale_eps is not None:
                boot = inverse_value_rescale(boot, self.rescale_eps)
            boot = torch.cat([boot.new_zeros(bi, boot.shape[1]), boot])  # rows of obs
            y = sequence_n_step_returns(reward, terminal, mask, boot, self.gamma, self.n_step)[bi:]
            if self.rescale_eps is not None:
                y = value_rescale(y, self.rescale_eps)
        q = q_all[:-1].gather(2, action[bi:].long().unsqueeze(2)).squeeze(2)
        m = mask[bi:].to(q.dtype)
        return (y - q) * m, q, m

    @staticmethod
    @torch.no_grad()
    def _burn_in(model: nn.Module, obs: torch.Tensor, state: torch.Tensor, hold: torch.Tensor):
        """Unroll `model` over the burn-in steps without gradient; `hold`: keep the state."""
        if obs.shape[0] == 0:
            return state
        padded = hold.sum(dim=0)
        if bool(((padded == 0) | (padded == obs.shape[0])).all()):
            # Each burn-in all real or all padding (an episode's first sequence, whenever
            # burn_in <= learn_len): one unroll, and the padded ones keep their state.
            warm = model(obs, state)[1]
            return torch.where((padded == obs.shape[0]).unsqueeze(1), state, warm)
        for t in range(obs.shape[0]):  # front padding: the state waits for the first real step
            new = model(obs[t : t + 1], state)[1]
            state = torch.where(hold[t].unsqueeze(1), state, new)
        return state


class R2D2Agent(parl.Agent):
    """Epsilon-greedy acting with a recurrent state, and learning from a sequence memory.

    `sample` and `predict` take the state and return the new one (the caller keeps a state per
    environment and resets it with `initial_state` when an episode starts); `learn` draws a
    `SequenceBatch`, weights the loss by its importance weights and writes the new priorities
    back.

    Args:
        algorithm: an `R2D2`.
        n_actions: the number of discrete actions.
        seed: seed of the exploration.
    """

    _state_attrs: ClassVar[tuple[str, ...]] = ("learn_steps",)

    def __init__(self, algorithm: R2D2, n_actions: int, *, seed: int | None = None) -> None:
        if not isinstance(algorithm, R2D2):
            raise TypeError(f"R2D2Agent drives R2D2, got {type(algorithm).__name__}")
        super().__init__(algorithm)
        self.n_actions = n_actions
        self.learn_steps = 0
        self._rng = np.random.default_rng(seed)

    def seed_exploration(self, seed: int | None) -> None:
        """Restart the exploration's random generator from `seed`."""
        self._rng = np.random.default_rng(seed)

    def initial_state(self, batch_size: int) -> np.ndarray:
        """Zero states `(batch_size, state_size)`, those of episodes' first steps."""
        return self.alg.model.initial_state(batch_size).cpu().numpy()

    def predict(self, obs: np.ndarray, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Greedy actions `(B,)` for observations `(B, ...)`, and the next states."""
        q, state_t = self.alg.predict(to_tensor(obs, self.device), to_tensor(state, self.device))
        return q.argmax(dim=1).cpu().numpy(), state_t.cpu().numpy()

    def sample(
        self, obs: np.ndarray, state: np.ndarray, epsilon: np.ndarray | float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Epsilon-greedy actions (`epsilon` per row or one for all), and the next states."""
        action, state = self.predict(obs, state)
        explore = self._rng.random(len(action)) < np.asarray(epsilon)
        random_action = self._rng.integers(self.n_actions, size=len(action))
        return np.where(explore, random_action, action), state

    def priorities(self, records: Sequence[SequenceRecord]) -> np.ndarray:
        """Initial priorities of freshly built sequences under this agent's model."""
        tensors = _time_major(_stack(records), self.device)
        return self.alg.priorities(*tensors).cpu().numpy()

    def learn(self, memory: SequenceReplayMemory, batch_size: int) -> R2D2Stats:
        """One update from a prioritized minibatch of `memory`; priorities are written back."""
        self.learn_steps += 1
        batch = memory.sample_batch(batch_size)
        tensors = _time_major(batch, self.device)
        stats = self.alg.learn(*tensors, weight=to_tensor(batch.weights, self.device))
        memory.update_priorities(batch.indices, stats.priority)
        return stats


def _stack(records: Sequence[SequenceRecord]) -> SequenceRecord:
    return SequenceRecord(*(np.stack(column) for column in zip(*records, strict=True)))


def _time_major(batch: SequenceBatch | SequenceRecord, device: torch.device):
    """The batch-major arrays of a batch as `R2D2.learn`'s time-major tensors."""
    obs = to_tensor(np.swapaxes(batch.obs, 0, 1), device)
    rest = (to_tensor(np.swapaxes(x, 0, 1), device) for x in batch[1:5])
    return (obs, *rest, to_tensor(batch.state, device))


class ActorOutput(NamedTuple):
    """What one `R2D2Actor.collect` call returns."""

    records: list[SequenceRecord]
    """The sequences completed in the call."""
    priorities: np.ndarray
    """`(len(records),)` their initial priorities under the actor's weights."""
    episodes: list[tuple[float, int]]
    """`(return, length)` of each episode finished in the call."""
    env_steps: int
    """Env steps taken in the call (summed over the environments)."""


class R2D2Actor:
    """A few environments stepped with an `R2D2Agent` copy, their steps folded into sequences.

    Each environment keeps its own recurrent state (zero at every episode start), exploration
    rate and `SequenceAdder`. `collect` steps every environment `steps` times and returns the
    sequences it completed with their initial priorities; `set_weights` loads the learner's.

    Args:
        env_fn: a zero-argument callable returning a `gymnasium.Env` with discrete actions.
        agent: the agent to act with (a copy of the learner's).
        epsilons: the exploration rate of each environment (their number is the number of
            environments).
        burn_in: burn-in steps of each sequence (the learner's `R2D2.burn_in`).
        learn_len: learned steps of each sequence.
        seed: environment `j` is reset with `seed + j` first; the exploration is seeded too.

    Torch runs on one thread in the actor's process (set when the actor is made).
    """

    def __init__(
        self,
        env_fn: Callable[[], gym.Env],
        agent: R2D2Agent,
        epsilons: Sequence[float],
        *,
        burn_in: int,
        learn_len: int,
        seed: int | None = None,
    ) -> None:
        torch.set_num_threads(1)  # one core an actor: threads of its own only compete
        self.agent = agent
        agent.seed_exploration(seed)
        self.envs = [env_fn() for _ in epsilons]
        self.epsilons = np.asarray(epsilons, dtype=np.float64)
        space = self.envs[0].observation_space
        state_size = agent.alg.model.state_size
        self.adders = [
            SequenceAdder(burn_in, learn_len, space.shape, state_size, space.dtype)
            for _ in self.envs
        ]
        self.obs = np.stack(
            [
                env.reset(seed=None if seed is None else seed + j)[0]
                for j, env in enumerate(self.envs)
            ]
        )
        self.state = agent.initial_state(len(self.envs))
        self._returns = np.zeros(len(self.envs))
        self._lengths = np.zeros(len(self.envs), dtype=np.int64)

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Load the learner's weights into the acting copy."""
        self.agent.set_weights(weights)

    def collect(self, steps: int) -> ActorOutput:
        """Step every environment `steps` times; return the sequences completed meanwhile."""
        records: list[SequenceRecord] = []
        episodes: list[tuple[float, int]] = []
        for _ in range(steps):
            action, next_state = self.agent.sample(self.obs, self.state, self.epsilons)
            for j, env in enumerate(self.envs):
                obs, reward, terminated, truncated, _ = env.step(int(action[j]))
                record = self.adders[j].append(
                    self.obs[j], action[j], reward, obs, terminated, truncated, self.state[j]
                )
                if record is not None:
                    records.append(record)
                self._returns[j] += float(reward)
                self._lengths[j] += 1
                if terminated or truncated:
                    episodes.append((float(self._returns[j]), int(self._lengths[j])))
                    self._returns[j], self._lengths[j] = 0.0, 0
                    obs, _ = env.reset()
                    next_state[j] = 0.0
                self.obs[j] = obs
            self.state = next_state
        priorities = self.agent.priorities(records) if records else np.zeros(0)
        return ActorOutput(records, priorities, episodes, steps * len(self.envs))

    def evaluate(self, env_fn: Callable[[], gym.Env], episodes: int, seed: int) -> float:
        """The mean return of `episodes` greedy episodes in a fresh environment."""
        env, total = env_fn(), 0.0
        for i in range(episodes):
            obs, _ = env.reset(seed=seed + i)
            state, done = self.agent.initial_state(1), False
            while not done:
                action, state = self.agent.predict(obs[None], state)
                obs, reward, terminated, truncated, _ = env.step(int(action[0]))
                total += float(reward)
                done = terminated or truncated
        env.close()
        return total / episodes

    def close(self) -> None:
        """Close the environments."""
        for env in self.envs:
            env.close()


RemoteR2D2Actor = parl.remote_class(wait=False)(R2D2Actor)
"""`R2D2Actor` as a cluster actor whose methods return `RemoteFuture`s."""


class GreedyPolicy:
    """An `R2D2Agent`'s greedy policy, one observation at a time, carrying its recurrent state.

    Evaluate it in `StateReset(env, policy)`, whose resets start a new state.

    Args:
        agent: the agent to act with.
    """

    def __init__(self, agent: R2D2Agent) -> None:
        self.agent = agent
        self.reset()

    def reset(self) -> None:
        """Start an episode: the zero state."""
        self.state = self.agent.initial_state(1)

    def __call__(self, obs: np.ndarray) -> int:
        """The greedy action of one observation; the state moves on."""
        action, self.state = self.agent.predict(obs[None], self.state)
        return int(action[0])


class StateReset(gym.Wrapper):
    """Resets a `GreedyPolicy`'s state with every reset of the environment.

    Args:
        env: the environment the policy acts in.
        policy: the policy whose state each reset restarts.
    """

    def __init__(self, env: gym.Env, policy: GreedyPolicy) -> None:
        super().__init__(env)
        self.policy = policy

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """Reset the environment and the policy's state."""
        self.policy.reset()
        return self.env.reset(**kwargs)

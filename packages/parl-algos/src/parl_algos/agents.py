"""Agents of the zoo's algorithms: numpy observations in, actions and updates out.

- `ActorCriticAgent` drives `A2C` or `PPO` from trajectories of a `VectorCollector`: batched
  sampling while collecting, the most probable action when evaluating, and GAE advantages
  plus one `learn` call per trajectory.
- `BehaviourPPOAgent` is PPO's agent on the stale trajectories of policy copies (`parl-train`'s
  `async` mode): the behaviour policy's log-probabilities ride with each action.
- `IMPALAAgent` is both halves of `IMPALA`: an actor's sampling, which keeps the behaviour
  policy's logits beside each action, and the learner's `learn` from such trajectories.
- `DQNAgent` acts epsilon-greedily with a linearly decaying epsilon and learns from a
  `ReplayMemory` or a `PrioritizedReplayMemory`: it reads either's batch by name, weighting
  the loss and writing back priorities when the batch carries them.
- `ContinuousAgent` drives `DDPG`, `TD3` or `SAC` from a `ReplayMemory`, and the offline
  `CQL`, `IQL` and `BC` from an `OfflineDataset`.

Agents are where the environment's numpy meets the algorithm's tensors, through one helper
(`to_tensor`, onto the model's device); the algorithms themselves never see numpy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import torch
from torch.distributions import Categorical

import parl
from parl.utils import OfflineDataset, ReplayMemory
from parl_algos._common import to_tensor
from parl_algos.a2c import A2C, A2CStats
from parl_algos.bc import BC, BCStats
from parl_algos.ddpg import DDPG, DDPGStats
from parl_algos.dqn import DQN, DQNStats
from parl_algos.impala import IMPALA, IMPALAStats
from parl_algos.iql import IQL, IQLStats
from parl_algos.nets import noise_free
from parl_algos.ppo import PPO, PPOStats
from parl_algos.rollout import AdvantageBatch, Trajectory, compute_advantages
from parl_algos.sac import SAC, SACStats
from parl_algos.td3 import TD3, TD3Stats

__all__ = ["ActorCriticAgent", "BehaviourPPOAgent", "ContinuousAgent", "DQNAgent", "IMPALAAgent"]


class ActorCriticAgent(parl.Agent):
    """The agent of `A2C` and `PPO` on vector environments.

    Args:
        algorithm: an `A2C` or a `PPO`.
        gamma: discount factor of the advantages.
        gae_lambda: the GAE lambda (1: Monte-Carlo advantages over the trajectory).
        reward_fn: maps the trajectory's rewards to those learned from (Atari's `np.sign`;
            None: as they are); the episodes' returns, counted by the collectors, stay the
            environment's.
    """

    reward_fn: Callable[[np.ndarray], np.ndarray] | None = None  # agents pickled before it

    def __init__(
        self,
        algorithm: A2C | PPO,
        *,
        gamma: float,
        gae_lambda: float,
        reward_fn: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        if not isinstance(algorithm, A2C | PPO):
            raise TypeError(f"ActorCriticAgent drives A2C or PPO, got {type(algorithm).__name__}")
        super().__init__(algorithm)
        self.gamma = gamma
        self.gae_lambda = gae_lambda
        self.reward_fn = reward_fn

    def sample(self, obs: np.ndarray) -> np.ndarray:
        """Actions drawn from the policy for a batch of observations (collection)."""
        return self.alg.sample(to_tensor(obs, self.device)).cpu().numpy()

    def predict(self, obs: np.ndarray) -> int | np.ndarray:
        """The most probable action for one observation (evaluation)."""
        action = self.alg.predict(to_tensor(obs, self.device).unsqueeze(0))[0].cpu().numpy()
        return action.item() if action.ndim == 0 else action

    def advantages(
        self,
        trajectory: Trajectory,
        value_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> AdvantageBatch:
        """The trajectory as a flat batch with GAE advantages under the current value function.

        `value_fn` maps `(B, *obs_shape)` to `(B,)` without autograd (None: the algorithm's).
        """
        if self.reward_fn is not None:
            trajectory = dataclasses.replace(trajectory, reward=self.reward_fn(trajectory.reward))
        return compute_advantages(
            trajectory, value_fn or self.alg.value, gamma=self.gamma, gae_lambda=self.gae_lambda
        )

    def advantages_and_log_prob(
        self, trajectory: Trajectory
    ) -> tuple[AdvantageBatch, torch.Tensor]:
        """`advantages` and the current policy's log-probs of the batch's actions (`pi_old`).

        From the one pass over the observations that the values take where the model's heads
        share a torso (`policy_and_value`, logits out), else from a second.
        """
        if not hasattr(self.alg.model, "policy_and_value"):
            b = self.advantages(trajectory)
            with torch.no_grad():
                return b, self.alg.distribution(b.obs).log_prob(b.action)
        logits: list[torch.Tensor] = []

        @torch.no_grad()
        def value_fn(obs: torch.Tensor) -> torch.Tensor:
            policy, value = self.alg.policy_and_value(obs)
            logits.append(policy)
            return value

        b = self.advantages(trajectory, value_fn)  # the batch's observations come first
        with torch.no_grad():
            return b, Categorical(logits=logits[0][: len(b.obs)]).log_prob(b.action)

    def learn(self, trajectory: Trajectory) -> A2CStats | PPOStats:
        """Update the algorithm from one trajectory of on-policy experience."""
        if isinstance(self.alg, PPO):
            return self._learn_ppo(*self.advantages_and_log_prob(trajectory))
        b = self.advantages(trajectory)
        return self.alg.learn(b.obs, b.action, b.advantage, b.value_target)

    def _learn_ppo(
        self, b: AdvantageBatch, old_log_prob: torch.Tensor, weight: torch.Tensor | None = None
    ) -> PPOStats:
        return self.alg.learn(
            b.obs,
            b.action,
            b.advantage,
            b.value_target,
            value=b.value,
            old_log_prob=old_log_prob,
            weight=weight,
        )


class BehaviourPPOAgent(ActorCriticAgent):
    """PPO from the trajectories of stale policy copies (`async` mode): its own correction.

    The workers' copies keep `log mu(a|s)` of their (behaviour) policy beside each action
    (`extras["log_prob"]`). The learner takes decoupled PPO's objective (Hilton et al. 2021,
    see `PPO.learn`'s `weight`): the ratio is clipped around its own policy as the update
    begins, `pi_old`, and each sample is weighted by `min(pi_old / mu, rho_bar)`, V-trace's
    truncated importance weight. Clipping around `mu` instead held a stale batch's updates
    back: where the learner's policy had already moved past the clip range since the copy
    collected, those samples gave no gradient from the first epoch on. The advantages use
    the learner's current value function. When `mu` is the learner's policy every weight is
    1 and the update is on-policy PPO's.

    Args:
        algorithm: a `PPO`.
        gamma: discount factor of the advantages.
        gae_lambda: the GAE lambda.
        rho_bar: the truncation of the importance weights.
    """

    def __init__(
        self,
        algorithm: PPO,
        *,
        gamma: float,
        gae_lambda: float,
        rho_bar: float = 1.0,
        reward_fn: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        super().__init__(algorithm, gamma=gamma, gae_lambda=gae_lambda, reward_fn=reward_fn)
        self.rho_bar = rho_bar

    @torch.no_grad()
    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions drawn from the policy for a batch of observations, and their log-probs."""
        dist = self.alg.distribution(to_tensor(obs, self.device))
        action = dist.sample()
        return action.cpu().numpy(), {"log_prob": dist.log_prob(action).cpu().numpy()}

    def learn(self, trajectory: Trajectory) -> PPOStats:
        """Update from one (possibly stale) trajectory, its samples weighted by `pi_old / mu`."""
        b, old_log_prob = self.advantages_and_log_prob(trajectory)
        behaviour = to_tensor(trajectory.extras["log_prob"].reshape(-1), self.device)
        weight = (old_log_prob - behaviour).exp().clamp(max=self.rho_bar)
        return self._learn_ppo(b, old_log_prob, weight)


class IMPALAAgent(parl.Agent):
    """The agent of `IMPALA`, on both sides: actors collect with it, the learner learns with it.

    An actor holds one with a possibly stale copy of the learner's weights (`set_weights`) and
    passes `sample` to a `VectorCollector`, which keeps the behaviour policy's logits in the
    trajectory's `extras["logits"]`; the learner's `learn` takes such a trajectory as it is.

    Args:
        algorithm: an `IMPALA`.
        reward_fn: maps the trajectory's rewards to those learned from (Atari's `np.sign`;
            None: as they are).
    """

    reward_fn: Callable[[np.ndarray], np.ndarray] | None = None  # agents pickled before it

    def __init__(
        self,
        algorithm: IMPALA,
        *,
        reward_fn: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        if not isinstance(algorithm, IMPALA):
            raise TypeError(f"IMPALAAgent drives IMPALA, got {type(algorithm).__name__}")
        super().__init__(algorithm)
        self.reward_fn = reward_fn

    @torch.no_grad()
    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Actions drawn from the policy for a batch of observations, and the policy's logits."""
        logits = self.alg.model.policy(to_tensor(obs, self.device))
        action = Categorical(logits=logits).sample()
        return action.cpu().numpy(), {"logits": logits.cpu().numpy()}

    def predict(self, obs: np.ndarray) -> int:
        """The most probable action for one observation (evaluation)."""
        return int(self.alg.predict(to_tensor(obs, self.device).unsqueeze(0))[0])

    def learn(self, trajectory: Trajectory) -> IMPALAStats:
        """One V-trace update from a trajectory collected with `sample` (possibly stale)."""
        t = trajectory
        reward = t.reward if self.reward_fn is None else self.reward_fn(t.reward)
        return self.alg.learn(
            *(
                to_tensor(x, self.device)
                for x in (t.obs, t.action, t.extras["logits"], reward, t.done)
            )
        )


class DQNAgent(parl.Agent):
    """Epsilon-greedy acting and replay learning for `DQN`.

    Epsilon falls linearly from `eps_start` to `eps_end` over `eps_decay_steps` calls of
    `sample`, then stays. `learn` takes a batch from any replay memory: when the batch is a
    `PrioritizedBatch` its weights scale the loss and the new TD errors go back to the memory
    as priorities (the memory anneals its own beta, see `PrioritizedReplayMemory`).

    Args:
        algorithm: a `DQN`.
        n_actions: the number of discrete actions.
        eps_start: exploration rate at the start.
        eps_end: exploration rate after the decay.
        eps_decay_steps: `sample` calls over which epsilon decays.
        seed: seed of the exploration.
        act_with_noise: a noisy network's `sample` acts with its current noise (the Rainbow
            paper's); False: with its means (`parl_algos.nets.noise_free`), so that epsilon
            alone explores.
    """

    _state_attrs: ClassVar[tuple[str, ...]] = ("sample_steps", "learn_steps")

    def __init__(
        self,
        algorithm: DQN,
        n_actions: int,
        *,
        eps_start: float = 1.0,
        eps_end: float = 0.05,
        eps_decay_steps: int = 10_000,
        seed: int | None = None,
        act_with_noise: bool = True,
    ) -> None:
        if not isinstance(algorithm, DQN):
            raise TypeError(f"DQNAgent drives DQN, got {type(algorithm).__name__}")
        super().__init__(algorithm)
        self.n_actions = n_actions
        self.eps_start = eps_start
        self.eps_end = eps_end
        self.eps_decay_steps = max(int(eps_decay_steps), 1)
        self.sample_steps = 0
        self.learn_steps = 0
        self.act_with_noise = act_with_noise
        self._rng = np.random.default_rng(seed)

    @property
    def epsilon(self) -> float:
        """The exploration rate of the next `sample` call."""
        frac = min(self.sample_steps / self.eps_decay_steps, 1.0)
        return self.eps_start + frac * (self.eps_end - self.eps_start)

    def sample(self, obs: np.ndarray) -> int:
        """A random action with probability epsilon, else the greedy one (collection)."""
        eps = self.epsilon
        self.sample_steps += 1
        if self._rng.random() < eps:
            return int(self._rng.integers(self.n_actions))
        if self.act_with_noise:
            return self.predict(obs)
        with noise_free(self.alg.model):
            return self.predict(obs)

    def predict(self, obs: np.ndarray) -> int:
        """The action of the largest Q-value (evaluation)."""
        return int(self.alg.predict(to_tensor(obs, self.device).unsqueeze(0))[0].argmax())

    def learn(self, memory: ReplayMemory, batch_size: int) -> DQNStats:
        """One update from a minibatch of `memory` (prioritized or uniform)."""
        self.learn_steps += 1
        batch = memory.sample_batch(batch_size)
        b = [to_tensor(x, self.device) for x in batch[:5]]
        weight = None if batch.weights is None else to_tensor(batch.weights, self.device)
        discount = None if batch.discount is None else to_tensor(batch.discount, self.device)
        stats = self.alg.learn(*b, weight=weight, discount=discount)
        if batch.indices is not None:
            memory.update_priorities(batch.indices, stats.td_error)
        return stats


class ContinuousAgent(parl.Agent):
    """Acting and replay learning for continuous actions in `[-1, 1]`.

    Args:
        algorithm: a `DDPG`, `TD3` or `SAC` (or `CQL`, a SAC), or the offline `IQL` or `BC`.
    """

    def __init__(self, algorithm: DDPG | TD3 | SAC | IQL | BC) -> None:
        if not isinstance(algorithm, DDPG | TD3 | SAC | IQL | BC):
            raise TypeError(
                "ContinuousAgent drives DDPG, TD3, SAC, CQL, IQL or BC, "
                f"got {type(algorithm).__name__}"
            )
        super().__init__(algorithm)

    def sample(self, obs: np.ndarray) -> np.ndarray:
        """An exploratory action for one observation (collection)."""
        obs_t = to_tensor(obs, self.device, torch.float32).unsqueeze(0)
        return self.alg.sample(obs_t)[0].cpu().numpy()

    def predict(self, obs: np.ndarray) -> np.ndarray:
        """The deterministic action for one observation (evaluation)."""
        obs_t = to_tensor(obs, self.device, torch.float32).unsqueeze(0)
        return self.alg.predict(obs_t)[0].cpu().numpy()

    def learn(
        self, memory: ReplayMemory | OfflineDataset, batch_size: int
    ) -> DDPGStats | TD3Stats | SACStats | IQLStats | BCStats:
        """One update from a uniformly sampled minibatch of `memory` (or an offline dataset)."""
        batch = memory.sample_batch(batch_size)
        return self.alg.learn(*(to_tensor(x, self.device) for x in batch[:5]))

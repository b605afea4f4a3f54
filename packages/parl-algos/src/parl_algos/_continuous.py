"""The part that DDPG and TD3 share: a deterministic actor, its critic, and their targets.

The model provides `policy(obs)` -> actions in `[-1, 1]` (a tanh output; rescale to the
environment's bounds outside, e.g. with `gymnasium.wrappers.RescaleAction`), `value(obs, action)`
-> Q-values, and `get_actor_params()` / `get_critic_params()` for the two optimizers (PARL's
model interface for actor-critic algorithms).
"""

from __future__ import annotations

import copy
from typing import ClassVar

import torch

import parl
from parl_algos._common import check_positive

__all__ = ["DeterministicActorCritic", "check_actor_critic_model"]


def check_actor_critic_model(owner: str, model: parl.Model) -> None:
    """Raise a TypeError unless `model` has the actor-critic methods the algorithm calls."""
    for method in ("policy", "value", "get_actor_params", "get_critic_params"):
        if not callable(getattr(model, method, None)):
            raise TypeError(
                f"{owner} needs a model with policy(obs), value(obs, action), "
                f"get_actor_params() and get_critic_params(); {type(model).__name__} lacks "
                f"{method}()"
            )


class DeterministicActorCritic(parl.Algorithm):
    """Base of DDPG and TD3: acting with Gaussian exploration noise, and the target networks.

    Args:
        model: the actor-critic `parl.Model` (see the module docstring).
        actor_lr: Adam learning rate of the actor.
        critic_lr: Adam learning rate of the critic.
        gamma: discount factor.
        tau: Polyak rate of the target networks: `target = (1 - tau) target + tau model`.
        exploration_noise: standard deviation of the Gaussian noise `sample` adds to actions.
        seed: seed of the exploration noise.
    """

    _state_attrs: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        model: parl.Model,
        *,
        actor_lr: float,
        critic_lr: float,
        gamma: float,
        tau: float,
        exploration_noise: float,
        seed: int | None,
    ) -> None:
        super().__init__(model)
        owner = type(self).__name__
        check_actor_critic_model(owner, model)
        check_positive(owner, actor_lr=actor_lr, critic_lr=critic_lr, tau=tau)
        self.gamma = gamma
        self.tau = tau
        self.exploration_noise = exploration_noise
        self.target_model = copy.deepcopy(model)
        self.target_model.requires_grad_(False)
        self.actor_optimizer = torch.optim.Adam(model.get_actor_params(), lr=actor_lr)
        self.critic_optimizer = torch.optim.Adam(model.get_critic_params(), lr=critic_lr)
        self._generator = torch.Generator().manual_seed(
            int(torch.randint(2**62, ()).item()) if seed is None else seed
        )

    @torch.no_grad()
    def predict(self, obs: torch.Tensor) -> torch.Tensor:
        """Return the deterministic action `mu(s)` for a batch of observations (evaluation)."""
        return self.model.policy(obs)

    @torch.no_grad()
    def sample(self, obs: torch.Tensor) -> torch.Tensor:
        """Return `mu(s) + N(0, exploration_noise^2)`, clipped to `[-1, 1]` (data collection)."""
        action = self.model.policy(obs)
        noise = torch.randn(action.shape, generator=self._generator) * self.exploration_noise
        return (action + noise.to(action.device)).clamp(-1.0, 1.0)

    def sync_target(self) -> None:
        """Move the target networks a step `tau` towards the model."""
        self.model.sync_weights_to(self.target_model, decay=1.0 - self.tau)

"""`parl.Algorithm`: how a model learns -- the loss and the optimizer step.

An algorithm owns one or more `parl.Model`s (online and target networks, actor and critic) and
their optimizers. Subclasses override `predict`, `sample` and `learn`. Everything stateful that
the algorithm holds in attributes (modules, optimizers, schedulers, tensors such as SAC's
`log_alpha`, and the names in `_state_attrs`) is saved and restored by `Agent.save`/`restore`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from parl._model import Model

__all__ = ["Algorithm"]

# What `state_dict` saves by calling the attribute's own `state_dict()`.
_STATEFUL = (nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)


class Algorithm:
    """Base class of every PARL algorithm.

    Args:
        model: the main model (`self.model`); algorithms with several models keep the others in
            attributes of their own.

    Attributes:
        _state_attrs: names of extra plain attributes (counters, scalars) that belong in a
            checkpoint alongside the torch state, for example `("total_it",)`.
    """

    _state_attrs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, model: Model | None = None) -> None:
        if model is not None and not isinstance(model, Model):
            raise TypeError(
                f"Algorithm expects a parl.Model, got {type(model).__name__}; "
                "derive your network from parl.Model instead of torch.nn.Module"
            )
        self.model = model

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        """Return the greedy/deterministic output of the policy (evaluation)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement predict()")

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        """Return an exploratory output of the policy (data collection)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement sample()")

    def learn(self, *args: Any, **kwargs: Any) -> Any:
        """Run one update from a batch of data and return its statistics."""
        raise NotImplementedError(f"{type(self).__name__} does not implement learn()")

    def get_weights(self) -> dict[str, np.ndarray]:
        """Return the weights of `self.model` as numpy arrays (see `Model.get_weights`)."""
        return {} if self.model is None else self.model.get_weights()

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Load weights returned by `get_weights` into `self.model`."""
        if self.model is None:
            raise ValueError(f"{type(self).__name__} has no model to set weights on")
        self.model.set_weights(weights)

    def modules(self) -> dict[str, nn.Module]:
        """Return the torch modules this algorithm holds, by attribute name."""
        return {k: v for k, v in vars(self).items() if isinstance(v, nn.Module)}

    def state_dict(self) -> dict[str, Any]:
        """Return everything needed to resume training: modules, optimizers, schedulers, tensors."""
        state: dict[str, Any] = {}
        for name, value in vars(self).items():
            if isinstance(value, _STATEFUL):
                state[name] = value.state_dict()
            elif isinstance(value, torch.Tensor):
                state[name] = value.detach().clone()
        for name in self._state_attrs:
            state[name] = getattr(self, name)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned, in place (optimizers keep their identity)."""
        own = self.state_dict()
        missing = sorted(own.keys() - state.keys())
        unexpected = sorted(state.keys() - own.keys())
        if missing or unexpected:
            raise KeyError(
                f"{type(self).__name__}.load_state_dict: the checkpoint does not match this "
                f"algorithm (missing {missing}, unexpected {unexpected})"
            )
        for name, saved in state.items():
            value = getattr(self, name)
            if isinstance(value, torch.Tensor):
                with torch.no_grad():
                    value.copy_(saved)
            elif name in self._state_attrs:
                setattr(self, name, saved)
            else:
                value.load_state_dict(saved)

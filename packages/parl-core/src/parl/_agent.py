"""`parl.Agent`: the bridge between an environment and an algorithm.

The agent turns observations (numpy) into the algorithm's tensors and back, decides when to
learn, and saves and restores the whole training state: every model of the algorithm and the
optimizers, so that training resumes where it stopped.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from parl._algorithm import Algorithm

__all__ = ["Agent"]

_CHECKPOINT_FORMAT = "parl.agent/1"


class Agent:
    """Base class of every PARL agent.

    Args:
        algorithm: the algorithm this agent drives (`self.alg`).

    Attributes:
        _state_attrs: names of extra plain attributes of the agent (exploration rate, step
            counters) that belong in a checkpoint.
    """

    _state_attrs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, algorithm: Algorithm) -> None:
        if not isinstance(algorithm, Algorithm):
            raise TypeError(f"Agent expects a parl.Algorithm, got {type(algorithm).__name__}")
        self.alg = algorithm
        self.training = True

    # -- to override ---------------------------------------------------------------------------
    def predict(self, *args: Any, **kwargs: Any) -> Any:
        """Return the action to take in evaluation (no exploration)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement predict()")

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        """Return an action to take while collecting data (with exploration)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement sample()")

    def learn(self, *args: Any, **kwargs: Any) -> Any:
        """Update the algorithm from a batch of experience."""
        raise NotImplementedError(f"{type(self).__name__} does not implement learn()")

    # -- weights and modes ---------------------------------------------------------------------
    def get_weights(self) -> dict[str, np.ndarray]:
        """Return the weights of the algorithm's main model (numpy arrays)."""
        return self.alg.get_weights()

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Load weights into the algorithm's main model."""
        self.alg.set_weights(weights)

    def train(self) -> None:
        """Put every model of the algorithm in training mode (dropout, batch-norm updates on)."""
        self.training = True
        for module in self.alg.modules().values():
            module.train()

    def eval(self) -> None:
        """Put every model of the algorithm in evaluation mode."""
        self.training = False
        for module in self.alg.modules().values():
            module.eval()

    @property
    def device(self) -> torch.device:
        """The device of the main model's first parameter (CPU when it has none)."""
        model = self.alg.model
        for param in [] if model is None else model.parameters():
            return param.device
        return torch.device("cpu")

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The whole training state: what `save` writes and `load_state_dict` takes.

        Every model, optimizer and scheduler of the algorithm, plus the `_state_attrs` of
        algorithm and agent. As torch's `state_dict`, the tensors are the live ones: save or
        copy the result to keep it past the next update.
        """
        return {
            "format": _CHECKPOINT_FORMAT,
            "algorithm": self.alg.state_dict(),
            "agent": {name: getattr(self, name) for name in self._state_attrs},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from what `state_dict` returned (or a whole-agent checkpoint held)."""
        if not isinstance(state, dict) or state.get("format") != _CHECKPOINT_FORMAT:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: not an agent's state_dict (its format "
                f"is {_CHECKPOINT_FORMAT!r}); pass what Agent.state_dict() returned"
            )
        self.alg.load_state_dict(state["algorithm"])
        for name, value in state["agent"].items():
            setattr(self, name, value)

    def save(self, save_path: str | os.PathLike[str], model: nn.Module | None = None) -> None:
        """Save a checkpoint to `save_path`, atomically (a crash never leaves half a file).

        With no `model`, the checkpoint holds the whole training state (`state_dict`). With a
        `model`, only that model's `state_dict()` is saved (PARL's behaviour).
        """
        payload = self.state_dict() if model is None else model.state_dict()
        _atomic_torch_save(payload, os.fspath(save_path))

    def restore(
        self,
        save_path: str | os.PathLike[str],
        model: nn.Module | None = None,
        map_location: Any = None,
    ) -> None:
        """Load a checkpoint written by `save` (a whole-agent one, or one model's state dict).

        Args:
            save_path: the file to read.
            model: where to load a single-model checkpoint (default: the algorithm's main model).
            map_location: as for `torch.load`, e.g. `"cpu"` to load a GPU checkpoint on a CPU.
        """
        payload = torch.load(os.fspath(save_path), map_location=map_location, weights_only=True)
        if isinstance(payload, dict) and payload.get("format") == _CHECKPOINT_FORMAT:
            if model is not None:
                raise ValueError(
                    f"restore: {os.fspath(save_path)!r} is a whole-agent checkpoint; "
                    "call restore(path) without `model`"
                )
            self.load_state_dict(payload)
            return
        target = self.alg.model if model is None else model
        if target is None:
            raise ValueError("restore: the algorithm has no model; pass `model=`")
        target.load_state_dict(payload)


def _atomic_torch_save(payload: Any, path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".parl-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise

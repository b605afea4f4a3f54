"""The parameters an ES agent searches over, as one flat float64 vector, whatever holds them.

Two holders: a numpy vector with a policy function `policy(weights, obs)`, or a torch
`nn.Module` whose parameters are flattened in `parameters()` order and written back in place
(each in its own dtype). torch is imported only when a module is handed in.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["ModuleParams", "Policy", "VectorParams", "is_torch_module", "make_params"]

Policy = Callable[[np.ndarray, Any], Any]


def is_torch_module(obj: object) -> bool:
    """Whether `obj` is a `torch.nn.Module` (never imports torch: a module implies it is loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


class VectorParams:
    """A numpy vector acted on by `policy(weights, obs)`."""

    def __init__(self, weights: np.ndarray, policy: Policy | None) -> None:
        self.weights = np.array(weights, dtype=np.float64).ravel()
        self.policy = policy

    @property
    def dim(self) -> int:
        return self.weights.size

    def get(self) -> np.ndarray:
        return self.weights.copy()

    def set(self, vector: np.ndarray) -> None:
        self.weights[:] = vector

    def predict(self, obs: Any) -> Any:
        if self.policy is None:
            raise TypeError(
                "ESAgent.predict needs a policy for a numpy weight vector: pass "
                "ESAgent(config, model=weights, policy=lambda weights, obs: ...), or a torch "
                "nn.Module as the model"
            )
        return self.policy(self.weights, obs)

    def copy(self) -> VectorParams:
        return VectorParams(self.weights, self.policy)


class ModuleParams:
    """The parameters of a torch module, flattened in `parameters()` order."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self._params = [p for p in module.parameters()]
        self.dim = sum(p.numel() for p in self._params)

    def get(self) -> np.ndarray:
        import torch

        with torch.no_grad():
            parts = [p.detach().reshape(-1).to("cpu", torch.float64) for p in self._params]
            return torch.cat(parts).numpy() if parts else np.zeros(0)

    def set(self, vector: np.ndarray) -> None:
        import torch

        vector = np.asarray(vector, dtype=np.float64)
        start = 0
        with torch.no_grad():
            for p in self._params:
                chunk = torch.from_numpy(vector[start : start + p.numel()])
                p.copy_(chunk.reshape(p.shape))  # cast to the parameter's dtype and device
                start += p.numel()

    def predict(self, obs: Any) -> Any:
        import torch

        with torch.no_grad():
            first = next(iter(self._params), None)
            dtype = first.dtype if first is not None else torch.float32
            device = first.device if first is not None else "cpu"
            out = self.module(torch.as_tensor(np.asarray(obs), dtype=dtype, device=device))
        return out.cpu().numpy() if isinstance(out, torch.Tensor) else out

    def copy(self) -> ModuleParams:
        return ModuleParams(copy.deepcopy(self.module))


def make_params(model: Any, policy: Policy | None) -> VectorParams | ModuleParams:
    """Wrap a numpy vector (with an optional policy) or a torch module."""
    if is_torch_module(model):
        if policy is not None:
            raise TypeError("ESAgent: `policy` is for numpy weight vectors; a module predicts")
        return ModuleParams(model)
    array = np.asarray(model)
    if array.dtype.kind not in "fiu" or array.ndim == 0:
        raise TypeError(
            f"ESAgent: model must be a numpy vector of weights or a torch nn.Module, got "
            f"{type(model).__name__}"
        )
    return VectorParams(array, policy)

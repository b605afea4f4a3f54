"""`parl.Model`: the user's network, a `torch.nn.Module` whose weights travel as numpy arrays.

A model is what a user defines (the network); an `Algorithm` defines how it learns. Weights are
exchanged as `{name: numpy.ndarray}` so they can cross process boundaries without torch on the
other side, and copied between models with `sync_weights_to` for target networks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch
from torch import nn

__all__ = ["Model"]


class Model(nn.Module):
    """Base class of every PARL model: a `torch.nn.Module` plus weight exchange.

    Subclass it exactly like `nn.Module` (define layers in `__init__`, the computation in
    `forward`). The weights of a model are its `state_dict()`: parameters and buffers.
    """

    def get_weights(self) -> dict[str, np.ndarray]:
        """Return a copy of every parameter and buffer as numpy arrays, keyed by state-dict name.

        The arrays are fresh copies on the CPU: changing them never changes the model. bfloat16
        tensors, which numpy cannot hold, are returned as float32 (an exact widening).
        """
        weights = {}
        for name, tensor in self.state_dict().items():
            tensor = tensor.detach()
            if tensor.dtype == torch.bfloat16:
                tensor = tensor.float()
            weights[name] = tensor.cpu().numpy().copy()
        return weights

    def set_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Copy `weights` (as returned by `get_weights`) into this model, in place.

        Every key of the model must be present, no other key may be, and each array must have the
        shape of its tensor. Everything is checked before anything is written, so a bad call
        leaves the model unchanged.

        Raises:
            KeyError: a key is missing or unexpected (the message lists them).
            ValueError: an array has the wrong shape.
        """
        state = self.state_dict()
        _check_same_keys(state.keys(), weights.keys(), "set_weights")
        arrays = {}
        for name, tensor in state.items():
            array = np.asarray(weights[name])
            if array.shape != tuple(tensor.shape):
                raise ValueError(
                    f"set_weights: {name!r} has shape {array.shape}, the model expects "
                    f"{tuple(tensor.shape)}"
                )
            arrays[name] = array
        with torch.no_grad():
            for name, tensor in state.items():
                array = arrays[name]
                if tensor.device.type == "cpu" and tensor.dtype != torch.bfloat16:
                    # One copy straight into the tensor's memory: no temporary tensor, and
                    # read-only arrays (weights received from another process) are fine.
                    np.copyto(tensor.numpy(), array, casting="same_kind")
                else:
                    tensor.copy_(torch.from_numpy(np.array(array)))

    def sync_weights_to(self, target_model: Model, decay: float = 0.0) -> None:
        """Soft-update `target_model`: `target = decay * target + (1 - decay) * self`.

        Applies to every parameter and floating-point buffer; integer buffers (such as batch-norm
        counters) are copied. `decay=0.0` makes the target an exact copy. Runs without autograd.

        Args:
            target_model: a model with the same state-dict keys and shapes (usually a deep copy).
            decay: weight of the target's old value, in [0, 1].
        """
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"sync_weights_to: {decay=} must be in [0, 1]")
        if target_model is self:
            raise ValueError("sync_weights_to: the target model is this model itself")
        source = self.state_dict()
        target = target_model.state_dict()
        _check_same_keys(target.keys(), source.keys(), "sync_weights_to")
        float_dst, float_src = [], []
        with torch.no_grad():
            for name, dst in target.items():
                src = source[name]
                if dst.shape != src.shape:
                    raise ValueError(
                        f"sync_weights_to: {name!r} has shape {tuple(src.shape)} here and "
                        f"{tuple(dst.shape)} in the target model"
                    )
                if src.device != dst.device:
                    src = src.to(dst.device)
                if dst.is_floating_point() and decay != 0.0:
                    float_dst.append(dst)
                    float_src.append(src)
                else:
                    dst.copy_(src)
            if float_dst:
                # dst + (1 - decay) * (src - dst) == decay * dst + (1 - decay) * src
                torch._foreach_lerp_(float_dst, float_src, 1.0 - decay)


def _check_same_keys(expected: Iterable[str], given: Iterable[str], where: str) -> None:
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing keys {missing}")
        if unexpected:
            parts.append(f"unexpected keys {unexpected}")
        raise KeyError(f"{where}: " + "; ".join(parts))

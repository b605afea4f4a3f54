"""Adam's step and the gradient-norm clip over a whole model at once, for small models on CPU.

`FlatAdamStep` runs the arithmetic of `torch.nn.utils.clip_grad_norm_` (foreach) followed by
`torch.optim.Adam.step` (`foreach=True`) in the same order on the optimizer's own state, so the
result is the same to the bit, but with the parameters and Adam's two moments packed into one
flat tensor each: each elementwise op runs once on all of them. On a small model the Python
and the per-tensor dispatch around torch's kernels (grouping tensors by device, hooks, checks,
a step count read per parameter, every op once a parameter) are most of an update's time;
`benchmarks/optim.py` measures it against `Adam(foreach=True)` and `Adam(fused=True)` on PPO's
update.
"""

from __future__ import annotations

import torch

__all__ = ["FlatAdamStep"]


class FlatAdamStep:
    """Clip `params`' gradient to a norm and take `optimizer`'s Adam step, on flat tensors.

    Call it where `clip_grad_norm_(params, max_norm)` then `optimizer.step()` would run: it
    returns True when it took the step, False when it leaves everything to torch (then call
    those two). It declines before Adam's first step (its state is made then), without a norm
    clip, with a parameter that got no gradient, or with options other than plain Adam's
    (several parameter groups, weight decay, amsgrad, maximize, capturable, differentiable,
    fused, a tensor learning rate). The gradient norm is taken per tensor, as torch does, and
    `p.grad` keeps the unclipped gradient. After its first step the parameters and Adam's
    moments are views of one flat tensor each; whatever rebinds them (`Module.to`,
    `Optimizer.load_state_dict`, unpickling) is seen and the flat tensors are made again.
    """

    def __init__(self) -> None:
        self._flat: dict[int, _FlatAdam] = {}

    def __getstate__(self) -> dict:
        return {"_flat": {}}  # keyed by the optimizers' ids: made again where it is unpickled

    @torch.no_grad()
    def __call__(
        self,
        optimizer: torch.optim.Optimizer,
        params: list[torch.nn.Parameter],
        max_norm: float | None,
    ) -> bool:
        """Clip and step as described above; whether it did (False: nothing was changed)."""
        group = optimizer.param_groups[0]
        if (
            max_norm is None
            or not isinstance(optimizer, torch.optim.Adam)
            or len(optimizer.param_groups) != 1
            or group["weight_decay"] != 0
            or group["amsgrad"]
            or group["maximize"]
            or group["capturable"]
            or group["differentiable"]
            or group["fused"]
            or isinstance(group["lr"], torch.Tensor)
        ):
            return False
        grads = [p.grad for p in params]
        if any(g is None for g in grads):
            return False
        flat = self._flat.get(id(optimizer))
        if flat is None or not flat.holds(params, optimizer):
            states = [optimizer.state.get(p) for p in params]
            if not all(states) or not _FlatAdam.fits(params, grads, states):
                return False
            flat = self._flat[id(optimizer)] = _FlatAdam(params, states)
        # torch.nn.utils.clip_grad_norm_ (foreach): the total 2-norm, then one scale.
        norms = torch._foreach_norm(grads, 2.0)
        total_norm = torch.linalg.vector_norm(torch.stack(norms), 2.0)
        clip_coef = float(max_norm) / (total_norm + 1e-6)
        grad = torch.cat([g.reshape(-1) for g in grads])
        grad.mul_(torch.clamp(clip_coef, max=1.0))
        # torch.optim.adam._multi_tensor_adam, capturable=False, amsgrad=False.
        beta1, beta2 = group["betas"]
        lr, eps = group["lr"], group["eps"]
        steps = flat.steps
        if steps[0].is_cpu:
            torch._foreach_add_(steps, torch.tensor(1.0, device="cpu"), alpha=1.0)
        else:
            torch._foreach_add_(steps, 1)
        flat.exp_avg.lerp_(grad, 1 - beta1)
        flat.exp_avg_sq.mul_(beta2)
        flat.exp_avg_sq.addcmul_(grad, grad, value=1 - beta2)
        step = steps[0].item()  # every parameter has taken every step
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        step_size = (lr / bias_correction1) * -1
        denom = flat.exp_avg_sq.sqrt()
        denom.div_(bias_correction2**0.5)
        denom.add_(eps)
        flat.param.addcdiv_(flat.exp_avg, denom, value=step_size)
        return True

    def flat_tensors(self, optimizer: torch.optim.Optimizer) -> tuple[torch.Tensor, ...] | None:
        """The flat parameter, first and second moment tensors of `optimizer` (None: none yet)."""
        flat = self._flat.get(id(optimizer))
        return None if flat is None else (flat.param, flat.exp_avg, flat.exp_avg_sq)


class _FlatAdam:
    """An optimizer's parameters and Adam moments made views of one flat tensor each.

    `param`, `exp_avg` and `exp_avg_sq` hold the values of every parameter (and of its
    `optimizer.state` entries) one after the other; the parameters' `data` and the state's
    tensors are rebound to views of them, so that one elementwise op updates them all. Made
    after Adam's first step (when its state exists). Anything that rebinds a parameter's data
    or the optimizer's state (`Module.to`, `Optimizer.load_state_dict`) breaks the tie, which
    `holds` sees: the caller then makes a new one from the tensors as they are.
    """

    def __init__(self, params: list[torch.nn.Parameter], states: list[dict]) -> None:
        self.param = self._pack([p.data for p in params])
        for p, view in zip(params, self._views(self.param, params), strict=True):
            p.data = view
        self.exp_avg = self._pack([s["exp_avg"] for s in states])
        self.exp_avg_sq = self._pack([s["exp_avg_sq"] for s in states])
        moments = zip(
            self._views(self.exp_avg, params), self._views(self.exp_avg_sq, params), strict=True
        )
        for s, (avg, avg_sq) in zip(states, moments, strict=True):
            s["exp_avg"], s["exp_avg_sq"] = avg, avg_sq
        self.steps = [s["step"] for s in states]
        self._bound = [
            (p.data_ptr(), s["exp_avg"], s["exp_avg_sq"])
            for p, s in zip(params, states, strict=True)
        ]

    @staticmethod
    def fits(
        params: list[torch.nn.Parameter], grads: list[torch.Tensor], states: list[dict]
    ) -> bool:
        """Whether these can share flat tensors: one device and dtype, dense, Adam's state."""
        first = params[0]
        for p, g, s in zip(params, grads, states, strict=True):
            if p.device != first.device or p.dtype != first.dtype or p.is_sparse or g.is_sparse:
                return False
            if not {"step", "exp_avg", "exp_avg_sq"} <= s.keys():
                return False
            if s["exp_avg"].dtype != first.dtype or s["exp_avg_sq"].dtype != first.dtype:
                return False
        return True

    def holds(self, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer) -> bool:
        """Whether every parameter and state tensor is still a view of the flat tensors."""
        if len(params) != len(self._bound):
            return False
        state = optimizer.state
        for p, (ptr, avg, avg_sq) in zip(params, self._bound, strict=True):
            s = state.get(p)
            if (
                p.data_ptr() != ptr
                or s is None
                or s["exp_avg"] is not avg
                or s["exp_avg_sq"] is not avg_sq
            ):
                return False
        return True

    @staticmethod
    def _pack(tensors: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1) for t in tensors])

    @staticmethod
    def _views(flat: torch.Tensor, like: list[torch.nn.Parameter]) -> list[torch.Tensor]:
        return [
            v.view_as(p) for v, p in zip(flat.split([p.numel() for p in like]), like, strict=True)
        ]

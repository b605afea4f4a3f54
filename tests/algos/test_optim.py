"""`parl_algos._optim.FlatAdamStep`: torch's norm clip and Adam step on flat tensors, to the bit."""

from __future__ import annotations

import pickle

import pytest
import torch

from parl_algos._optim import FlatAdamStep


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _train(flat: bool, *, steps: int = 6, max_norm: float = 0.5, **adam) -> torch.nn.Module:
    """`steps` steps on seeded batches, each clipped to `max_norm`; the learning rate is changed
    halfway (as an annealed run does) and the model pickled and unpickled once."""
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, **adam)
    step = FlatAdamStep()
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        if i == steps // 2:
            optimizer.param_groups[0]["lr"] = 0.004
            model, optimizer, step = pickle.loads(pickle.dumps((model, optimizer, step)))
        params = list(model.parameters())
        x, y = torch.randn(32, 5, generator=g), torch.randn(32, 3, generator=g)
        for p in params:
            p.grad = None
        torch.nn.functional.mse_loss(model(x), y).backward()
        if not (flat and step(optimizer, params, max_norm)):
            torch.nn.utils.clip_grad_norm_(params, max_norm)
            optimizer.step()
        if flat and i not in (0, steps // 2):  # Adam's state exists and is bound: it stepped
            assert step.flat_tensors(optimizer) is not None
    return model


@pytest.mark.parametrize("adam", [{}, {"foreach": True}, {"foreach": False}, {"eps": 1e-5}])
def test_flat_steps_are_torch_adams_steps_to_the_bit(adam):
    flat, torch_own = _train(True, **adam), _train(False, **adam)
    for a, b in zip(flat.parameters(), torch_own.parameters(), strict=True):
        assert torch.equal(a, b)


def test_it_leaves_to_torch_what_it_does_not_do():
    model = _model()
    params = list(model.parameters())
    for p in params:
        p.grad = torch.ones_like(p)
    step = FlatAdamStep()
    assert not step(torch.optim.Adam(params), params, 0.5)  # no state before the first step
    for options in ({"weight_decay": 0.1}, {"amsgrad": True}, {"maximize": True}):
        optimizer = torch.optim.Adam(params, **options)
        optimizer.step()
        assert not step(optimizer, params, 0.5)
    optimizer = torch.optim.Adam(params)
    optimizer.step()
    assert not step(optimizer, params, None)  # no clip
    assert not step(torch.optim.SGD(params, lr=0.1), params, 0.5)
    before = [p.detach().clone() for p in params]
    assert step(optimizer, params, 0.5)
    assert not any(torch.equal(a, b) for a, b in zip(before, params, strict=True))

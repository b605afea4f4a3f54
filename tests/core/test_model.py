"""`parl.Model`: weights as numpy, set_weights validation, and the soft update."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import parl


class Net(parl.Model):
    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.fc2 = nn.Linear(hidden, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def _train_bn(model: Net) -> None:
    model.train()
    model(torch.randn(16, 4))  # moves the batch-norm running statistics off their defaults
    model.eval()


def test_get_weights_returns_numpy_copies_of_parameters_and_buffers():
    model = Net()
    weights = model.get_weights()
    assert set(weights) == set(model.state_dict())
    assert {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"} <= set(weights)
    assert all(isinstance(v, np.ndarray) for v in weights.values())
    before = model.fc1.weight.detach().clone()
    weights["fc1.weight"][:] = 123.0
    assert torch.equal(model.fc1.weight.detach(), before)


def test_weights_round_trip_is_bit_exact():
    torch.manual_seed(1)
    source, target = Net(), Net()
    _train_bn(source)
    target.set_weights(source.get_weights())
    got, want = target.get_weights(), source.get_weights()
    for name in want:
        assert got[name].dtype == want[name].dtype
        assert got[name].tobytes() == want[name].tobytes(), name
    x = torch.randn(5, 4)
    target.eval()
    assert torch.equal(target(x), source(x))


def test_set_weights_accepts_read_only_arrays_without_warnings():
    source, target = Net(), Net()
    weights = source.get_weights()
    for array in weights.values():
        array.setflags(write=False)
    target.set_weights(weights)  # filterwarnings=error turns any torch warning into a failure
    assert np.array_equal(target.get_weights()["fc2.bias"], weights["fc2.bias"])


@pytest.mark.parametrize(
    ("edit", "error", "message"),
    [
        (lambda w: w.pop("fc2.bias"), KeyError, r"missing keys \['fc2.bias'\]"),
        (lambda w: w.update(extra=np.zeros(1)), KeyError, r"unexpected keys \['extra'\]"),
        (
            lambda w: w.update({"fc1.weight": np.zeros((3, 3), np.float32)}),
            ValueError,
            r"'fc1.weight' has shape \(3, 3\), the model expects \(8, 4\)",
        ),
    ],
)
def test_set_weights_rejects_bad_input_and_leaves_the_model_unchanged(edit, error, message):
    model = Net()
    before = model.get_weights()
    weights = {k: np.full_like(v, 7) for k, v in before.items()}
    edit(weights)
    with pytest.raises(error, match=message):
        model.set_weights(weights)
    after = model.get_weights()
    assert all(np.array_equal(after[k], before[k]) for k in before)


def test_sync_weights_to_with_zero_decay_is_an_exact_copy():
    source = Net()
    _train_bn(source)
    target = Net()
    source.sync_weights_to(target)
    for name, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], value), name


def test_soft_update_numerics():
    torch.manual_seed(2)
    source, target = Net(), Net()
    _train_bn(source)
    old_target = copy.deepcopy(target.state_dict())
    decay = 0.9
    source.sync_weights_to(target, decay=decay)
    for name, new in target.state_dict().items():
        src, old = source.state_dict()[name], old_target[name]
        if new.is_floating_point():
            expected = decay * old + (1 - decay) * src
            torch.testing.assert_close(new, expected, rtol=1e-6, atol=1e-7)
            assert not torch.equal(new, old) or torch.equal(src, old)
        else:  # integer buffers are copied
            assert torch.equal(new, src), name


def test_soft_update_builds_no_autograd_graph():
    source, target = Net(), Net()
    source.sync_weights_to(target, decay=0.5)
    for param in target.parameters():
        assert param.is_leaf and param.grad_fn is None and param.requires_grad


def test_sync_weights_to_checks_its_arguments():
    model = Net()
    with pytest.raises(ValueError, match="decay=1.5 must be in"):
        model.sync_weights_to(Net(), decay=1.5)
    with pytest.raises(ValueError, match="is this model itself"):
        model.sync_weights_to(model)
    with pytest.raises(ValueError, match=r"'fc1.weight' has shape \(8, 4\) here and \(3, 4\)"):
        model.sync_weights_to(Net(hidden=3))


def test_bfloat16_weights_round_trip():
    source, target = Net().to(torch.bfloat16), Net().to(torch.bfloat16)
    weights = source.get_weights()
    assert weights["fc1.weight"].dtype == np.float32
    target.set_weights(weights)
    assert torch.equal(target.fc1.weight, source.fc1.weight)

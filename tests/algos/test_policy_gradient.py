"""`parl.algorithms.PolicyGradient`: REINFORCE's update on tiny, hand-checkable batches."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import parl
from parl.algorithms import PolicyGradient, PolicyGradientStats


class Softmax(parl.Model):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 3)

    def forward(self, obs):
        return torch.softmax(self.fc(obs), dim=-1)


def test_loss_is_minus_mean_log_prob_times_return():
    torch.manual_seed(0)
    model = Softmax()
    alg = PolicyGradient(model, lr=1e-3)
    obs = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    action = torch.tensor([2, 0])
    returns = torch.tensor([1.0, -0.5])
    with torch.no_grad():
        probs = model(obs)
    expected = -(torch.log(probs[0, 2]) * 1.0 + torch.log(probs[1, 0]) * -0.5) / 2
    stats = alg.learn(obs, action, returns)
    assert isinstance(stats, PolicyGradientStats)
    assert stats.loss == pytest.approx(expected.item(), rel=1e-6)
    assert stats.entropy == pytest.approx((-(probs * probs.log()).sum(-1)).mean().item(), rel=1e-6)


def test_updates_raise_the_probability_of_rewarded_actions():
    torch.manual_seed(0)
    alg = PolicyGradient(Softmax(), lr=0.05)
    obs = torch.tensor([[1.0, -1.0]])
    before = alg.predict(obs)[0, 1].item()
    for _ in range(20):
        alg.learn(obs, torch.tensor([1]), torch.tensor([1.0]))
    assert alg.predict(obs)[0, 1].item() > before + 0.3
    samples = alg.sample(obs.repeat(200, 1))
    assert samples.shape == (200,) and (samples == 1).float().mean() > 0.5


def test_rejects_a_bad_learning_rate():
    with pytest.raises(ValueError, match="lr=0 must be positive"):
        PolicyGradient(Softmax(), lr=0)

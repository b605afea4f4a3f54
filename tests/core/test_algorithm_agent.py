"""`parl.Algorithm` and `parl.Agent`: the base contract, modes, and checkpoints that resume."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from torch import nn

import parl


class QNet(parl.Model):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(3, 16), nn.Dropout(0.1), nn.Linear(16, 2))

    def forward(self, x):
        return self.fc(x)


class Regression(parl.Algorithm):
    """A tiny algorithm with everything a checkpoint must carry."""

    _state_attrs = ("updates",)

    def __init__(self, model: parl.Model) -> None:
        super().__init__(model)
        self.target_model = QNet()
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.optimizer = torch.optim.Adam([*model.parameters(), self.log_alpha], lr=1e-2)
        self.updates = 0

    def predict(self, obs):
        with torch.no_grad():
            return self.model(obs)

    def learn(self, obs, target):
        loss = ((self.model(obs) - target) ** 2).mean() + self.log_alpha.exp().sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.updates += 1
        return loss.item()


class RegressionAgent(parl.Agent):
    _state_attrs = ("episodes",)

    def __init__(self, algorithm):
        super().__init__(algorithm)
        self.episodes = 0

    def predict(self, obs: np.ndarray) -> np.ndarray:
        return self.alg.predict(torch.as_tensor(obs)).numpy()

    def learn(self, obs, target):
        return self.alg.learn(torch.as_tensor(obs), torch.as_tensor(target))


def _make_agent(seed: int = 0) -> RegressionAgent:
    torch.manual_seed(seed)
    return RegressionAgent(Regression(QNet()))


def _train(agent: RegressionAgent, steps: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        agent.learn(
            rng.normal(size=(8, 3)).astype(np.float32), rng.normal(size=(8, 2)).astype(np.float32)
        )
        agent.episodes += 1


def test_algorithm_requires_a_parl_model():
    with pytest.raises(TypeError, match="derive your network from parl.Model"):
        parl.Algorithm(nn.Linear(2, 2))


def test_unimplemented_methods_say_which_class():
    agent = parl.Agent(parl.Algorithm(QNet()))
    for method in ("predict", "sample", "learn"):
        with pytest.raises(NotImplementedError, match=f"Algorithm does not implement {method}"):
            getattr(agent.alg, method)()
        with pytest.raises(NotImplementedError, match=f"Agent does not implement {method}"):
            getattr(agent, method)()
    with pytest.raises(TypeError, match="expects a parl.Algorithm"):
        parl.Agent(QNet())


def test_algorithm_and_agent_weights_are_the_main_models():
    agent = _make_agent()
    other = _make_agent(seed=5)
    other.set_weights(agent.get_weights())
    for name, value in agent.alg.model.state_dict().items():
        assert torch.equal(other.alg.model.state_dict()[name], value)


def test_train_and_eval_switch_every_module():
    agent = _make_agent()
    agent.eval()
    assert agent.training is False
    assert not agent.alg.model.training and not agent.alg.target_model.training
    agent.train()
    assert agent.training is True
    assert agent.alg.model.training and agent.alg.target_model.training


def test_save_restore_resumes_training_identically(tmp_path):
    path = tmp_path / "ckpt" / "agent.pt"
    original = _make_agent()
    _train(original, steps=20, seed=1)
    original.save(path)
    assert os.listdir(path.parent) == ["agent.pt"]  # no temporary file left behind

    restored = _make_agent(seed=99)
    restored.restore(path, map_location="cpu")
    assert restored.alg.updates == 20 and restored.episodes == 20
    assert torch.equal(restored.alg.log_alpha, original.alg.log_alpha)
    obs = np.random.default_rng(3).normal(size=(4, 3)).astype(np.float32)
    original.eval(), restored.eval()
    assert np.array_equal(restored.predict(obs), original.predict(obs))

    # Same optimizer state => the next updates are identical too ...
    original.train(), restored.train()
    torch.manual_seed(7)
    _train(original, steps=3, seed=2)
    torch.manual_seed(7)
    _train(restored, steps=3, seed=2)
    for name, value in original.alg.model.state_dict().items():
        assert torch.equal(restored.alg.model.state_dict()[name], value), name

    # ... which they would not be with fresh Adam moments: the check above can fail.
    fresh = _make_agent(seed=99)
    fresh.alg.model.load_state_dict(torch.load(path, weights_only=True)["algorithm"]["model"])
    torch.manual_seed(7)
    _train(fresh, steps=3, seed=2)
    assert not torch.equal(fresh.alg.model.fc[0].weight, original.alg.model.fc[0].weight)


def test_save_and_restore_a_single_model(tmp_path):
    agent = _make_agent()
    path = tmp_path / "model.pt"
    agent.save(path, model=agent.alg.model)
    other = _make_agent(seed=4)
    other.restore(path)
    assert torch.equal(other.alg.model.fc[0].weight, agent.alg.model.fc[0].weight)
    other.restore(path, model=other.alg.target_model)
    assert torch.equal(other.alg.target_model.fc[0].weight, agent.alg.model.fc[0].weight)


def test_restore_rejects_a_checkpoint_of_another_algorithm(tmp_path):
    agent = _make_agent()
    agent.save(tmp_path / "a.pt")
    other = parl.Agent(parl.Algorithm(QNet()))
    with pytest.raises(KeyError, match="does not match this algorithm"):
        other.restore(tmp_path / "a.pt")
    with pytest.raises(ValueError, match="whole-agent checkpoint"):
        agent.restore(tmp_path / "a.pt", model=agent.alg.model)


def test_state_dict_is_what_save_writes_and_load_state_dict_takes_it(tmp_path):
    original = _make_agent()
    _train(original, steps=5, seed=1)
    state = original.state_dict()
    assert state["agent"] == {"episodes": 5} and state["algorithm"]["updates"] == 5
    original.save(tmp_path / "a.pt")
    saved = torch.load(tmp_path / "a.pt", weights_only=True)
    assert saved.keys() == state.keys()
    restored = _make_agent(seed=99)
    restored.load_state_dict(saved)
    assert restored.episodes == 5 and restored.alg.updates == 5
    assert torch.equal(restored.alg.model.fc[0].weight, original.alg.model.fc[0].weight)
    with pytest.raises(ValueError, match=r"pass what Agent.state_dict\(\) returned"):
        restored.load_state_dict(original.alg.model.state_dict())

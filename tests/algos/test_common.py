"""`parl_algos._common.to_tensor`: the one way numpy observations become model tensors."""

from __future__ import annotations

import numpy as np
import torch

from parl.algorithms import DQN
from parl_algos._common import to_tensor
from parl_algos.agents import DQNAgent
from tests.algos.models import QNet


def test_to_tensor_keeps_dtype_shares_cpu_memory_and_converts_on_request():
    obs = np.arange(4, dtype=np.float32)
    t = to_tensor(obs, torch.device("cpu"))
    assert t.dtype == torch.float32 and t.device.type == "cpu"
    obs[0] = 7.0
    assert t[0].item() == 7.0  # no copy on the CPU when nothing changes
    assert to_tensor([1, 2], "cpu").dtype == torch.int64
    assert to_tensor(obs.astype(np.float64), "cpu", torch.float32).dtype == torch.float32
    assert to_tensor(3.0, "cpu").shape == ()
    assert to_tensor(t, "cpu") is t


def test_agents_put_observations_on_the_models_device():
    agent = DQNAgent(DQN(QNet(4, 2).to("meta")), 2, eps_start=0.0, eps_end=0.0)
    assert agent.device.type == "meta"
    seen = []
    agent.alg.predict = lambda obs: seen.append(obs.device.type) or torch.zeros(1, 2)
    agent.sample(np.zeros(4, dtype=np.float32))
    assert seen == ["meta"]

"""`parl-train --export onnx|torchscript RUN_DIR`: a run's greedy policy as one file to serve.

`export(config, spec, logdir, fmt)` loads the agent of the run's newest checkpoint and writes
`policy.onnx` (ONNX, for onnxruntime and every runtime that reads it) or `policy.pt`
(TorchScript, for `torch.jit.load`) beside it in the run directory. The file maps a batch of
observations to the batch of actions the agent's greedy `predict` takes, with the run's
preprocessing inside:

- in: `obs`, `(N, *shape)` of the run's environment's observations: float32 (MuJoCo's
  float64 cast), or for Atari the 4 stacked 84x84 uint8 frames its wrappers give (the network
  scales them);
- out: `action`, `(N,)` int64 for discrete actions (the most probable one, or the largest
  Q-value's), `(N, dim)` float32 for Box actions, clipped and rescaled from the policy's
  `[-1, 1]` to the environment's own bounds, as the run's wrappers do.

No config of the zoo normalises observations, so there is no statistic to carry. The
recurrent (R2D2) and multi-agent policies are not exported: their state and their agents'
stacked observations need an interface of their own.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from parl_algos.train._config import Config, ConfigError
from parl_algos.train._envs import make_env_fn
from parl_algos.train._run import latest_checkpoint
from parl_algos.train._spec import AlgorithmSpec

__all__ = ["EXPORT_FORMATS", "GreedyPolicy", "export"]

EXPORT_FORMATS = {"onnx": "policy.onnx", "torchscript": "policy.pt"}
"""Each format of `--export` and the file it writes in the run directory."""

_FAMILIES = ("on_policy", "off_policy", "offline")
_INSTALL = "pip install 'parl-algos[export]'"


class GreedyPolicy(nn.Module):
    """A trained algorithm's greedy action for a batch of observations, as one torch module.

    Args:
        algorithm: the agent's algorithm (its `predict`: the action, or DQN's Q-values).
        action_space: the run's environment's action space: `Discrete`, or a `Box` whose
            `[-1, 1]` actions are rescaled to `low`, `high`.
        q_values: `algorithm.predict` gives Q-values (the DQN family): the action is their
            argmax.
    """

    def __init__(self, algorithm: Any, action_space: gym.Space, *, q_values: bool) -> None:
        super().__init__()
        self.algorithm = algorithm
        self.models = nn.ModuleDict(algorithm.modules())  # their weights go into the file
        self.requires_grad_(False)  # a policy to serve: its actions carry no graph
        self.q_values = q_values
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        if not self.discrete:
            self.register_buffer("low", torch.as_tensor(action_space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(action_space.high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """`(N, *obs_shape)` observations -> `(N,)` int64 or `(N, dim)` float32 actions."""
        out = self.algorithm.predict(obs)
        if self.q_values:
            out = out.argmax(dim=-1)
        if self.discrete:
            return out.to(torch.int64)
        action = out.to(torch.float32).clamp(-1.0, 1.0)
        return self.low + (action + 1.0) * 0.5 * (self.high - self.low)


def _check_format(fmt: str) -> None:
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"--export {fmt!r}: the formats are {', '.join(EXPORT_FORMATS)}")
    if fmt == "onnx" and importlib.util.find_spec("onnx") is None:
        raise ConfigError(f"--export onnx needs onnx (onnxruntime to serve it): {_INSTALL}")


def _policy_of(config: Config, spec: AlgorithmSpec, checkpoint: str) -> tuple[GreedyPolicy, Any]:
    """The `GreedyPolicy` of the agent saved in `checkpoint`, and the run's environment."""
    env = make_env_fn(config)()
    learner = spec.build(config, env.observation_space, env.action_space)
    agent = learner.agent
    path = os.path.join(checkpoint, "agent.ckpt")
    # On the CPU, wherever it trained: the file holds no device of its own.
    agent.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    agent.eval()  # noisy layers act on their means, as evaluations do
    raw_space = env.unwrapped.action_space
    q_values = spec.family == "off_policy" and isinstance(env.action_space, gym.spaces.Discrete)
    return GreedyPolicy(agent.alg, raw_space, q_values=q_values).eval(), env


def export(config: Config, spec: AlgorithmSpec, logdir: str, fmt: str) -> str:
    """Write the greedy policy of `logdir`'s newest checkpoint in `fmt`; return the file's path.

    Raises:
        ConfigError: an unknown format, a missing extra, a run without a checkpoint, or an
            algorithm whose policy is not exported.
    """
    _check_format(fmt)
    if spec.family not in _FAMILIES:
        raise ConfigError(
            f"--export: {spec.name}'s policy is not exported (a recurrent or multi-agent "
            "policy); the algorithms of parl-train --list's other families are"
        )
    checkpoint = latest_checkpoint(logdir)
    if checkpoint is None:
        raise ConfigError(f"--export: {logdir} has no checkpoint; train it first (parl-train)")
    policy, env = _policy_of(config, spec, checkpoint)
    space = env.observation_space
    env.close()
    example = torch.as_tensor(np.stack([space.sample()] * 2))
    path = os.path.join(logdir, EXPORT_FORMATS[fmt])
    with torch.no_grad(), warnings.catch_warnings():
        # torch marks TorchScript and its ONNX exporter deprecated for torch.export; the
        # torch.export-based exporter needs onnxscript, and takes seconds where these take
        # a fraction of one.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        if fmt == "torchscript":
            torch.jit.trace(policy, example).save(path)
        else:
            torch.onnx.export(
                policy,
                (example,),
                path,
                dynamo=False,
                input_names=["obs"],
                output_names=["action"],
                dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}},
            )
    return path

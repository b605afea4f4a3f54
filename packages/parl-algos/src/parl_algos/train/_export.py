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

No config of the zoo normalises observations, so there is no statistic to carry.

A multi-agent run (MADDPG, MAPPO, QMIX) writes one file per agent, `policy-<agent>.onnx`
(`.pt`), named by the environment's agent names (`policy-agent_0.onnx`): their actors act on
their own agent's observation alone (decentralised execution, as these algorithms train
them), so each agent is deployed where it runs, with nothing of the others:

- in: `obs`, `(N, obs_dim)` float32, the agent's own observation as PettingZoo gives it;
- out: `action`, `(N,)` int64, the agent's greedy action;
- QMIX's agents are recurrent: in also `hidden`, `(N, hidden_size)` float32 (zeros at an
  episode's start), out also `next_hidden`, for the agent's next step.

The recurrent R2D2 policy carries its LSTM's state from step to step the same way: in `obs`
and `state`, `(N, state_size)` float32 (zeros at an episode's start: the LSTM's `h` and `c`
side by side), out `action` and `next_state`.
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
from parl_algos.train._marl_actors import make_mpe_env
from parl_algos.train._recurrent import make_wrapped_env
from parl_algos.train._run import latest_checkpoint
from parl_algos.train._spec import AlgorithmSpec

__all__ = ["AgentPolicy", "EXPORT_FORMATS", "GreedyPolicy", "RecurrentPolicy", "export"]

EXPORT_FORMATS = {"onnx": "policy.onnx", "torchscript": "policy.pt"}
"""Each format of `--export` and the file it writes in the run directory."""

_FAMILIES = ("on_policy", "off_policy", "offline", "multi_agent", "recurrent")
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


class AgentPolicy(nn.Module):
    """One agent's greedy action of a multi-agent algorithm, on its own observation.

    Args:
        algorithm: `MADDPG`, `MAPPO` or `QMIX`.
        index: the agent's place among the environment's agents.
        n_agents: the number of agents.
        max_obs_dim: the stacked observations' width (MAPPO's and QMIX's shared networks take
            every agent's observation zero-padded to it, then the agent's one-hot id).
    """

    def __init__(self, algorithm: Any, index: int, n_agents: int, max_obs_dim: int) -> None:
        super().__init__()
        from parl_algos.maddpg import MADDPG
        from parl_algos.mappo import MAPPO

        self.model = algorithm.model  # its weights go into the file
        self.requires_grad_(False)
        self.kind = "maddpg" if isinstance(algorithm, MADDPG) else "mappo"
        if not isinstance(algorithm, MADDPG | MAPPO):
            self.kind = "qmix"
            self.add_id = bool(algorithm.add_agent_id)
        self.index, self.max_obs_dim = index, max_obs_dim
        self.register_buffer("one_hot", torch.eye(n_agents)[index])

    @property
    def recurrent(self) -> bool:
        """QMIX's agents: a hidden state in and out."""
        return self.kind == "qmix"

    def _inputs(self, obs: torch.Tensor) -> torch.Tensor:
        """`[obs zero-padded to max_obs_dim, onehot(agent)]` rows."""
        pad = torch.zeros(obs.shape[0], self.max_obs_dim - obs.shape[1], dtype=obs.dtype)
        return torch.cat([obs, pad, self.one_hot.expand(obs.shape[0], -1)], dim=-1)

    def forward(
        self, obs: torch.Tensor, hidden: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """`(N, obs_dim)` -> `(N,)` int64 actions (QMIX: and `(N, hidden)` -> next hidden)."""
        if self.kind == "maddpg":
            return self.model.policy(self.index, obs).argmax(-1)
        if self.kind == "mappo":
            return self.model.policy(self._inputs(obs)).argmax(-1)
        inputs = self._inputs(obs) if self.add_id else obs
        assert hidden is not None
        q, next_hidden = self.model(inputs, hidden)
        return q.argmax(-1), next_hidden


class RecurrentPolicy(nn.Module):
    """R2D2's greedy action and next recurrent state, a step at a time.

    Args:
        algorithm: the agent's `R2D2`.
    """

    def __init__(self, algorithm: Any) -> None:
        super().__init__()
        self.model = algorithm.model  # its weights go into the file
        self.requires_grad_(False)

    def forward(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`(N, *obs_shape)` and `(N, state_size)` -> `(N,)` int64 actions, next states."""
        q, next_state = self.model(obs.unsqueeze(0), state)
        return q[0].argmax(-1), next_state


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


def export(config: Config, spec: AlgorithmSpec, logdir: str, fmt: str) -> list[str]:
    """Write the greedy policy of `logdir`'s newest checkpoint in `fmt`; the files' paths.

    One file, or one per agent of a multi-agent run (see the module docstring).

    Raises:
        ConfigError: an unknown format, a missing extra, a run without a checkpoint, or an
            algorithm whose policy is not exported.
    """
    _check_format(fmt)
    if spec.family not in _FAMILIES:
        raise ConfigError(f"--export: {spec.name}'s policy is not exported")
    checkpoint = latest_checkpoint(logdir)
    if checkpoint is None:
        raise ConfigError(f"--export: {logdir} has no checkpoint; train it first (parl-train)")
    if spec.family == "multi_agent":
        return _export_agents(config, spec, checkpoint, logdir, fmt)
    if spec.family == "recurrent":
        return [_export_recurrent(config, spec, checkpoint, logdir, fmt)]
    policy, env = _policy_of(config, spec, checkpoint)
    space = env.observation_space
    env.close()
    example = torch.as_tensor(np.stack([space.sample()] * 2))
    path = os.path.join(logdir, EXPORT_FORMATS[fmt])
    _write(policy, (example,), ["obs"], ["action"], path, fmt)
    return [path]


def _export_recurrent(
    config: Config, spec: AlgorithmSpec, checkpoint: str, logdir: str, fmt: str
) -> str:
    """R2D2's `policy.onnx` (`.pt`): observations and states in, actions and states out."""
    env = make_wrapped_env(config.env.id, config.env.wrapper)
    agent = spec.build(config, env.observation_space, env.action_space).agent
    agent.load_state_dict(
        torch.load(os.path.join(checkpoint, "agent.ckpt"), map_location="cpu", weights_only=True)
    )
    agent.eval()
    example = (
        torch.as_tensor(np.stack([env.observation_space.sample()] * 2)),
        agent.alg.model.initial_state(2),
    )
    env.close()
    path = os.path.join(logdir, EXPORT_FORMATS[fmt])
    policy = RecurrentPolicy(agent.alg).eval()
    _write(policy, example, ["obs", "state"], ["action", "next_state"], path, fmt)
    return path


def _export_agents(
    config: Config, spec: AlgorithmSpec, checkpoint: str, logdir: str, fmt: str
) -> list[str]:
    """A file per agent of a multi-agent run: `policy-<agent>.onnx` (`.pt`)."""
    env = make_mpe_env(config.env)
    arrays = env.arrays
    env.close()
    agent = spec.build(config, None, None).agent
    agent.load_state_dict(
        torch.load(os.path.join(checkpoint, "agent.ckpt"), map_location="cpu", weights_only=True)
    )
    agent.eval()
    paths = []
    stem, ext = os.path.splitext(EXPORT_FORMATS[fmt])
    for i, (name, dim) in enumerate(zip(arrays.agents, arrays.obs_dims, strict=True)):
        policy = AgentPolicy(agent.alg, i, arrays.n_agents, arrays.max_obs_dim).eval()
        example: tuple[torch.Tensor, ...] = (torch.zeros(2, dim),)
        inputs, outputs = ["obs"], ["action"]
        if policy.recurrent:
            example += (agent.alg.model.init_hidden(2),)
            inputs, outputs = ["obs", "hidden"], ["action", "next_hidden"]
        path = os.path.join(logdir, f"{stem}-{name}{ext}")
        _write(policy, example, inputs, outputs, path, fmt)
        paths.append(path)
    return paths


def _write(
    policy: nn.Module,
    example: tuple[torch.Tensor, ...],
    inputs: list[str],
    outputs: list[str],
    path: str,
    fmt: str,
) -> None:
    """Trace `policy` on `example` into `path`, a batch dimension free in every tensor."""
    with torch.no_grad(), warnings.catch_warnings():
        # torch marks TorchScript and its ONNX exporter deprecated for torch.export; the
        # torch.export-based exporter needs onnxscript, and takes seconds where these take
        # a fraction of one.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        # An LSTM's warning for graphs whose initial state is not an input: R2D2's is one.
        warnings.filterwarnings("ignore", "Exporting a model to ONNX with a batch_size other")
        if fmt == "torchscript":
            torch.jit.trace(policy, example).save(path)
        else:
            torch.onnx.export(
                policy,
                example,
                path,
                dynamo=False,
                input_names=inputs,
                output_names=outputs,
                dynamic_axes={name: {0: "batch"} for name in (*inputs, *outputs)},
            )

"""`parl-train --export onnx|torchscript RUN_DIR`: the run's greedy policy, served without PARL.

For one shipped config of each exported family (discrete and continuous PPO, the DQN family
plain and with Rainbow's distributional, dueling and noisy head, SAC, TD3 and DDPG, BC offline,
PPO and DQN on Atari frames), a run of a few hundred steps (Atari's: a random-weight network barely
trained) is exported in both formats by the command itself. The ONNX file under onnxruntime
and the TorchScript file under `torch.jit.load` give, on 1,000 observations of the run's
environment, the actions of the agent restored from the run's last checkpoint through its own
`Agent.restore` and `predict` (as evaluations act), Box actions carried to the environment's
own bounds by the run's wrappers (`ClipAction`, `RescaleAction`). A multi-agent run (MADDPG,
MAPPO, QMIX) is exported as a file per agent, each matching that agent's actions on its own
observations (QMIX's with its hidden state carried through the episodes). The recurrent policy
(R2D2) is exported with its state in and out and matches with the state carried through the
episodes. A missing extra is refused with one line; the serving snippet of the docs runs where
torch cannot be imported.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnxruntime  # parl-algos[export], which requirements-dev.txt installs
import pytest
import torch

from parl_algos.train import apply_override, dump_config, get_spec, latest_checkpoint, load_config
from parl_algos.train import main as parl_train_main
from parl_algos.train import run as train_run
from parl_algos.train._envs import make_env_fn

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"train.log_every": "100", "train.eval_every": "0", "train.checkpoint_every": "1000"}
SMALL["train.progress"] = "false"
OFF_POLICY = {"agent.learning_starts": "100", "agent.train_freq": "50", "agent.batch_size": "32"}
CONFIGS = {
    "ppo/cartpole": {"train.total_steps": "300", "agent.n_steps": "64"},
    "ppo/hopper": {"train.total_steps": "300", "agent.n_steps": "64"},
    "dqn/cartpole": {"train.total_steps": "300", **OFF_POLICY},
    "rainbow/cartpole": {"train.total_steps": "300", **OFF_POLICY},
    "sac/pendulum": {"train.total_steps": "200", **OFF_POLICY},
    "td3/pendulum": {"train.total_steps": "200", **OFF_POLICY},
    "ddpg/pendulum": {"train.total_steps": "200", **OFF_POLICY},
    "bc/pendulum": {"train.total_steps": "200", "env.sac_steps": "120", "env.dataset_episodes": "2"}
    | {"agent.batch_size": "32", "agent.hidden_size": "32"},
    "ppo/pong": {"train.total_steps": "128", "env.num_envs": "2", "agent.n_steps": "32"},
    "dqn/roadrunner": {"train.total_steps": "200", **OFF_POLICY, "agent.buffer_size": "500"},
}
OBSERVATIONS = 1000
TORCHSCRIPT_LOAD = "ignore:`torch.jit.load` is deprecated:DeprecationWarning"  # torch.export's


def _trained(name: str, logdir: Path) -> str:
    config = load_config(name)
    for key, text in {**SMALL, **CONFIGS[name]}.items():
        apply_override(config, key, text)
    return _trained_config(config, logdir)


def _trained_config(config: Any, logdir: Path) -> str:
    train_run(config, get_spec(config.algorithm), str(logdir))
    return str(logdir)


def _export(fmt: str, logdir: str, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()  # the training run's log lines
    assert parl_train_main(["--export", fmt, logdir]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("wrote "), out
    path = out[0].removeprefix("wrote ")
    assert os.path.getsize(path) > 0
    return path


def _observations(env: gym.Env, n: int) -> np.ndarray:
    """`n` observations of `env` under random actions (seeded), across episodes."""
    return _walk(env, n)[0]


def _walk(env: gym.Env, n: int) -> tuple[np.ndarray, np.ndarray]:
    """`_observations(env, n)`, and where an episode starts among them."""
    env.action_space.seed(1)
    obs, _ = env.reset(seed=1)
    seen, starts, start = [], [], True
    for _ in range(n):
        seen.append(obs)
        starts.append(start)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        start = terminated or truncated
        if start:
            obs, _ = env.reset()
    return np.stack(seen), np.array(starts)


def _torch_actions(logdir: str, env: gym.Env, obs: np.ndarray) -> np.ndarray:
    """The greedy actions of the agent restored from the run's last checkpoint, per observation,
    carried to the environment's own actions by its wrappers."""
    config = load_config(os.path.join(logdir, "config.toml"))
    spec = get_spec(config.algorithm)
    agent = spec.build(config, env.observation_space, env.action_space).agent
    agent.restore(os.path.join(latest_checkpoint(logdir), "agent.ckpt"))
    agent.eval()
    actions = [agent.predict(o) for o in obs]
    if isinstance(env.action_space, gym.spaces.Discrete):
        return np.asarray(actions, dtype=np.int64)
    wrappers = []
    inner = env
    while isinstance(inner, gym.Wrapper):
        if isinstance(inner, gym.ActionWrapper):
            wrappers.append(inner)
        inner = inner.env
    for i, a in enumerate(actions):
        for wrapper in wrappers:  # outermost first, as env.step applies them
            a = wrapper.action(a)
        actions[i] = a
    return np.asarray(actions, dtype=np.float32)


def _same(exported: np.ndarray, expected: np.ndarray) -> None:
    assert exported.shape == expected.shape
    if expected.dtype == np.int64:
        assert exported.dtype == np.int64 and np.array_equal(exported, expected)
    else:
        np.testing.assert_allclose(exported, expected, rtol=1e-5, atol=1e-5)


# PPO's Atari network on Pong is the slowest (frames and a thousand CNN steps of predict): in
# the slow suite; DQN's on RoadRunner carries the frame stacks in the default one. TD3's and
# DDPG's deterministic Box actors are SAC's case; MAPPO's agents, see MULTI_AGENT.
SLOW = {"ppo/pong", "td3/pendulum", "ddpg/pendulum", "mappo/simple_speaker_listener"}
# MADDPG's agents, stateless as MAPPO's: QMIX's file a agent (its hidden state too) carries the
# per-agent export in the default suite.
SLOW.add("maddpg/simple_speaker_listener")


@pytest.mark.filterwarnings(TORCHSCRIPT_LOAD)
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW else []) for n in CONFIGS]
)
def test_exported_policies_act_as_the_torch_policy(name, tmp_path, capsys):
    logdir = _trained(name, tmp_path / "run")
    onnx_path = _export("onnx", logdir, capsys)
    script_path = _export("torchscript", logdir, capsys)
    assert (onnx_path, script_path) == (f"{logdir}/policy.onnx", f"{logdir}/policy.pt")

    env = make_env_fn(load_config(os.path.join(logdir, "config.toml")))()
    obs = _observations(env, OBSERVATIONS)
    expected = _torch_actions(logdir, env, obs)
    env.close()
    if isinstance(env.action_space, gym.spaces.Box):  # the bounds are the environment's own
        assert np.all(expected >= env.unwrapped.action_space.low - 1e-6)
        assert np.all(expected <= env.unwrapped.action_space.high + 1e-6)
    else:
        assert len(np.unique(expected)) > 1 or name.endswith(("pong", "roadrunner"))

    session = onnxruntime.InferenceSession(onnx_path)
    (given,) = session.get_inputs()
    assert given.name == "obs" and given.shape[1:] == list(obs.shape[1:])
    _same(session.run(["action"], {"obs": obs})[0], expected)

    scripted = torch.jit.load(script_path)
    _same(scripted(torch.as_tensor(obs)).numpy(), expected)


MULTI_AGENT = {  # agents of different observation and action sizes; a recurrent QMIX
    "maddpg/simple_speaker_listener": {"agent.learning_starts": "50", "agent.batch_size": "32"},
    "mappo/simple_speaker_listener": {"agent.num_envs": "2"},
    "qmix/simple_spread": {"agent.batch_size": "2"},
}
"""MAPPO's agents are MADDPG's case (stateless) with QMIX's inputs (padded, with the agent's
id): in the slow suite, as are TD3's and DDPG's deterministic Box actors (SAC's case)."""


def _stacked_observations(env, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`n` stacked observations of a `StackedAgentsEnv` under random actions (seeded), the
    global states that go with them, and where an episode starts."""
    env.action_space.seed(1)
    obs, info = env.reset(seed=1)
    seen, states, starts, start = [], [], [], True
    for _ in range(n):
        seen.append(obs)
        states.append(info["state"])
        starts.append(start)
        obs, _, terminated, truncated, info = env.step(env.action_space.sample())
        start = terminated or truncated
        if start:
            obs, info = env.reset()
    return np.stack(seen), np.stack(states), np.array(starts)


@pytest.mark.filterwarnings(TORCHSCRIPT_LOAD)
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW else []) for n in MULTI_AGENT]
)
def test_each_agent_of_a_multi_agent_run_is_exported_and_acts_as_the_torch_policy(
    name, tmp_path, capsys
):
    """A file per agent, on its own observation: the agents' actions of `StackedAgent.predict`
    (as evaluations act) on 1,000 observations, QMIX's hidden state carried through episodes."""
    from parl_algos.train._marl_actors import make_mpe_env

    config = load_config(name)
    overrides = {**SMALL, "train.total_steps": "200", "train.checkpoint_every": "200"}
    for key, text in {**overrides, **MULTI_AGENT[name]}.items():
        apply_override(config, key, text)
    logdir = str(tmp_path / "run")
    train_run(config, get_spec(config.algorithm), logdir)
    capsys.readouterr()
    paths = {}
    for fmt in ("onnx", "torchscript"):
        assert parl_train_main(["--export", fmt, logdir]) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        paths[fmt] = [line.removeprefix("wrote ") for line in lines]
    env = make_mpe_env(config.env)
    arrays = env.arrays
    assert paths["onnx"] == [f"{logdir}/policy-{a}.onnx" for a in arrays.agents]
    assert paths["torchscript"] == [f"{logdir}/policy-{a}.pt" for a in arrays.agents]
    obs, states, starts = _stacked_observations(env, OBSERVATIONS)
    env.close()

    agent = get_spec(config.algorithm).build(config, None, None).agent
    agent.restore(os.path.join(latest_checkpoint(logdir), "agent.ckpt"))
    agent.eval()
    expected = []
    for o, state, start in zip(obs, states, starts, strict=True):
        if start:
            agent.hidden = None
        agent.state = state
        expected.append(agent.predict(o))
    expected = np.stack(expected)  # (observations, agents)

    recurrent = config.algorithm == "QMIX"
    for i, dim in enumerate(arrays.obs_dims):
        own = np.ascontiguousarray(obs[:, i, :dim])
        session = onnxruntime.InferenceSession(paths["onnx"][i])
        scripted = torch.jit.load(paths["torchscript"][i])
        given = session.get_inputs()
        assert given[0].name == "obs" and given[0].shape[1:] == [dim]
        if not recurrent:
            _same(session.run(["action"], {"obs": own})[0], expected[:, i])
            _same(scripted(torch.as_tensor(own)).numpy(), expected[:, i])
            continue
        size = config.agent.hidden_size
        _same(_stepped(session, None, own, starts, size, "hidden"), expected[:, i])
        _same(_stepped(None, scripted, own, starts, size, "hidden"), expected[:, i])


def _stepped(
    session: Any, scripted: Any, obs: np.ndarray, starts: np.ndarray, size: int, name: str
) -> np.ndarray:
    """The actions of a recurrent exported policy (an onnxruntime `session`, else `scripted`)
    on `obs`, its state (input `name`, `size` wide) zero at each of `starts` and carried
    through each episode: the episodes side by side, a batch a time step."""
    episode = np.cumsum(starts) - 1
    step = np.arange(len(obs)) - np.flatnonzero(starts)[episode]
    state = np.zeros((episode[-1] + 1, size), np.float32)
    acted = np.zeros(len(obs), np.int64)
    for t in range(step.max() + 1):
        rows = np.flatnonzero(step == t)
        now = episode[rows]
        if session is not None:
            action, state[now] = session.run(None, {"obs": obs[rows], name: state[now]})
        else:
            out = scripted(torch.as_tensor(obs[rows]), torch.as_tensor(state[now]))
            action, state[now] = out[0].numpy(), out[1].numpy()
        acted[rows] = action
    return acted


@pytest.mark.filterwarnings(TORCHSCRIPT_LOAD)
def test_the_recurrent_policy_is_exported_with_its_state_and_acts_as_the_torch_policy(
    tmp_path, capsys
):
    """R2D2 on CartPole without its velocities: `obs` and `state` in, `action` and
    `next_state` out; on 1,000 observations, the actions of `R2D2Agent.predict` with the state
    it carries through each episode (zeros at its start), as its evaluations act."""
    from parl_algos.train._recurrent import make_wrapped_env

    config = load_config("r2d2/cartpole-masked")
    small = {"train.total_steps": "256", "train.checkpoint_every": "256", "train.actors": "1"}
    small |= {"agent.learning_starts": "64", "agent.buffer_size": "500"}
    for key, text in {**SMALL, **small}.items():
        apply_override(config, key, text)
    logdir = _trained_config(config, tmp_path / "run")
    onnx_path = _export("onnx", logdir, capsys)
    script_path = _export("torchscript", logdir, capsys)
    env = make_wrapped_env(config.env.id, config.env.wrapper)
    obs, starts = _walk(env, OBSERVATIONS)
    env.close()

    agent = get_spec("R2D2").build(config, env.observation_space, env.action_space).agent
    agent.restore(os.path.join(latest_checkpoint(logdir), "agent.ckpt"))
    agent.eval()
    expected = np.zeros(len(obs), np.int64)
    for t, o in enumerate(obs):
        if starts[t]:
            state = agent.initial_state(1)
        action, state = agent.predict(o[None], state)
        expected[t] = action[0]

    session = onnxruntime.InferenceSession(onnx_path)
    scripted = torch.jit.load(script_path)
    assert [x.name for x in session.get_inputs()] == ["obs", "state"]
    size = agent.alg.model.state_size
    _same(_stepped(session, None, obs, starts, size, "state"), expected)
    _same(_stepped(None, scripted, obs, starts, size, "state"), expected)
    # A barely trained network may act alike whatever it remembers: the states themselves
    # too, from states of every kind (its actions differ across them).
    states = np.random.default_rng(1).normal(0.0, 2.0, (len(obs), size)).astype(np.float32)
    actions, next_states = agent.predict(obs, states)
    assert len(np.unique(actions)) > 1
    given = session.run(["action", "next_state"], {"obs": obs, "state": states})
    _same(given[0], actions.astype(np.int64))
    np.testing.assert_allclose(given[1], next_states, rtol=1e-5, atol=1e-5)
    script_actions, script_states = scripted(torch.as_tensor(obs), torch.as_tensor(states))
    _same(script_actions.numpy(), actions.astype(np.int64))
    np.testing.assert_allclose(script_states.numpy(), next_states, rtol=1e-5, atol=1e-5)


def _config_only(name: str, logdir: Path) -> str:
    logdir.mkdir()
    (logdir / "config.toml").write_text(dump_config(load_config(name)), encoding="utf-8")
    return str(logdir)


def test_bad_export_lines_say_what_to_do(tmp_path, capsys):
    logdir = _config_only("ppo/cartpole", tmp_path / "run")
    for argv, says in [
        (["--export", "tflite", logdir], "the formats are onnx, torchscript"),
        (["--export", "onnx", logdir], "has no checkpoint; train it first"),
        (["--export", "onnx", str(tmp_path)], "is not a run directory of parl-train"),
        (["--export", "onnx", logdir, "--agent.lr", "1"], "takes a run directory and nothing"),
    ]:
        capsys.readouterr()
        assert parl_train_main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], (argv, err)


def test_a_missing_extra_is_one_line_with_its_install_command(tmp_path):
    logdir = _config_only("ppo/cartpole", tmp_path / "run")  # refused before its checkpoint
    without_onnx = (
        "import sys\n"
        "sys.modules['onnx'] = None  # not installed, to import and to find_spec alike\n"
        "from parl_algos.train import main\n"
        "sys.exit(main())\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", without_onnx, "--export", "onnx", logdir],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].endswith("pip install 'parl-algos[export]'"), lines


def test_the_docs_serve_an_exported_policy_with_onnxruntime_alone(tmp_path, capsys):
    """The docs' serving snippet, where torch (and PARL with it) cannot be imported."""
    logdir = _trained("ppo/cartpole", tmp_path / "run")
    path = _export("onnx", logdir, capsys)
    page = (ROOT / "docs" / "parl-train.md").read_text(encoding="utf-8")
    (snippet,) = re.findall(r"<!-- serving -->\n```python\n(.*?)```", page, re.S)
    assert "import onnxruntime" in snippet and "parl" not in snippet.replace("parl-train", "")
    shown = re.search(r'"(train_log/[^"]+/policy\.onnx)"', snippet)
    assert shown is not None
    code = "import sys\nsys.modules['torch'] = None\n" + snippet.replace(shown.group(1), path)
    code += "\nassert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "episode return" in result.stdout

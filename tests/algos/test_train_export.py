"""`parl-train --export onnx|torchscript RUN_DIR`: the run's greedy policy, served without PARL.

For one shipped config of each exported family (discrete and continuous PPO, the DQN family
plain and with Rainbow's distributional, dueling and noisy head, SAC, TD3 and DDPG, BC offline,
PPO and DQN on Atari frames), a run of a few hundred steps (Atari's: a random-weight network barely
trained) is exported in both formats by the command itself. The ONNX file under onnxruntime
and the TorchScript file under `torch.jit.load` give, on 1,000 observations of the run's
environment, the actions of the agent restored from the run's last checkpoint through its own
`Agent.restore` and `predict` (as evaluations act), Box actions carried to the environment's
own bounds by the run's wrappers (`ClipAction`, `RescaleAction`). The multi-agent and recurrent
policies are refused with one line, and so is a missing extra; the serving snippet of the docs
runs where torch cannot be imported.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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
    env.action_space.seed(1)
    obs, _ = env.reset(seed=1)
    seen = []
    for _ in range(n):
        seen.append(obs)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    return np.stack(seen)


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
# the slow suite; DQN's on RoadRunner carries the frame stacks in the default one.
SLOW = {"ppo/pong"}


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


def _config_only(name: str, logdir: Path) -> str:
    logdir.mkdir()
    (logdir / "config.toml").write_text(dump_config(load_config(name)), encoding="utf-8")
    return str(logdir)


@pytest.mark.parametrize("name", ["mappo/simple_spread", "r2d2/cartpole-masked"])
def test_multi_agent_and_recurrent_policies_are_refused_in_one_line(name, tmp_path, capsys):
    logdir = _config_only(name, tmp_path / "run")
    capsys.readouterr()
    assert parl_train_main(["--export", "onnx", logdir]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "policy is not exported" in err[0], err


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

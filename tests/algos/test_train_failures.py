"""`parl-train`'s ends that are not a finished run: one line on the terminal, the rest in log.log.

Each test runs the real command in a subprocess and reads its stderr: one line that names what
went wrong and what to do, no traceback (that goes to the run directory's `log.log`, and to the
terminal with `--debug`), and a non-zero exit. The optional extras are installed where the
tests run; a machine with only the three base distributions is played by a wrapper that puts
`None` in `sys.modules` for each optional module before the command starts, which is how
Python's import system and `importlib.util.find_spec` see a module that is not installed, and
`--list` runs once in a virtual environment of its own that holds none of the extras.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import parl
import parl_algos
import parl_remote
from parl_algos.train import shipped_configs
from tests.conftest import python_without

ROOT = Path(__file__).resolve().parents[2]
PARL_TRAIN = str(Path(sys.executable).with_name("parl-train"))
OPTIONAL = ("ale_py", "Box2D", "mujoco", "mpe2", "pettingzoo")
"""What the extras of parl-algos install beyond the base distributions."""
WITHOUT_EXTRAS = (
    "import sys\n"
    f"for name in {OPTIONAL!r}:\n"
    "    sys.modules[name] = None  # not installed, to import and to find_spec alike\n"
    "from parl_algos.train import main\n"
    "sys.exit(main())\n"
)
FAILING_ENV = "tests.algos.failing_env:FailsAfter-v0"
"""CartPole that raises at the 300th step of each copy (`failing_env`)."""
SMALL = ["--env.num_envs", "2", "--train.eval_every", "0", "--no-progress"]


def _run(
    *argv: str, extras: bool = True, timeout: float = 180, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    command = [PARL_TRAIN] if extras else [sys.executable, "-c", WITHOUT_EXTRAS]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    result = subprocess.run(
        [*command, *argv], capture_output=True, timeout=timeout, env=env, cwd=ROOT
    )  # bytes, decoded below: text mode would turn the progress bar's carriage returns to \n
    result.stdout, result.stderr = result.stdout.decode(), result.stderr.decode()
    return result


def _on_a_terminal(text: str) -> list[str]:
    """The lines a terminal shows of `text`: each from its last carriage return (a progress
    bar redrawn, then cleared), blank ones left out."""
    shown = (line.rpartition("\r")[2].strip() for line in text.split("\n"))
    return [line for line in shown if line]


def _one_line(result: subprocess.CompletedProcess) -> str:
    """The stderr of a failed run: exactly one line, `parl-train: error: ...`, no traceback."""
    lines = _on_a_terminal(result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("parl-train: error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    return lines[0]


def test_list_and_help_need_no_extra_and_the_list_names_each_configs_extra():
    listed = _run("--list", extras=False)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == shipped_configs()
    extras = {
        line.split()[0]: line.partition("needs ")[2].partition(" ")[0] if "needs " in line else ""
        for line in lines
    }
    assert extras["dqn/roadrunner"] == "parl-algos[examples]"  # ale-py
    assert extras["mappo/simple_spread"] == "parl-algos[examples]"  # mpe2, pettingzoo
    assert extras["dqn/lunarlander"] == "parl-algos[box2d]"
    assert extras["ppo/hopper"] == "parl-algos[mujoco]"
    assert extras["ppo/cartpole"] == extras["sac/pendulum"] == extras["bc/pendulum"] == ""
    helped = _run("--help", extras=False)
    assert helped.returncode == 0 and "--resume RUN_DIR" in helped.stdout, helped.stderr


def test_list_runs_in_an_environment_without_the_extras(tmp_path):
    python = python_without(tmp_path / "venv", [parl, parl_remote, parl_algos], OPTIONAL)
    env = {"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "1", "HOME": str(tmp_path)}
    absent = subprocess.run(
        [python, "-c", f"import importlib.util as u; print([u.find_spec(m) for m in {OPTIONAL}])"],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert absent.stdout.strip() == str([None] * len(OPTIONAL)), absent.stderr
    listed = subprocess.run(
        [python, "-c", "import sys; from parl_algos.train import main; sys.exit(main())", "--list"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.strip().splitlines()
    assert [line.split()[0] for line in lines] == shipped_configs()
    needs = {line.split()[0]: line.partition("needs ")[2].split()[:1] for line in lines}
    assert needs["ppo/pong"] == needs["qmix/simple_spread"] == ["parl-algos[examples]"]
    assert needs["ppo/walker2d"] == ["parl-algos[mujoco]"] and needs["ppo/cartpole"] == []


@pytest.mark.parametrize(
    ("config", "missing", "extra"),
    [
        ("dqn/lunarlander", "Box2D", "box2d"),
        ("ppo/hopper", "mujoco", "mujoco"),
        ("rainbow/roadrunner", "ale_py", "examples"),
        ("qmix/simple_spread", "mpe2, pettingzoo", "examples"),
    ],
)
def test_a_missing_extra_is_named_with_its_install_command(config, missing, extra, tmp_path):
    result = _run(config, "--logdir", str(tmp_path / "r"), extras=False)
    assert result.returncode == 2
    line = _one_line(result)
    assert f"needs {missing}: pip install 'parl-algos[{extra}]'" in line
    assert not (tmp_path / "r").exists()  # nothing started


def test_a_bad_config_is_one_line_naming_the_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('algorithm = "PPO"\n[agent]\nlearning_rate = 1e-3\n')
    result = _run(str(bad))
    assert result.returncode == 2
    assert "unknown key agent.learning_rate; allowed in [agent]: " in _one_line(result)


def test_an_unreachable_cluster_is_one_line_and_the_traceback_is_in_the_log(tmp_path):
    with socket.socket() as taken:  # bound, never listening: a connection is refused
        taken.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        run = tmp_path / "r"
        argv = ["ppo/cartpole", "--mode", "sync", "--address", address, "--logdir", str(run)]
        result = _run(*argv, env={"PARL_CLUSTER_TOKEN": "a-token"})  # the bar shows too
    assert result.returncode == 1
    line = _one_line(result)
    assert f"cannot reach the cluster: no PARL master answers at {address}" in line
    assert "leave out --address for a local cluster" in line
    assert "parl.connect()" not in line  # advice for a script, not for parl-train's user
    assert f"the traceback is in {run / 'log.log'}" in line
    assert "--resume" not in line  # no checkpoint yet
    assert "Traceback (most recent call last)" in (run / "log.log").read_text()


@pytest.mark.parametrize(
    ("mode", "what"),
    [("single", "the run failed"), ("sync", "an actor failed")],
)
def test_a_failure_after_a_checkpoint_names_the_resume_command(mode, what, tmp_path):
    run = tmp_path / "r"
    argv = ["ppo/cartpole", "--env.id", FAILING_ENV, *SMALL, "--train.checkpoint_every", "256"]
    result = _run(*argv, "--mode", mode, "--actors", "1", "--logdir", str(run))
    assert result.returncode == 1
    line = _one_line(result)
    assert f"{what}: RuntimeError: the environment broke at its step 300" in line
    assert line.endswith(f"; once fixed, continue with parl-train --resume {run})")
    log = (run / "log.log").read_text()
    assert "Traceback (most recent call last)" in log and "failing_env.py" in log
    assert (run / "checkpoints").is_dir()


def test_debug_prints_the_traceback_too(tmp_path):
    run = tmp_path / "r"
    argv = ["ppo/cartpole", "--env.id", FAILING_ENV, *SMALL, "--logdir", str(run), "--debug"]
    result = _run(*argv)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert _on_a_terminal(result.stderr)[-1].startswith("parl-train: error: the run failed")

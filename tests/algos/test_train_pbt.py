"""`parl-train CONFIG --pbt SPACE.toml --population P`: members as actors of a real cluster.

The population here is PPO on CartPole, four members of a few thousand env steps each, run
by the real command (forked from the test process's warm `parl-train`): the members train as
actors of the embedded cluster, checkpoint through the run skeleton and continue with its
resume, and the copies are real checkpoint directories.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from parl_algos.train import ConfigError, load_config
from parl_algos.train._pbt import PbtSpace, check_population, exploit, explore, read_pbt_space
from parl_algos.train._sweep import Param
from tests.algos.train_cli import parl_train

TINY = [
    "--env.num_envs",
    "4",
    "--agent.n_steps",
    "32",
    "--agent.anneal",
    "false",
    "--train.eval_every",
    "0",
    "--train.log_every",
    "256",
    "--train.checkpoint_every",
    "1000000",
    "--no-progress",
]
"""Each member: 4 CartPoles, a fixed learning rate, no evaluations, a row every 256 env steps,
checkpoints only where an interval ends."""

SPACE = """
[space]
"agent.lr" = { log_uniform = [1e-4, 3e-3] }
"agent.clip_coef" = { uniform = [0.1, 0.3] }
"agent.update_epochs" = { int = [2, 4] }
"""
KEYS = ["agent.lr", "agent.clip_coef", "agent.update_epochs"]
ROOT = Path(__file__).resolve().parents[2]
PARL_TRAIN = str(Path(sys.executable).with_name("parl-train"))


def _space(tmp_path: Path, text: str) -> str:
    path = tmp_path / "space.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint's agent.ckpt (the models' and the optimizers'), by path."""
    found: dict[str, torch.Tensor] = {}

    def walk(value, path):
        if isinstance(value, torch.Tensor):
            found[path] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}/{k}")
        elif isinstance(value, list | tuple):
            for k, v in enumerate(value):
                walk(v, f"{path}/{k}")

    walk(torch.load(checkpoint / "agent.ckpt", weights_only=True), "")
    return found


def _lr(run_dir: Path) -> float:
    """The learning rate in the optimizer of a run's final agent.ckpt."""
    state = torch.load(run_dir / "agent.ckpt", weights_only=True)
    return state["algorithm"]["optimizer"]["param_groups"][0]["lr"]


@pytest.mark.slow  # four members of two intervals each, on the embedded cluster
def test_a_population_copies_checkpoints_explores_and_names_its_best(tmp_path):
    pbt_dir = tmp_path / "pbt"
    proc = parl_train(
        "ppo/cartpole",
        "--pbt",
        _space(tmp_path, SPACE),
        "--population",
        "4",
        "--pbt-interval",
        "1024",
        "--train.total_steps",
        "2048",
        *TINY,
        "--logdir",
        str(pbt_dir),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lineage = _rows(pbt_dir / "lineage.csv")
    assert list(lineage[0]) == ["interval", "member", "env_step", "mean_return", "copied", *KEYS]
    start = {int(r["member"]): r for r in lineage if r["interval"] == "0"}
    after = {int(r["member"]): r for r in lineage if r["interval"] == "1"}
    end = {int(r["member"]): r for r in lineage if r["interval"] == "2"}  # the last: no copies
    assert sorted(start) == sorted(after) == sorted(end) == [0, 1, 2, 3] and len(lineage) == 12
    assert not any(r["copied"] for r in end.values())
    (copier,) = [m for m, r in after.items() if r["copied"]]  # a quarter of four
    source = int(after[copier]["copied"])
    returns = {m: float(r["mean_return"]) for m, r in after.items()}
    assert returns[copier] == min(returns.values())
    assert returns[source] == max(returns.values())
    for m in range(4):  # the others keep their hyperparameters; every value within the space
        assert 1e-4 <= float(after[m]["agent.lr"]) <= 3e-3
        assert 0.1 <= float(after[m]["agent.clip_coef"]) <= 0.3
        assert after[m]["agent.update_epochs"] in ("2", "3", "4")
        if m != copier:
            assert [after[m][k] for k in KEYS] == [start[m][k] for k in KEYS]
    explored = [float(after[copier][k]) for k in KEYS]
    assert explored != [float(start[source][k]) for k in KEYS]

    # the copy: the source's checkpoint at the interval, tensor for tensor (weights, Adam's
    # moments), and its rows; the copier went on from its env step
    step = int(after[source]["env_step"])
    copied = pbt_dir / f"member-{copier}" / "checkpoints" / f"step-{step:010d}"
    original = pbt_dir / f"member-{source}" / "checkpoints" / f"step-{step:010d}"
    mine, theirs = _tensors(copied), _tensors(original)
    assert mine.keys() == theirs.keys() and len(mine) > 4
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    copier_rows = _rows(pbt_dir / f"member-{copier}" / "progress.csv")
    source_rows = _rows(pbt_dir / f"member-{source}" / "progress.csv")
    before = [r for r in copier_rows if int(r["env_step"]) <= step]
    assert [(r["env_step"], r["mean_return"]) for r in before] == [
        (r["env_step"], r["mean_return"]) for r in source_rows if int(r["env_step"]) <= step
    ]
    assert int(copier_rows[-1]["env_step"]) >= 2048 and len(copier_rows) > len(before)
    log = (pbt_dir / f"member-{copier}" / "log.log").read_text()
    assert f"from {copied} (env step {step})" in log

    # the explored hyperparameters took effect: the copier's optimizer ends with its own
    # learning rate, not the one in the checkpoint it copied; its config.toml says them
    assert _lr(pbt_dir / f"member-{copier}") == pytest.approx(float(after[copier]["agent.lr"]))
    assert _lr(pbt_dir / f"member-{source}") == pytest.approx(float(after[source]["agent.lr"]))
    config = tomllib.loads((pbt_dir / f"member-{copier}" / "config.toml").read_text())
    assert config["agent"]["update_epochs"] == int(after[copier]["agent.update_epochs"])

    final = {
        m: float(_rows(pbt_dir / f"member-{m}" / "progress.csv")[-1]["mean_return"])
        for m in range(4)
    }
    best = max(final, key=final.get)
    assert f"pbt: best member {best} " in proc.stdout
    assert str(pbt_dir / f"member-{best}") in proc.stdout
    best_config = tomllib.loads((pbt_dir / "best.toml").read_text())
    member_config = tomllib.loads((pbt_dir / f"member-{best}" / "config.toml").read_text())
    assert best_config["agent"] == member_config["agent"]
    assert "logdir" not in best_config["train"]
    assert best_config["train"]["total_steps"] == 2048


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--population", "4", "--pbt-interval", "2048"], "--pbt-interval=2048 must be"),
        (["--population", "4", "--trials", "2"], "give --pbt or --sweep, not both"),
    ],
)
def test_bad_pbt_arguments_stop_the_command_before_anything_starts(args, message, tmp_path):
    pbt_dir = tmp_path / "pbt"
    space = _space(tmp_path, SPACE)
    argv = ["ppo/cartpole", "--pbt", space, *args, "--train.total_steps", "2048"]
    proc = parl_train(*argv, "--logdir", str(pbt_dir))
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.splitlines()
    assert line.startswith("parl-train: error: ") and message in line
    assert not pbt_dir.exists()


@pytest.mark.parametrize(
    ("population", "interval", "override", "message"),
    [
        (4, 0, None, "--pbt-interval=0 must be at least 1 and less than the budget"),
        (4, 4096, None, "(train.total_steps=2048)"),
        (4, 512, ("train.mode", "sync"), "PBT trains each run in single mode"),
        (1, 512, None, "--population=1: PBT needs at least 2 members"),
    ],
)
def test_a_population_that_cannot_train_is_refused(population, interval, override, message):
    config = load_config("ppo/cartpole")
    config.train.total_steps = 2048
    if override is not None:
        setattr(config.train, override[0].split(".")[1], override[1])
    with pytest.raises(ConfigError, match=re.escape(message)) as raised:
        check_population(config, population, interval, "no-such-dir")
    assert "\n" not in str(raised.value)


def test_a_directory_that_holds_a_population_it_cannot_continue_is_refused(tmp_path):
    (tmp_path / "lineage.csv").write_text("interval,member\n")
    with pytest.raises(ConfigError, match="cannot be continued .no population.json.; give"):
        check_population(load_config("ppo/cartpole"), 4, 512, str(tmp_path))


@pytest.mark.slow  # a population killed with SIGKILL mid-interval, then continued
def test_a_population_killed_mid_interval_continues_with_the_same_command(tmp_path):
    """The intervals finished before the kill are kept (their lineage rows, copies and
    checkpoints); the interrupted one runs again from the members' latest checkpoints."""
    pbt_dir = tmp_path / "pbt"
    argv = ["ppo/cartpole", "--pbt", _space(tmp_path, SPACE), "--population", "2"]
    argv += ["--pbt-interval", "1024", "--train.total_steps", "4096", *TINY]
    argv += ["--logdir", str(pbt_dir)]
    state = pbt_dir / "population.json"
    members = [pbt_dir / f"member-{m}" / "progress.csv" for m in (0, 1)]

    def mid_interval() -> bool:  # an interval finished, and a member is past its end
        if not state.exists():
            return False
        done = json.loads(state.read_text())["interval"]
        past = [int(_rows(p)[-1]["env_step"]) for p in members if p.exists() and _rows(p)]
        return 1 <= done < 4 and any(step > done * 1024 for step in past)

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    with open(tmp_path / "stderr", "wb") as stderr:
        child = subprocess.Popen(
            [PARL_TRAIN, *argv],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
            start_new_session=True,  # the population and its cluster: one group, by its id
        )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and child.poll() is None and not mid_interval():
            time.sleep(0.02)
        assert child.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
    done = json.loads(state.read_text())["interval"]
    before = _rows(pbt_dir / "lineage.csv")
    assert {r["interval"] for r in before} == {str(k) for k in range(done + 1)}

    proc = parl_train(*argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"continues after interval {done}, each member from its latest checkpoint" in (
        proc.stdout
    )
    lineage = _rows(pbt_dir / "lineage.csv")
    assert lineage[: len(before)] == before  # the finished intervals, as they were
    intervals = [(r["interval"], r["member"]) for r in lineage]
    assert intervals == [(str(k), str(m)) for k in range(5) for m in (0, 1)]
    assert sum(bool(r["copied"]) for r in lineage) >= 1
    for path in members:  # one line of rows to the budget: the interrupted part run again
        steps = [int(r["env_step"]) for r in _rows(path)]
        assert steps == sorted(set(steps)) and steps[-1] >= 4096


@pytest.mark.parametrize(
    ("space", "named"),
    [
        ('"agent.nope" = { uniform = [0.1, 0.3] }', "agent.nope"),
        ('"agent.n_steps" = { choice = [16, 32] }', "agent.n_steps cannot change within a run"),
        ('"env.num_envs" = { int = [2, 8] }', "env.num_envs cannot change within a run"),
        ('"train.total_steps" = { int = [2, 8] }', "train.total_steps cannot change"),
        ('"agent.lr" = { uniform = [1e-3, 1e-4] }', "agent.lr: the range"),
        ('"agent.lr" = { uniform = [1e-4, 1e-3] }\n[pbt]\nquantile = 0.75', "pbt.quantile"),
        ('"agent.lr" = { uniform = [1e-4, 1e-3] }\n[pbt]\nperturb = 2', "pbt.perturb"),
        ('"agent.lr" = { uniform = [1e-4, 1e-3] }\n[sweep]\npruner = "none"', "['sweep']"),
    ],
)
def test_a_bad_pbt_space_is_refused_naming_the_key(space, named, tmp_path):
    path = _space(tmp_path, f"[space]\n{space}\n")
    with pytest.raises(ConfigError, match=re.escape(named)) as raised:
        read_pbt_space(path, load_config("ppo/cartpole"))
    assert "\n" not in str(raised.value)


def test_a_bad_pbt_space_stops_the_command_before_anything_starts(tmp_path):
    pbt_dir = tmp_path / "pbt"
    path = _space(tmp_path, '[space]\n"agent.nope" = { uniform = [0.1, 0.3] }\n')
    proc = parl_train("ppo/cartpole", "--pbt", path, "--population", "4", "--logdir", str(pbt_dir))
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.splitlines()
    assert "agent.nope" in line
    assert not pbt_dir.exists()


def test_the_bottom_quarter_copies_from_the_top_quarter():
    rng = np.random.default_rng(0)
    assert exploit([10.0, 30.0, 20.0, 40.0], 0.25, rng) == {0: 3}
    assert exploit([None, 5.0], 0.25, rng) == {0: 1}  # no episode yet: the lowest
    for _ in range(20):
        plan = exploit([8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0], 0.25, rng)
        assert sorted(plan) == [1, 3] and set(plan.values()) <= {0, 2}
    assert len(exploit([float(i) for i in range(8)], 0.5, rng)) == 4


def test_explore_perturbs_by_a_factor_moves_to_a_neighbour_or_draws_anew():
    space = PbtSpace(
        params=(
            Param("agent.lr", "log_uniform", (1e-4, 1e-2)),
            Param("agent.update_epochs", "int", (2, 6)),
            Param("agent.gamma", "choice", (0.9, 0.95, 0.99)),
        ),
        resample_probability=0.0,
    )
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(50):
        new = explore({"agent.lr": 1e-3, "agent.update_epochs": 4, "agent.gamma": 0.95}, space, rng)
        assert new["agent.lr"] in (pytest.approx(8e-4), pytest.approx(1.2e-3))
        assert new["agent.update_epochs"] in (3, 5) and new["agent.gamma"] in (0.9, 0.99)
        seen.add((round(new["agent.lr"], 6), new["agent.update_epochs"], new["agent.gamma"]))
    assert len(seen) == 8
    edge = explore({"agent.lr": 1e-2, "agent.update_epochs": 6, "agent.gamma": 0.99}, space, rng)
    assert edge["agent.lr"] <= 1e-2 and edge["agent.update_epochs"] <= 6
    drawn = PbtSpace(params=space.params, resample_probability=1.0)
    values = [
        explore({"agent.lr": 1e-3, "agent.update_epochs": 4, "agent.gamma": 0.95}, drawn, rng)
        for _ in range(200)
    ]
    lrs = [v["agent.lr"] for v in values]
    assert all(1e-4 <= lr <= 1e-2 for lr in lrs) and min(lrs) < 3e-4 and max(lrs) > 3e-3
    assert {v["agent.update_epochs"] for v in values} == {2, 3, 4, 5, 6}
    assert math.isclose(sum(v["agent.gamma"] == 0.9 for v in values) / 200, 1 / 3, abs_tol=0.1)

"""`parl-train` runs: every shipped config in each of its modes, the run directory, resume, Ctrl-C.

Each run is the real command's `main` in a process of its own (forked from a warm one by
`train_cli.parl_train`; the tests that stop a run with a signal start the `parl-train`
executable itself), with a budget of a few hundred env steps. The
sync and async runs of every shipped config share one real cluster of the module (`--address`),
whose warm actor processes have already imported what the actors need; an embedded cluster a
run (what `parl-train` starts without `--address`) costs seconds of start each. Two of them
(`ON_AN_EMBEDDED_CLUSTER`, A2C's in the slow suite) and the sync and async resume tests run on
embedded clusters.
"""

from __future__ import annotations

import csv
import importlib.util
import itertools
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from parl_algos.train import get_spec, latest_checkpoint, load_config, shipped_configs
from parl_algos.train._spec import stat_columns
from tests.algos.train_cli import parl_train
from tests.remote.conftest import make_cluster

PARL_TRAIN = str(Path(sys.executable).with_name("parl-train"))
# Small schedules: rows, checkpoints and an evaluation within a few hundred steps.
SMALL = [
    "--train.log_every",
    "100",
    "--train.checkpoint_every",
    "200",
    "--train.eval_every",
    "200",
    "--train.eval_episodes",
    "1",
    "--no-progress",
]
OFF_POLICY_SMALL = ["--agent.learning_starts", "100", "--agent.train_freq", "50"]
OFF_POLICY_SMALL += ["--agent.gradient_steps", "5", "--agent.batch_size", "32"]
# Offline: a dataset of 2 episodes from a 120-step SAC run; multi-agent: small batches.
OFFLINE_SMALL = ["--env.sac_steps", "120", "--env.dataset_episodes", "2"]
OFFLINE_SMALL += ["--agent.batch_size", "32", "--agent.hidden_size", "32"]
OWN_LOOP_SMALL = {
    "BC": OFFLINE_SMALL,
    "CQL": OFFLINE_SMALL,
    "IQL": OFFLINE_SMALL,
    "MADDPG": ["--agent.learning_starts", "100", "--agent.batch_size", "32"],
    "MAPPO": ["--agent.num_envs", "2"],
    "QMIX": ["--agent.batch_size", "4"],
}


# R2D2 (sequences of 24 steps, 16 of them a stride): learning within a few hundred steps.
RECURRENT_SMALL = ["--agent.learning_starts", "4", "--agent.batch_size", "8"]
RECURRENT_SMALL += ["--agent.updates_per_collect", "2"]


def small_args(name: str) -> list[str]:
    config = load_config(name)
    spec = get_spec(config.algorithm)
    if spec.name in OWN_LOOP_SMALL:
        return SMALL + OWN_LOOP_SMALL[spec.name]
    family = spec.family
    if getattr(config.env, "atari", False) and family == "on_policy":  # a frame's CNN step
        return [*SMALL, "--env.num_envs", "4", "--agent.n_steps", "16"]
    if getattr(config.env, "atari", False):  # 28 KB a frame: a small memory
        return SMALL + OFF_POLICY_SMALL + ["--agent.buffer_size", "500"]
    if family in ("off_policy", "recurrent"):
        return SMALL + {"off_policy": OFF_POLICY_SMALL, "recurrent": RECURRENT_SMALL}[family]
    n_steps = getattr(config.agent, "n_steps", None)
    if n_steps is None:
        return SMALL
    # Short rollouts (ppo/hopper's are 256 steps of each environment).
    return [*SMALL, "--agent.n_steps", str(min(n_steps, 64))]


def rows(logdir: Path) -> list[dict[str, str]]:
    with open(logdir / "progress.csv", newline="") as f:
        return list(csv.DictReader(f))


# What `--list` shows (test_train_config checks that it shows these). The DQN family's members
# share one builder and one loop: on actors, DQN and Rainbow (every option at once) run in the
# default suite, the others in the slow one.
# The Acrobot and LunarLander configs run the CartPole loops of their members on other
# environments.
ON_ACTORS_SLOW = {"ddqn/cartpole", "duelingdqn/cartpole", "c51/cartpole", "qrdqn/cartpole"}
ON_ACTORS_SLOW |= {f"{a}/{e}" for a in ("dqn", "qrdqn") for e in ("acrobot", "lunarlander")}
ON_ACTORS_SLOW |= {f"{a}/{e}" for a in ("c51", "rainbow") for e in ("acrobot", "lunarlander")}
# The Atari configs run the same loops on frames: single mode in test_train_atari (and here in
# the slow suite), Ape-X on them in test_train_atari's slow test.
ON_ACTORS_SLOW |= {"dqn/roadrunner", "rainbow/roadrunner"}
# Likewise a loop's second config on actors: PPO's on Hopper (its CartPole runs in the default
# suite), the multi-agent ones (sync mode on actors is held to single mode's rows, run for run,
# by test_train_marl_offline), and DDPG and TD3 in sync and async modes (SAC's loop).
ON_ACTORS_SLOW |= {"ppo/hopper", "maddpg/simple_spread", "maddpg/simple_adversary"}
ON_ACTORS_SLOW |= {"mappo/simple_spread", "mappo/simple_adversary", "qmix/simple_spread"}
# simple_speaker_listener runs simple_spread's multi-agent loops with other agents' sizes.
ON_ACTORS_SLOW |= {"maddpg/simple_speaker_listener", "mappo/simple_speaker_listener"}
SLOW_MODES = {(n, m) for n in ("ddpg/pendulum", "td3/pendulum") for m in ("sync", "async")}
# A2C's sync mode is PPO's loop (ppo/cartpole runs it here); on an embedded cluster, as the
# resume tests' sync and async runs.
SLOW_MODES.add(("a2c/cartpole", "sync"))
# In one process too, the DQN family's members run the loop of `dqn/cartpole` (their options
# all at once in `rainbow/cartpole`, the distributional heads in `c51/cartpole` and
# `qrdqn/cartpole`, frames in test_train_atari, which runs `dqn/roadrunner`'s loop); the other
# members' configs run here in the slow suite (test_train_config loads every one in the default
# suite).
SLOW_SINGLE = {"ddqn/cartpole", "duelingdqn/cartpole", "dqn/acrobot", "c51/acrobot"}
SLOW_SINGLE |= {"qrdqn/acrobot", "qrdqn/lunarlander", "rainbow/acrobot", "rainbow/roadrunner"}
SLOW_SINGLE |= {"c51/lunarlander", "rainbow/lunarlander", "dqn/roadrunner"}
# The MuJoCo benchmark configs run the loops of ppo/hopper, sac/pendulum and td3/pendulum on
# other environments: in every mode in the slow suite.
MUJOCO = {f"{a}/{e}" for a in ("sac", "td3") for e in ("hopper", "halfcheetah", "walker2d")}
MUJOCO |= {"ppo/halfcheetah", "ppo/walker2d"}
SLOW_SINGLE |= MUJOCO
ON_ACTORS_SLOW |= MUJOCO
# PPO and IMPALA on Atari frames: in one process in the slow suite (a greedy evaluation
# episode of Pong is about a thousand CNN steps). On actors their loops are those of
# ppo/cartpole and impala/cartpole, with frames on the wire in dqn/roadrunner's Ape-X test.
ATARI_ON_POLICY = {"ppo/pong", "ppo/breakout", "impala/pong"}
SLOW_SINGLE |= ATARI_ON_POLICY


def _slow(name: str, mode: str) -> bool:
    if mode == "single":
        return name in SLOW_SINGLE
    return name in ON_ACTORS_SLOW or (name, mode) in SLOW_MODES


MODES = [
    pytest.param(n, m, marks=[pytest.mark.slow] if _slow(n, m) else [])
    for n in shipped_configs()
    for m in get_spec(load_config(n).algorithm).modes
    if m == "single" or n not in ATARI_ON_POLICY
]
# These start a cluster of their own (`actors + 1` slots), as without `--address`; the other
# sync and async runs share the module's `cluster`.
ON_AN_EMBEDDED_CLUSTER = {("a2c/cartpole", "sync"), ("impala/cartpole", "async")}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One real cluster (master and worker on 127.0.0.1) for the module's sync and async runs.

    Twice the slots of one run (2 actors and the evaluation actor): the next run never waits
    for the slots of the last to come back. Stopped by PID at the end of the module, even on
    failure.
    """
    root = tmp_path_factory.mktemp("cluster")
    cluster = make_cluster(root, workers=(6,), OMP_NUM_THREADS=1)
    yield cluster
    cluster.stop()


@pytest.mark.parametrize(("name", "mode"), MODES)
def test_every_shipped_config_takes_a_few_steps(name, mode, tmp_path, request):
    logdir = tmp_path / "run"
    budget = 300
    address, env = [], None
    if mode != "single" and (name, mode) not in ON_AN_EMBEDDED_CLUSTER:
        cluster = request.getfixturevalue("cluster")
        address, env = ["--address", cluster.address], cluster.env
    proc = parl_train(
        name,
        "--mode",
        mode,
        *address,
        "--train.total_steps",
        str(budget),
        "--logdir",
        str(logdir),
        *small_args(name),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = rows(logdir)
    steps = [int(r["env_step"]) for r in written]
    assert steps[-1] >= budget and steps == sorted(set(steps))
    assert all(b - a <= 300 for a, b in itertools.pairwise(steps))
    config = load_config(name)
    if config.algorithm == "PPO":  # every mode's update: n_steps of all num_envs environments
        flags = dict(itertools.pairwise(small_args(name)))
        num_envs = int(flags.get("--env.num_envs", config.env.num_envs))
        n_steps = int(flags.get("--agent.n_steps", config.agent.n_steps))
        assert steps[0] == num_envs * n_steps, (mode, steps)
    assert latest_checkpoint(str(logdir)).endswith(f"step-{steps[-1]:010d}")
    # In sync and async modes in the evaluation actor, whose last result is waited for.
    assert "evaluation mean return" in (logdir / "log.log").read_text()


def test_the_run_directory_holds_every_file(tmp_path):
    logdir = tmp_path / "run"
    proc = parl_train(
        "dqn/cartpole",
        "--train.total_steps",
        "600",
        "--logdir",
        str(logdir),
        "--agent.lr",
        "1e-3",
        *small_args("dqn/cartpole"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = set(os.listdir(logdir))
    assert {"config.toml", "progress.csv", "learning_curve.png", "log.log"} <= names
    assert {"checkpoints", "agent.ckpt"} <= names
    assert any(n.startswith("events.out.tfevents") for n in names)
    config = tomllib.loads((logdir / "config.toml").read_text())
    assert config["algorithm"] == "DQN"
    assert config["agent"]["lr"] == 1e-3 and config["train"]["total_steps"] == 600
    with open(logdir / "progress.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header == ["env_step", "seconds", "mean_return", "loss", "q_mean", "actor_restarts"]
    assert header[3:-1] == stat_columns(get_spec("DQN").stats)
    written = rows(logdir)
    assert written[0]["env_step"] == "1" and written[0]["mean_return"] == ""  # none ended yet
    assert {r["actor_restarts"] for r in written} == {"0"}  # one process: no actors
    assert any(r["mean_return"] for r in written) and any(r["loss"] for r in written)
    checkpoints = sorted(os.listdir(logdir / "checkpoints"))
    assert checkpoints == ["step-0000000400", "step-0000000600"]  # the newest two are kept
    assert set(os.listdir(logdir / "checkpoints" / checkpoints[-1])) == {"agent.ckpt", "state.pkl"}


def test_the_default_run_directory_is_named_after_algorithm_and_environment(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [PARL_TRAIN, "a2c/cartpole", "--train.total_steps", "100", *SMALL],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "train_log" / "a2c-cartpole").iterdir()
    assert len(run.name) == len("2026-11-23_10-00-00")
    assert (run / "progress.csv").exists()


def step_and_return(logdir: Path) -> list[tuple[str, str]]:
    return [(r["env_step"], r["mean_return"]) for r in rows(logdir)]


@pytest.mark.parametrize("name", ["ppo/cartpole", "dqn/cartpole", "bc/pendulum"])
def test_resuming_from_a_periodic_checkpoint_rewrites_the_same_rows(name, tmp_path):
    """As after `kill -9`: the rows past the last checkpoint are dropped and written again."""
    whole = tmp_path / "whole"
    args = ["--train.total_steps", "1500", *small_args(name), "--train.checkpoint_every", "500"]
    proc = parl_train(name, "--logdir", str(whole), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    crashed = tmp_path / "crashed"
    shutil.copytree(whole, crashed)
    shutil.rmtree(latest_checkpoint(str(crashed)))  # the run died before its last checkpoint
    resume_from = int(latest_checkpoint(str(crashed)).rsplit("-", 1)[1])
    assert resume_from < int(rows(whole)[-1]["env_step"])
    proc = parl_train("--resume", str(crashed), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert step_and_return(crashed) == step_and_return(whole)
    assert any(ret for _, ret in step_and_return(whole))
    assert f"resumed {crashed}" in (crashed / "log.log").read_text()


def stop_when(args: list[str], logdir: Path, sig: int, ready: Callable[[], bool]) -> str:
    """Run `parl-train` until `ready()`, then send it `sig`; check its exit; return stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen(
        [PARL_TRAIN, *args, "--logdir", str(logdir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and child.poll() is None and not ready():
            time.sleep(0.05)
        assert child.poll() is None, child.communicate()[1][-3000:]
        child.send_signal(sig)
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == (130 if sig == signal.SIGINT else -signal.SIGKILL), err[-3000:]
    return err


def test_ctrl_c_writes_a_checkpoint_exits_130_and_the_resumed_run_matches(tmp_path):
    name = "ppo/cartpole"
    args = [*small_args(name), "--agent.anneal", "false", "--train.log_every", "256"]
    whole = tmp_path / "whole"
    proc = parl_train(name, "--logdir", str(whole), "--train.total_steps", "5000", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]

    stopped = tmp_path / "stopped"
    args = [name, "--train.total_steps", "10000000", *args]

    def ready():
        return (stopped / "progress.csv").exists() and len(rows(stopped)) >= 3

    err = stop_when(args, stopped, signal.SIGINT, ready)
    assert f"--resume {stopped}" in err
    checkpoint = latest_checkpoint(str(stopped))
    stopped_at = int(checkpoint.rsplit("-", 1)[1])
    assert int(rows(stopped)[-1]["env_step"]) <= stopped_at < 5000
    proc = parl_train("--resume", str(stopped), "--train.total_steps", "5000")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert step_and_return(stopped) == step_and_return(whole)


@pytest.mark.parametrize(
    ("name", "mode", "sig"),
    [("ppo/cartpole", "sync", signal.SIGINT), ("dqn/cartpole", "async", signal.SIGKILL)],
)
def test_sync_and_async_runs_resume_from_their_last_checkpoint(name, mode, sig, tmp_path):
    """The workers' environments start afresh; rows, counters and the replay memory go on.

    Rows written after the checkpoint (by a run killed with `kill -9`) are dropped and
    written again; the checkpoint's replay memory holds one transition per env step.
    """
    logdir = tmp_path / "run"
    args = [name, "--mode", mode, "--actors", "2", "--train.total_steps", "10000000"]
    args += [*small_args(name), "--train.checkpoint_every", "500"]
    wanted = 1 if sig == signal.SIGINT else 2  # kill -9: rows past the last checkpoint

    def ready():
        root = logdir / "checkpoints"
        return root.is_dir() and sum(n.startswith("step-") for n in os.listdir(root)) >= wanted

    stop_when(args, logdir, sig, ready)
    before = rows(logdir)
    resume_from = int(latest_checkpoint(str(logdir)).rsplit("-", 1)[1])
    if sig == signal.SIGINT:  # Ctrl-C's checkpoint, at the step it stopped
        assert int(before[-1]["env_step"]) <= resume_from
    total = resume_from + 600
    proc = parl_train("--resume", str(logdir), "--train.total_steps", str(total))
    assert proc.returncode == 0, proc.stderr[-3000:]
    kept = [r for r in before if int(r["env_step"]) <= resume_from]
    after = rows(logdir)
    assert after[: len(kept)] == kept
    steps = [int(r["env_step"]) for r in after]
    assert steps == sorted(set(steps)) and steps[-1] >= total > steps[len(kept) - 1]
    assert f"resumed {logdir}" in (logdir / "log.log").read_text()
    with open(Path(latest_checkpoint(str(logdir))) / "state.pkl", "rb") as f:
        state = pickle.load(f)
    assert state["env_steps"] == steps[-1] == state["run"]["env_steps"]
    if "memory" in state["trainer"]:
        assert len(state["trainer"]["memory"]) == state["env_steps"]
        assert state["trainer"]["writer"].written == state["env_steps"]


@pytest.mark.skipif(
    not (importlib.util.find_spec("moviepy") and importlib.util.find_spec("pygame")),
    reason="needs parl-algos[video]",
)
def test_capture_video_records_the_evaluation_episodes(tmp_path):
    logdir = tmp_path / "run"
    proc = parl_train(
        "ppo/cartpole",
        "--capture-video",
        "--train.total_steps",
        "300",
        "--logdir",
        str(logdir),
        *SMALL,
        "--train.eval_episodes",
        "2",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    videos = sorted(os.listdir(logdir / "videos"))
    # Evaluations at env steps 256 and 512 (after each 256-step batch past a multiple of 200).
    assert videos == [f"eval-episode-{i}.mp4" for i in range(4)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sync_mode_runs_its_actors_on_ray(tmp_path):
    """`--backend ray`: the same sampler actors on a local Ray of its own (a private temp dir)."""
    pytest.importorskip("ray")
    logdir = tmp_path / "run"
    # Ray's socket paths must stay under 108 bytes: a short temporary folder, not tmp_path.
    with tempfile.TemporaryDirectory(prefix="parl-ray-") as tmp:
        env = {"RAY_TMPDIR": tmp, "HOME": tmp, "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0"}
        env["RAY_worker_niceness"] = "0"  # Ray's default (15) starves its actors beside tests
        proc = parl_train(
            "ppo/cartpole",
            "--mode",
            "sync",
            "--backend",
            "ray",
            "--train.total_steps",
            "300",
            "--logdir",
            str(logdir),
            *small_args("ppo/cartpole"),
            timeout=500,
            env=env,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(rows(logdir)[-1]["env_step"]) >= 300
    assert "evaluation mean return" in (logdir / "log.log").read_text()


@pytest.mark.slow
@pytest.mark.timeout(600)
# PPO async (seed 1): 475 at 26.2k env steps, 159 s of training under a load average of 30.
@pytest.mark.parametrize(("name", "mode"), [("ppo/cartpole", "sync"), ("ppo/cartpole", "async")])
def test_cartpole_reaches_475_with_2_actors(name, mode, tmp_path):
    logdir = tmp_path / "run"
    proc = parl_train(
        name,
        "--mode",
        mode,
        "--actors",
        "2",
        "--train.stop_at_target",
        "true",
        "--train.eval_every",
        "0",
        "--no-progress",
        "--logdir",
        str(logdir),
        timeout=580,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (logdir / "log.log").read_text()
    reached = re.search(r"mean return of the last 10 episodes reached ([0-9.]+) at env step", log)
    assert reached and float(reached[1]) >= 475, log[-2000:]
    # The run stops after the batch in which it reached 475; that batch's later episodes are in
    # the last row's mean, which can sit a little below it; a policy that collapsed would not.
    assert float(rows(logdir)[-1]["mean_return"]) >= 400


# Ape-X's learner: DQN (double, as dqn/cartpole is) with a dueling network, 3-step returns and
# prioritized replay (Horgan et al., 2018).
APEX_OPTIONS = ["--agent.dueling", "true", "--agent.n_step", "3", "--agent.prioritized", "true"]


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_dqn_reaches_475_on_cartpole_with_2_actors(mode, tmp_path):
    """dqn/cartpole with Ape-X's options, to 475 within 60k env steps.

    `sync`: both actors explore on the learner's schedule (epsilon down to 0.04), and the mean
    of the last 10 training episodes reaches 475. `async`: Ape-X's actors keep exploring by
    design (epsilons 0.4 and 0.4 ** 8 with two actors), so their episodes' mean stays far
    below 475 however good the policy; the greedy policy's evaluations (5 episodes every 2000
    env steps, in the evaluation actor) are what reach it (`--train.target_on eval`).

    Seed 1 on a machine at load 4-8: sync reached 482 at 36.4k env steps (202 s of training),
    async an evaluation of 500 at 16.4k (173 s). The plain config (no option) missed 475 in
    sync within 108k steps on seed 1, its mean swinging between 15 and 260. Async runs are not
    repeatable (the learner takes batches in the order they arrive), so an async run that
    misses gets one more try, on seed 2; sync runs are repeatable and get one.
    """
    seeds = ["1", "2"] if mode == "async" else ["1"]
    target = ["--train.eval_every", "0"]
    if mode == "async":
        target = ["--train.eval_every", "2000", "--train.target_on", "eval"]
    for seed in seeds:
        logdir = tmp_path / f"run-{seed}"
        proc = parl_train(
            "dqn/cartpole",
            "--mode",
            mode,
            "--actors",
            "2",
            *APEX_OPTIONS,
            "--train.seed",
            seed,
            "--train.total_steps",
            "60000",
            "--train.stop_at_target",
            "true",
            *target,
            "--no-progress",
            "--logdir",
            str(logdir),
            timeout=700,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        log = (logdir / "log.log").read_text()
        reached = re.search(r"reached ([-\d.]+) at env step (\d+)", log)
        if reached is not None:
            break
    assert reached is not None, f"seeds {seeds} missed 475 within 60k env steps: {log[-2000:]}"
    assert float(reached[1]) >= 475 and int(reached[2]) <= 60_000
    if mode == "async":
        assert "evaluation mean return reached" in log
    written = [int(r["env_step"]) for r in rows(logdir)]
    assert written[-1] < 60_000  # stopped at the target, inside the cap


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_c51_config_reaches_its_target_return(tmp_path):
    """The shipped config as it is: seed 1 reached 195 at 4.3k env steps (3 s of training).

    QR-DQN's (14.1k) and Rainbow's shipped configs reached theirs too, in 30k steps.
    """
    logdir = tmp_path / "run"
    config = load_config("c51/cartpole")
    proc = parl_train(
        "c51/cartpole",
        "--train.stop_at_target",
        "true",
        "--train.eval_every",
        "0",
        "--no-progress",
        "--logdir",
        str(logdir),
        timeout=380,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reached = re.search(r"reached [-\d.]+ at env step (\d+)", (logdir / "log.log").read_text())
    assert reached is not None and int(reached.group(1)) <= config.train.total_steps
    assert config.train.target_return == 195.0

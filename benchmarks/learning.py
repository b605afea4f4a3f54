"""Sample efficiency and wall time of the zoo's examples, optionally beside Stable-Baselines3.

For each task, each seed runs the example (`examples/<algo>/train.py`, its default
hyperparameters) in a fresh process until the mean return of the last 10 training episodes
first reaches the threshold, or the step cap. The table reports, per task, the median over the
seeds of the env steps and wall seconds to the threshold (a run that misses it counts as the
cap and its full time, and the table says how many missed). The clock starts when training
starts, after the networks are built, on both sides.

The examples on remote actors (`a2c_parallel`, `impala`, `a3c`, `ga3c`: 2 actors of a local
cluster that each run starts) are set beside a single-process run of `examples/a2c/train.py`
made in the same invocation, seed by seed: for A2C parallel with the same settings (the same 16
environments, batch and learning rate, in one process), for IMPALA, A3C and GA3C with A2C's
defaults. Their table also gives the whole command's wall time, cluster start-up and actor
creation included. `r2d2` runs `examples/r2d2` (2 remote actors) on CartPole-v1 with the
velocities masked out, to a mean return of 100; `r2d2_memoryless` the same with a feed-forward
Q-network in place of the LSTM (`--no-memory`); `dqn_masked` plain DQN (`examples/dqn`'s
defaults) on the same task (`CartPoleNoVelocity-v1`, registered by `parl_algos.rollout`) with
the same budget.

The DQN family's members run `examples/dqn/train.py` with the flags that make them (`qrdqn`:
`--distributional qr --n-atoms 10 --no-double`, as the RL Baselines3 Zoo's CartPole setting and
sb3-contrib's QR-DQN; `rainbow`: `--distributional c51 --n-step 3 --dueling --noisy
--prioritized`), a lighter schedule (`LIGHT_FLAGS`: 64-unit layers, 16 updates every 64 steps
after 500) and a lower threshold, 195, within 30k steps.

`--baseline sb3` also runs Stable-Baselines3 on the same tasks with the same hyperparameters,
read from the same `Args` defaults and the task's flags (QR-DQN: sb3-contrib's `QRDQN`; Rainbow
has no peer there). It is installed into its own virtual environment under `.benchmarks/`
(git-ignored), with torch pinned by `constraints.txt`; it is never a dependency of this
repository.

    python benchmarks/learning.py                                  # every task, seeds 1 2 3
    python benchmarks/learning.py --tasks ppo,sac --seeds 1
    python benchmarks/learning.py --baseline sb3 --json results.json
    python benchmarks/learning.py --tasks ppo,dqn --via parl-train  # the shipped configs
    python benchmarks/learning.py --tasks ppo,sac --via both        # configs beside examples
    python benchmarks/learning.py --tasks a2c_parallel,impala       # remote actors vs one process
    python benchmarks/learning.py --tasks a3c,ga3c,r2d2,r2d2_memoryless,dqn_masked
    python benchmarks/learning.py --tasks qrdqn,rainbow --baseline sb3
    nice python benchmarks/learning.py --tasks offline,marl --seeds 1,2
    nice python benchmarks/learning.py --tasks marl --marl-env simple_adversary --seeds 1,2
    nice python benchmarks/learning.py --tasks marl --marl-env simple_speaker_listener
    nice python benchmarks/learning.py --tasks marl --marl-env simple_adversary --marl-algos mappo \
        --marl-steps 1000000 --marl-flags '--num-envs 32 --eval-episodes 100'  # ~12 min a seed
    nice python benchmarks/learning.py --tasks hopper-time --seeds 1  # needs parl-algos[mujoco]
    nice python benchmarks/learning.py --tasks roadrunner --seeds 1   # ~1 hour a seed
    nice python benchmarks/learning.py --tasks mujoco --seeds 1       # the papers' budgets: days
    nice python benchmarks/learning.py --tasks mujoco --configs ppo/hopper --seeds 1,2,3  # ~1 hour
    nice python benchmarks/learning.py --tasks atari --seeds 1        # 10M steps a run: days
    nice python benchmarks/learning.py --tasks atari-cost --seeds 1,2,3  # what a step costs
    python benchmarks/learning.py --tasks apex-rate --seeds 1         # ~15 min, a quiet machine

Two sections measure returns rather than steps to a threshold. `offline` makes one Pendulum
dataset (`examples/offline_pendulum`: SAC trains online, a noisy copy of it collects it), then
learns BC, CQL and IQL from that same file with each seed, and reports each one's final mean
evaluation return, mean and median over the seeds (and the median's score, 0 for a random
policy, 1 for the SAC that made the data, whose own return is the table's last row).
`marl` trains MADDPG, independent DDPG, MAPPO and independent PPO (`examples/mpe`, MPE
`simple_spread` or, with `--marl-env`, `simple_adversary` or `simple_speaker_listener`; the
same env steps each) with each seed, and reports the greedy policy's mean return after
training and the mean of the last 50 training episodes; on `simple_adversary` also the greedy
returns of the good agents and of the adversary apart (their rewards pull in opposite
directions), and the cross-play table of `examples/mpe --cross-play` (each learner's good
agents against each learner's adversary, the two learners of a pair trained in one process),
with each centralized learner's lead over its independent twin seed by seed. `--marl-algos`,
`--marl-steps` and `--marl-flags` choose the learners, the budget and more example flags.

`mujoco` and `atari` compare learning at the budgets where the papers report it: every MuJoCo
config (`ppo`, `sac`, `td3` on Hopper, HalfCheetah and Walker2d, 1M env steps) or every Atari
config of the on-policy algorithms (`ppo/pong`, `ppo/breakout`, `impala/pong`, 10M agent steps)
runs its whole budget through `parl-train` (single mode), and Stable-Baselines3 runs the same
hyperparameters, budget and seeds (IMPALA has no SB3 counterpart). A row gives, for each side,
the mean of the last 100 training episodes, the trained policy's mean return over 10 evaluation
episodes at the end (greedy; SB3's is stochastic on Atari, as the Zoo evaluates), and the wall
seconds of the run, with RL Baselines3 Zoo's published score for the task beside them (its
benchmark table: one run, the v3 MuJoCo tasks, NoFrameskip-v4 games).
`PARL_BENCH_BUDGET_STEPS` shortens every run (a check of the plumbing, not a result: such runs
write no result rows). These sections and `hopper-time` keep each run as it ends
(`KeptRuns`: `benchmarks/kept/<section>.json`), and an invocation with the same
settings reuses the runs kept there, so that a table of runs of hours each fills over several
invocations; each run carries the day and the load average when it ended.

`hopper-time` runs `parl-train ppo/hopper` (PPO on Hopper-v5, whose step is costly enough for
parallel sampling to pay) in `single`, `sync` and `async` modes, 2 actors each, then
Stable-Baselines3's PPO with the config's hyperparameters, its 8 environments in 2 processes
(`sb3_runner.GroupedSubprocVecEnv`), each run until the mean return of the last 10 episodes
first reaches `PARL_BENCH_MUJOCO_THRESHOLD` (default 1,000, the issue's fixed score) or
`PARL_BENCH_MUJOCO_STEPS` env steps (default 400k). It prints, side by side from the one
invocation, env steps per second of training and the ratio to `single`'s, seconds to the
threshold and the ratio to SB3's, the mean return of the last 10 training episodes after
`PARL_BENCH_MUJOCO_AT_S` seconds of training (default 60; a run that stopped at the threshold
sooner counts its last mean), and the load average over the runs; result rows `ppo-hopper`.

`roadrunner` runs the DQN family on Atari frames through `parl-train` (`dqn/roadrunner` and
`rainbow/roadrunner`: examples/dqn_atari's bounded budget of 50k env steps): both in `single`
mode, their learning curves drawn in one figure (a PNG, `.benchmarks/atari-roadrunner.png`),
and `dqn/roadrunner --mode async --actors 2` (Ape-X) beside single-process DQN: env steps per
second of training and seconds until the mean of the last 10 training returns first reaches
`PARL_BENCH_ATARI_THRESHOLD` (default 500), each as a ratio to single-process DQN's from the
same invocation. `PARL_BENCH_ATARI_STEPS` shortens the runs (a check of rates: `3000` with
`PARL_BENCH_ATARI_FLAGS="--agent.learning_starts 1000"`, so that learning starts).
`atari-cost` says where an agent step of PPO on Atari frames goes (`ppo/breakout`,
`ppo/pong`; `PARL_BENCH_ATARI_COST_STEPS` agent steps a run, default 4,096, single mode, one
thread): the CPU milliseconds an agent step of collecting (the 8 environments with their
preprocessing, and acting with the Nature CNN) and of updating (4 epochs of 256-sample
minibatches), ours and SB3's PPO with the same hyperparameters (its `CnnPolicy`, in-process
environments), each measured in a process of its own. The 10M-step tables and a time to Pong's
0 cost days on 2 cores: this is what each step of them costs, and which part parallel sampling
cannot take away.
`apex-rate` measures only the rates, on shorter runs (12k env steps): single mode, Ape-X, and
Ape-X sending the weights every 100 env steps (`--train.weights_every 100`).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import os
import pathlib
import re
import runpy
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from collections.abc import Sequence

from _results import Row, command_line, machine, record

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SB3_VERSION = "2.9.2"
SB3_VENV = os.path.join(REPO, ".benchmarks", f"sb3-{SB3_VERSION}")
SB3_MARKER = f"stable-baselines3 {SB3_VERSION}, sb3-contrib {SB3_VERSION}, mujoco, ale-py, opencv\n"
SB3_RUNNER = os.path.join(REPO, "benchmarks", "sb3_runner.py")


@dataclasses.dataclass(frozen=True)
class Task:
    algo: str
    env_id: str
    threshold: float
    cap: int
    flags: tuple[str, ...] = ()
    """Flags of the example beyond the defaults."""
    single: tuple[str, ...] | None = None
    """On remote actors: the flags of the single-process `examples/a2c` run to compare with."""
    example: str | None = None
    """The example that runs it, when not `examples/<algo>` (the DQN family's members)."""

    @property
    def script(self) -> str:
        return os.path.join(REPO, "examples", self.example or self.algo, "train.py")


CONFIG_TASKS = {"a2c", "ddpg", "dqn", "ppo", "sac", "td3"}  # the shipped configs' six rows
SB3_ALGOS = {"a2c", "ddpg", "dqn", "ppo", "qrdqn", "sac", "td3"}  # sb3-contrib's QR-DQN too
# The DQN family's rows: smaller networks and updates than examples/dqn's defaults, so that a
# run takes about a minute on 2 cores (the slow tests in tests/algos/test_dqn_family.py too).
LIGHT_FLAGS = ("--hidden-size", "64", "--learning-starts", "500", "--train-freq", "64")
LIGHT_FLAGS += ("--gradient-steps", "16")
QRDQN_FLAGS = ("--distributional", "qr", "--n-atoms", "10", "--no-double", *LIGHT_FLAGS)
RAINBOW_FLAGS = ("--distributional", "c51", "--n-step", "3", "--dueling", "--noisy")
RAINBOW_FLAGS += ("--prioritized", *LIGHT_FLAGS)

TASKS = {
    "dqn": Task("dqn", "CartPole-v1", 475.0, 100_000),
    "ppo": Task("ppo", "CartPole-v1", 475.0, 100_000),
    "a2c": Task("a2c", "CartPole-v1", 475.0, 300_000),
    "ddpg": Task("ddpg", "Pendulum-v1", -200.0, 20_000),
    "td3": Task("td3", "Pendulum-v1", -200.0, 20_000),
    "sac": Task("sac", "Pendulum-v1", -200.0, 20_000),
    "a2c_parallel": Task(
        "a2c_parallel",
        "CartPole-v1",
        475.0,
        300_000,
        flags=("--actors", "2"),
        single=("--num-envs", "16", "--lr", "1e-3"),
    ),
    "impala": Task("impala", "CartPole-v1", 475.0, 300_000, flags=("--actors", "2"), single=()),
    "a3c": Task("a3c", "CartPole-v1", 475.0, 300_000, flags=("--actors", "2"), single=()),
    "ga3c": Task("ga3c", "CartPole-v1", 475.0, 300_000, flags=("--actors", "2"), single=()),
    # CartPole with the velocities masked out (the example's default): memory needed.
    "r2d2": Task("r2d2", "CartPole-v1", 100.0, 100_000, flags=("--actors", "2")),
    "r2d2_memoryless": Task(
        "r2d2_memoryless",
        "CartPole-v1",
        100.0,
        100_000,
        flags=("--actors", "2", "--no-memory"),
        example="r2d2",
    ),
    # The same task for plain DQN (examples/dqn's defaults, feed-forward), with R2D2's budget.
    "dqn_masked": Task(
        "dqn_masked",
        "CartPoleNoVelocity-v1",
        100.0,
        100_000,
        flags=("--env-id", "CartPoleNoVelocity-v1"),
        example="dqn",
    ),
    "qrdqn": Task(
        "qrdqn",
        "CartPole-v1",
        195.0,
        30_000,
        flags=QRDQN_FLAGS,
        example="dqn",
    ),
    "rainbow": Task(
        "rainbow",
        "CartPole-v1",
        195.0,
        30_000,
        flags=RAINBOW_FLAGS,
        example="dqn",
    ),
}


def example_args(task: Task) -> dict:
    """The example's settings (defaults and the task's flags), as the baseline must reproduce."""
    module = runpy.run_path(task.script, run_name="benchmark")
    return dataclasses.asdict(module["parse_args"](module["Args"], list(task.flags)))


def run_ours(
    task: Task, seed: int, timeout: float, algo: str | None = None, extra: Sequence[str] = ()
) -> dict:
    """One run of `examples/<algo>/train.py` (default: the task's, with the task's flags)."""
    if algo is None:
        script, extra = task.script, task.flags
    else:
        script = os.path.join(REPO, "examples", algo, "train.py")
    with tempfile.TemporaryDirectory() as logdir:
        flags = [
            "--seed", str(seed), "--total-steps", str(task.cap),
            "--target-return", str(task.threshold), "--stop-at-target",
            "--eval-every", "0", "--logdir", logdir, *extra,
        ]  # fmt: skip
        code = (
            "import json, runpy, sys\n"
            f"sys.argv = [{script!r}, *{flags!r}]\n"
            f"mod = runpy.run_path({script!r}, run_name='benchmark')\n"
            "print('RESULT', json.dumps(mod['main'](mod['parse_args'](mod['Args']))))\n"
        )
        env = {**os.environ, "TQDM_DISABLE": "1"}
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True, text=True, timeout=timeout, check=True, env=env,
        )  # fmt: skip
        command_seconds = time.perf_counter() - start
        curve = read_curve(logdir)
    result = json.loads(
        next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:]
    )
    return {
        "reached_at": result["reached_at"],
        "seconds": result["reached_seconds"] or result["seconds"],
        "env_steps": result["env_steps"],
        "command_seconds": round(command_seconds, 1),
        "curve": curve,
    }


def read_curve(logdir: str, window: int = 10) -> list[tuple[int, float]]:
    """A run's learning curve from its TensorBoard events: at each episode's end, the env step
    and the mean return of the last `window` episodes (empty where TensorBoard is missing)."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return []
    events = EventAccumulator(logdir, size_guidance={"scalars": 0})
    events.Reload()
    if "rollout/episode_return" not in events.Tags()["scalars"]:
        return []
    returns = [(e.step, e.value) for e in events.Scalars("rollout/episode_return")]
    return [
        (step, round(statistics.fmean(r for _, r in returns[max(0, i + 1 - window) : i + 1]), 2))
        for i, (step, _) in enumerate(returns)
    ]


def curves_on_a_grid(
    sides: dict[str, list[dict]], points: int = 40, window: int = 10
) -> dict | None:
    """Each side's runs' curves at the same env steps (a run that stopped at its target holds
    its last value), for a result row; None where a side has no curve."""
    curves = {side: [run.get("curve") or [] for run in runs] for side, runs in sides.items()}
    if not all(all(curve) for runs in curves.values() for curve in runs):
        return None
    end = max(curve[-1][0] for runs in curves.values() for curve in runs)
    grid = [round(end * i / (points - 1)) for i in range(points)]

    def at(curve: list, x: int) -> float:
        before = [value for step, value in curve if step <= x]
        return before[-1] if before else curve[0][1]

    return {
        "x": grid,
        "x_label": "env steps",
        "y_label": f"mean return of the last {window} episodes",
        **{side: [[at(c, x) for x in grid] for c in runs] for side, runs in curves.items()},
    }


def run_config(task: Task, seed: int, timeout: float) -> dict:
    """`run_ours` through `parl-train`: the shipped config `<algo>/<env>` (`--via parl-train`)."""
    flags = [
        "--train.seed", str(seed), "--train.total_steps", str(task.cap),
        "--train.target_return", str(task.threshold), "--train.stop_at_target", "true",
        "--train.eval_every", "0",
    ]  # fmt: skip
    run = run_parl_train(f"{task.algo}/{task.env_id.split('-')[0].lower()}", flags, timeout)
    run["seconds"] = run.pop("reached_seconds") or run["seconds"]
    return run


def run_single(task: Task, seed: int, timeout: float) -> dict:
    """The single-process A2C run that an example on remote actors is compared with."""
    return run_ours(task, seed, timeout, "a2c", task.single)


def ensure_sb3() -> str:
    """Create the baseline's virtual environment once; return its python.

    `PARL_BENCH_SB3_PYTHON` names the python of an environment made beforehand instead (one
    with stable-baselines3, and sb3-contrib for QR-DQN, gymnasium[mujoco] for `mujoco`, ale-py
    for `atari`).
    """
    if os.environ.get("PARL_BENCH_SB3_PYTHON"):
        return os.environ["PARL_BENCH_SB3_PYTHON"]
    python = os.path.join(SB3_VENV, "bin", "python")
    marker = os.path.join(SB3_VENV, ".installed")
    if not os.path.exists(marker) or pathlib.Path(marker).read_text() != SB3_MARKER:
        print(f"installing stable-baselines3=={SB3_VERSION} into {SB3_VENV} ...", flush=True)
        venv.create(SB3_VENV, with_pip=True, clear=True)
        subprocess.run(
            [
                python, "-m", "pip", "install", "--quiet",
                "-c", os.path.join(REPO, "constraints.txt"),
                f"stable-baselines3=={SB3_VERSION}", f"sb3-contrib=={SB3_VERSION}", "torch",
                "gymnasium[mujoco]", "ale-py", "opencv-python-headless",
            ],
            check=True,
        )  # fmt: skip
        with open(marker, "w") as f:
            f.write(SB3_MARKER)
    return python


def run_sb3(task: Task, seed: int, timeout: float) -> dict:
    spec = {
        "algo": task.algo,
        "threshold": task.threshold,
        "cap": task.cap,
        "seed": seed,
        "args": example_args(task),
    }
    out = subprocess.run(
        [ensure_sb3(), SB3_RUNNER, json.dumps(spec)],
        capture_output=True, text=True, timeout=timeout, check=True,
    )  # fmt: skip
    return json.loads(
        next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:]
    )


def summarise(task: Task, runs: list[dict]) -> dict:
    steps = [r["reached_at"] if r["reached_at"] is not None else task.cap for r in runs]
    commands = [r["command_seconds"] for r in runs if "command_seconds" in r]
    return {
        "median_steps": statistics.median(steps),
        "median_seconds": round(statistics.median(r["seconds"] for r in runs), 1),
        "median_command_seconds": round(statistics.median(commands), 1) if commands else None,
        "missed": sum(r["reached_at"] is None for r in runs),
        "runs": runs,
    }


def cell(summary: dict, task: Task, seeds: int) -> str:
    steps = summary["median_steps"]
    text = (
        f"{steps / 1000:.1f}k"
        if steps < task.cap or not summary["missed"]
        else f">{steps // 1000}k"
    )
    text += f" / {summary['median_seconds']:.1f} s"
    if summary["missed"]:
        text += f" ({summary['missed']}/{seeds} missed)"
    return text


def _name(task: Task) -> str:
    return f"{task.algo.upper()} {task.env_id} (≥ {task.threshold:g}, {task.cap // 1000}k)"


# -- offline and multi-agent sections: final returns of several learners on one budget ------


def run_main(script: str, flags: Sequence[str], timeout: float) -> dict:
    """Run an example's `main` in a fresh process; return the dict it returns."""
    code = (
        "import json, runpy, sys\n"
        f"sys.argv = [{script!r}, *{list(flags)!r}]\n"
        f"mod = runpy.run_path({script!r}, run_name='benchmark')\n"
        "print('RESULT', json.dumps(mod['main'](mod['parse_args'](mod['Args']))))\n"
    )
    env = {**os.environ, "TQDM_DISABLE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, timeout=timeout, check=True, env=env,
    )  # fmt: skip
    line = next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[7:])


def _mean_std(values: Sequence[float], digits: int = 0) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {spread:.{digits}f}"


def _dump(path: str | None, section: str, results: dict) -> None:
    if path:
        stem, ext = os.path.splitext(path)
        with open(f"{stem}-{section}{ext or '.json'}", "w") as f:
            json.dump(results, f, indent=2)


OFFLINE_ALGOS = ("bc", "cql", "iql")
OFFLINE_SCRIPT = os.path.join(REPO, "examples", "offline_pendulum", "train.py")


def run_offline(seeds: Sequence[int], timeout: float, json_path: str | None = None) -> str:
    """One Pendulum dataset (seed 1); BC, CQL and IQL learn from it with each seed."""
    with tempfile.TemporaryDirectory() as logdir:
        made = run_main(
            OFFLINE_SCRIPT, ["--seed", "1", "--algorithms", "", "--logdir", logdir], timeout
        )
        print(f"offline dataset: {made}", flush=True)
        runs = []
        for seed in seeds:
            flags = ["--seed", str(seed), "--dataset", os.path.join(logdir, "dataset.npz")]
            flags += ["--logdir", os.path.join(logdir, f"seed{seed}")]
            runs.append(run_main(OFFLINE_SCRIPT, flags, timeout))
            print(f"offline seed {seed}: {runs[-1]}", flush=True)
    _dump(json_path, "offline", {"dataset": made, "runs": runs})
    low, high = made["random_return"], made["sac_expert_return"]
    lines = [
        f"\nPendulum-v1 dataset of {made['transitions']} transitions, mean episode return "
        f"{made['data_return']:.0f} (random policy {low:.0f}, the SAC that made it "
        f"{high:.0f}); final mean return (score) over seeds {','.join(map(str, seeds))}:\n",
        "| learner | final return, mean ± std | median | score of the median | per seed |",
        "|---|---|---|---|---|",
    ]
    for name in OFFLINE_ALGOS:
        values = [run[f"{name}_return"] for run in runs]
        median = statistics.median(values)
        score = (median - low) / (high - low)
        per_seed = " / ".join(f"{v:.0f}" for v in values)
        row = f"| {name.upper()} | {_mean_std(values)} | {median:.0f} | {score:.2f} | {per_seed} |"
        lines.append(row)
    lines.append(f"| SAC (collected the data, noiseless) | {high:.0f} | | 1.00 | |")
    return "\n".join(lines)


MARL_STEPS = 25_000
MARL_LEARNERS = {
    "MADDPG": ("--algo", "maddpg"),
    "independent DDPG": ("--algo", "maddpg", "--independent"),
    "MAPPO": ("--algo", "mappo"),
    "independent PPO": ("--algo", "mappo", "--independent"),
}
MARL_SCRIPT = os.path.join(REPO, "examples", "mpe", "train.py")


MARL_ENVS = ("simple_spread", "simple_adversary", "simple_speaker_listener")


def run_marl(
    seeds: Sequence[int],
    timeout: float,
    json_path: str | None = None,
    env: str = "simple_spread",
    *,
    steps: int = MARL_STEPS,
    algos: Sequence[str] = ("maddpg", "mappo"),
    example_flags: Sequence[str] = (),
) -> str:
    """Centralized learners and their independent twins on an MPE task, one budget.

    `algos`: `maddpg` (MADDPG and independent DDPG), `mappo` (MAPPO and independent PPO);
    `example_flags`: more flags for `examples/mpe/train.py` (e.g. `--num-envs 32`).
    """
    if env not in MARL_ENVS:
        raise ValueError(f"marl: {env=} must be one of {', '.join(MARL_ENVS)}")
    if not algos or set(algos) - {"maddpg", "mappo"}:
        raise ValueError(f"marl: {algos=} must be 'maddpg', 'mappo' or both")
    runs: dict[str, list[dict]] = {
        name: [] for name, flags in MARL_LEARNERS.items() if flags[1] in algos
    }
    matches: dict[str, list[dict]] = {}
    adversaries = env == "simple_adversary"
    for seed in seeds:  # seed by seed, so that every learner sees the same load
        extra = ["--env", env, "--seed", str(seed), "--total-steps", str(steps), *example_flags]
        if adversaries:  # each pair in one process, its teams crossed
            for algo in algos:
                out = run_main(MARL_SCRIPT, ["--algo", algo, "--cross-play", *extra], timeout)
                print(f"marl {algo} cross-play {env} seed {seed}: {out}", flush=True)
                for result in out["learners"]:
                    runs[result["algo"]].append(result)
                for match, returns in out["cross_play"].items():
                    matches.setdefault(match, []).append(returns)
            continue
        for name, flags in MARL_LEARNERS.items():
            if flags[1] not in algos:
                continue
            runs[name].append(run_main(MARL_SCRIPT, [*flags, *extra], timeout))
            print(f"marl {name} {env} seed {seed}: {runs[name][-1]}", flush=True)
    _dump(json_path, f"marl-{env}" if adversaries else "marl", {**runs, "cross_play": matches})
    parts = ["all", "good", "adversary"] if adversaries else ["all"]
    header = "| learner | greedy, mean ± std |"
    if len(parts) > 1:
        header += " good agents, greedy | adversary, greedy |"
    lines = [
        f"\nMPE {env}, {steps // 1000}k env steps {' '.join(example_flags)}, seeds "
        f"{','.join(map(str, seeds))}: each agent's episode return, mean over agents\n",
        f"{header} last 50 training episodes | uniformly random |",
        "|---|" + "---|" * (len(parts) + 2),
    ]
    for name, results in runs.items():
        row = f"| {name} |"
        for part in parts:
            row += f" {_mean_std([r['final_return'][part] for r in results], 1)} |"
        last = [r["train_return_last"] for r in results]
        random = [r["random_return"]["all"] for r in results]
        lines.append(f"{row} {_mean_std(last, 1)} | {statistics.mean(random):.1f} |")
    if matches:
        lines += [
            "\nCross-play (the MADDPG paper's test): good agents of one learner against the "
            "adversary of another, greedy returns\n",
            "| good agents vs adversary | good agents, mean ± std | adversary, mean ± std |",
            "|---|---|---|",
        ]
        for match, results in matches.items():
            good = _mean_std([r["good"] for r in results], 1)
            lines.append(
                f"| {match} | {good} | {_mean_std([r['adversary'] for r in results], 1)} |"
            )
        lines += _cross_play_leads(matches)
    return "\n".join(lines)


def _cross_play_leads(matches: dict[str, list[dict]]) -> list[str]:
    """Rows of each centralized learner's lead over its independent twin, seed by seed.

    The adversary's lead: the centralized learner's adversary minus the twin's, against the
    same good agents; the good agents' lead likewise against the same adversary.
    """
    pairs = [("MADDPG", "independent DDPG"), ("MAPPO", "independent PPO")]
    lines = [
        "\nLead of the centralized learner over its independent twin, seed by seed "
        "(positive: the centralized one earns more against the same opponents)\n",
        "| learner | opponents of | adversary's lead | good agents' lead |",
        "|---|---|---|---|",
    ]
    for ours, twin in pairs:
        for other in (ours, twin):
            keys = [
                (f"{other} vs {ours}", f"{other} vs {twin}", "adversary"),
                (f"{ours} vs {other}", f"{twin} vs {other}", "good"),
            ]
            if any(a not in matches or b not in matches for a, b, _ in keys):
                continue
            cells = []
            for a, b, part in keys:
                leads = [x[part] - y[part] for x, y in zip(matches[a], matches[b], strict=True)]
                cells.append(" / ".join(f"{lead:+.2f}" for lead in leads))
            lines.append(f"| {ours} | {other} | {cells[0]} | {cells[1]} |")
    return lines if len(lines) > 3 else []


KEPT_DIR = os.path.join(REPO, "benchmarks", "kept")


class KeptRuns:
    """The finished runs of a section whose runs take hours, kept as each one ends, so that an
    invocation stopped midway (or a later one, on another day) goes on from them rather than
    measuring them again: `benchmarks/kept/<name>.json`, for each set of settings
    measured (the threshold, the budget) one record a run under its key (the side and the
    seed), each with the day, the machine and the load average (1 minute) when it ended. Runs
    of other settings are never reused. `PARL_BENCH_FRESH=1` measures every run again.
    """

    def __init__(self, name: str, settings: dict) -> None:
        self.path = os.path.join(KEPT_DIR, f"{name}.json")
        self.settings = settings
        self.kept: list[dict] = []
        if os.path.exists(self.path):
            with open(self.path) as f:
                self.kept = json.load(f)["kept"]
        mine = [entry for entry in self.kept if entry["settings"] == settings]
        if not mine:
            mine = [{"settings": settings, "runs": {}}]
            self.kept.append(mine[0])
        self.runs: dict[str, dict] = mine[0]["runs"]
        if os.environ.get("PARL_BENCH_FRESH") == "1":
            self.runs.clear()
        elif self.runs:
            print(f"{len(self.runs)} runs kept in {self.path} are reused", flush=True)

    def get(self, key: str) -> dict | None:
        """The kept run of `key`, or None where it was not measured yet."""
        return self.runs.get(key)

    def put(self, key: str, run: dict) -> dict:
        """Keep `run` under `key` with the day, the machine and the load; return it."""
        run = {**run, "date": datetime.date.today().isoformat(), "machine": machine()}
        run["load"] = round(os.getloadavg()[0], 1)
        self.runs[key] = run
        os.makedirs(KEPT_DIR, exist_ok=True)
        with open(self.path + ".tmp", "w") as f:
            json.dump({"kept": self.kept}, f, indent=1)
            f.write("\n")
        os.replace(self.path + ".tmp", self.path)
        return run


def _kept_loads(loads: list[float]) -> str:
    """The spread of the load averages that kept runs ended at, for a table or a row."""
    if not loads:
        return "load average not read"
    return f"load average {min(loads):.1f}-{max(loads):.1f} (1 minute, as each run ended)"


MUJOCO_CONFIG = "ppo/hopper"
MUJOCO_STEPS = int(os.environ.get("PARL_BENCH_MUJOCO_STEPS", "400000"))
MUJOCO_THRESHOLD = float(os.environ.get("PARL_BENCH_MUJOCO_THRESHOLD", "1000"))
MUJOCO_AT_SECONDS = float(os.environ.get("PARL_BENCH_MUJOCO_AT_S", "60"))
MUJOCO_ACTORS = 2
PARL_TRAIN = os.path.join(os.path.dirname(sys.executable), "parl-train")


def run_parl_train(
    config: str,
    flags: Sequence[str],
    timeout: float,
    *,
    curve: bool = False,
    rate_from: int | None = None,
    returns: bool = False,
) -> dict:
    """One `parl-train` run in its own process; its `RunResult`, from the run's log.

    `curve`: also the run's progress.csv as `curve`, `[env_step, mean of the last 10 training
    returns]` of each row where an episode had ended, the same means against the seconds of
    training as `timed_curve`, and `train_seconds`, the seconds of training at its last row
    (before the final checkpoint, which `seconds` includes).
    `rate_from`: also `rate`, env steps per second between progress.csv's first row at or
    past that env step and its last row. `returns`: also `returns`, every training episode's
    return in order (from TensorBoard), and `evaluation`, the last greedy evaluation's mean
    return in the log (None without one).
    """
    with tempfile.TemporaryDirectory() as logdir:
        start = time.perf_counter()
        subprocess.run(
            [PARL_TRAIN, config, *flags, "--no-progress", "--logdir", logdir],
            capture_output=True, text=True, timeout=timeout, check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        command_seconds = time.perf_counter() - start
        log = pathlib.Path(logdir, "log.log").read_text()
        with open(os.path.join(logdir, "progress.csv"), newline="") as f:
            rows = list(csv.DictReader(f))
        episode_returns = [value for _, value in read_curve(logdir, window=1)] if returns else []
    done = log[log.rindex("done: RunResult(") :]
    fields = dict(re.findall(r"(\w+)=([-\w.]+)", done[: done.index(")")]))
    reached = fields["reached_at"]
    extra = {}
    if curve:
        extra["curve"] = [
            [int(r["env_step"]), float(r["mean_return"])] for r in rows if r["mean_return"]
        ]
        extra["timed_curve"] = [
            [float(r["seconds"]), float(r["mean_return"])] for r in rows if r["mean_return"]
        ]
        extra["train_seconds"] = float(rows[-1]["seconds"])
    if returns:
        extra["returns"] = episode_returns
        evaluations = re.findall(r"evaluation mean return (-?[\d.]+)", log)
        extra["evaluation"] = float(evaluations[-1]) if evaluations else None
    if rate_from is not None:
        first = next(r for r in rows if int(r["env_step"]) >= rate_from)
        steps = int(rows[-1]["env_step"]) - int(first["env_step"])
        extra["rate"] = steps / (float(rows[-1]["seconds"]) - float(first["seconds"]))
    return {
        "reached_at": None if reached == "None" else int(reached),
        "reached_seconds": None if reached == "None" else float(fields["reached_seconds"]),
        "env_steps": int(fields["env_steps"]),
        "seconds": float(fields["seconds"]),
        "final_mean_return": _number(fields["final_mean_return"]),
        "command_seconds": round(command_seconds, 1),
        **extra,
    }


def _number(text: str) -> float | None:
    return None if text == "None" else float(text)


def _seconds_to_threshold(results: list[dict]) -> float | None:
    """The median seconds of training to the threshold; None unless every run reached it."""
    reached = [r["reached_seconds"] for r in results if r["reached_at"] is not None]
    return statistics.median(reached) if len(reached) == len(results) else None


def run_mujoco(seeds: Sequence[int], timeout: float, json_path: str | None = None) -> str:
    """PPO on Hopper-v5 through parl-train in each mode (2 actors), beside SB3's SubprocVecEnv.

    Every run stops when the mean return of the last 10 training episodes first reaches
    `PARL_BENCH_MUJOCO_THRESHOLD` (default 1,000), or at `PARL_BENCH_MUJOCO_STEPS` env steps
    (default 400k). SB3's PPO gets the config's hyperparameters and its environments in as many
    processes as there are actors (`sb3_runner.GroupedSubprocVecEnv`: SB3's `SubprocVecEnv`
    with `num_envs / 2` environments a process). The table gives each run's env steps per
    second of training over the ratio to `single`'s, and its seconds to the threshold over the
    ratio to SB3's, every number from this one invocation, with the load average around it.
    """
    from parl_algos.train import load_config

    config = load_config(MUJOCO_CONFIG)
    a, env = dataclasses.asdict(config.agent), config.env
    sb3_args = {**a, "env_id": env.id, "num_envs": env.num_envs, "torch_threads": 1}
    sb3_args["processes"] = MUJOCO_ACTORS
    common = ["--train.total_steps", str(MUJOCO_STEPS), "--train.eval_every", "0"]
    common += ["--train.target_return", str(MUJOCO_THRESHOLD), "--actors", str(MUJOCO_ACTORS)]
    common += ["--train.stop_at_target", "true"]
    runs: dict[str, list[dict]] = {"single": [], "sync": [], "async": [], "sb3": []}
    kept = KeptRuns("hopper-time", {"threshold": MUJOCO_THRESHOLD, "steps": MUJOCO_STEPS})
    for seed in seeds:  # seed by seed, so that every mode sees the same load
        for mode in ("single", "sync", "async"):
            run = kept.get(f"{mode}/{seed}")
            if run is None:
                flags = [*common, "--mode", mode, "--train.seed", str(seed)]
                run = run_parl_train(MUJOCO_CONFIG, flags, timeout, curve=True)
                run = kept.put(f"{mode}/{seed}", run)
            runs[mode].append(run)
            print(f"mujoco {mode} seed {seed}: {_brief(run)}", flush=True)
        if (run := kept.get(f"sb3/{seed}")) is not None:
            runs["sb3"].append(run)
            continue
        spec = {"algo": "ppo", "threshold": MUJOCO_THRESHOLD, "cap": MUJOCO_STEPS, "seed": seed}
        spec.update(args=sb3_args, stop_at_threshold=True)
        start = time.perf_counter()
        out = subprocess.run(
            [ensure_sb3(), SB3_RUNNER, json.dumps(spec)],
            capture_output=True, text=True, timeout=timeout, check=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        run = json.loads(
            next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:]
        )
        run["reached_seconds"], run["seconds"] = run["seconds"], run["total_seconds"]
        run["command_seconds"] = round(time.perf_counter() - start, 1)
        runs["sb3"].append(kept.put(f"sb3/{seed}", run))
        print(f"mujoco sb3 seed {seed}: {_brief(run)}", flush=True)
    _dump(json_path, "mujoco", runs)
    loads = [r["load"] for results in runs.values() for r in results if r["load"] is not None]
    days = sorted({r["date"] for results in runs.values() for r in results})

    rate = _rate
    single, sb3 = rate(runs["single"]), _seconds_to_threshold(runs["sb3"])
    lines = [
        f"\nPPO on {env.id} ({MUJOCO_CONFIG}: {env.num_envs} environments, "
        f"{a['n_steps'] * env.num_envs} steps a batch; {MUJOCO_ACTORS} actors), until the mean "
        f"return of the last 10 episodes reaches {MUJOCO_THRESHOLD:g} or "
        f"{MUJOCO_STEPS // 1000}k env steps, seeds {','.join(map(str, seeds))} (medians), "
        f"{_kept_loads(loads)}, "
        f"measured {' to '.join(dict.fromkeys([days[0], days[-1]]))}\n",
        f"| run | env steps / s of training (x single) | seconds to {MUJOCO_THRESHOLD:g} "
        f"(x SB3) | env steps to it | mean return after {MUJOCO_AT_SECONDS:g} s | "
        "whole command, s |",
        "|---|---|---|---|---|---|",
    ]
    for who, results in runs.items():
        seconds = _seconds_to_threshold(results)
        if seconds is None:
            missed = sum(r["reached_at"] is None for r in results)
            reached = f"missed ({missed}/{len(results)})"
        else:
            reached = f"{seconds:.1f}" + (f" ({seconds / sb3:.2f}x)" if sb3 else "")
        steps = [r["reached_at"] for r in results if r["reached_at"] is not None]
        at = f"{statistics.median(steps) / 1000:.1f}k" if steps else "-"
        command = statistics.median(r["command_seconds"] for r in results)
        name = (
            f"SB3 2.9.2 PPO, {MUJOCO_ACTORS} processes of {env.num_envs // MUJOCO_ACTORS} "
            "environments"
            if who == "sb3"
            else f"parl-train --mode {who}"
        )
        lines.append(
            f"| {name} | {rate(results):.0f} ({rate(results) / single:.2f}x) | {reached} "
            f"| {at} | {_figure(_score_at(results, MUJOCO_AT_SECONDS))} | {command:.1f} |"
        )
    peer = f"Stable-Baselines3 {SB3_VERSION} PPO, {MUJOCO_ACTORS} processes of "
    rows = _mujoco_rows(runs, env.id, f"{peer}{env.num_envs // MUJOCO_ACTORS} envs", seeds, loads)
    if rows:
        lines.append(f"result rows: {record('ppo-hopper', rows)}")
    return "\n".join(lines)


def _rate(results: list[dict]) -> float:
    """The median over runs of env steps per second of training."""
    return statistics.median(r["env_steps"] / r["seconds"] for r in results)


def _brief(run: dict) -> dict:
    """A run's figures without its curves, for the progress lines."""
    return {k: v for k, v in run.items() if k not in ("curve", "timed_curve")}


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _score_at(results: list[dict], seconds: float) -> float | None:
    """The median over runs of the mean of the last 10 training returns after `seconds` of
    training (a run's last mean where it stopped sooner, the first where none had ended);
    None where a run kept no curve against time."""

    def at(curve: list) -> float:
        before = [value for t, value in curve if t <= seconds]
        return before[-1] if before else curve[0][1]

    if not all(r.get("timed_curve") for r in results):
        return None
    return statistics.median(at(r["timed_curve"]) for r in results)


def _mujoco_rows(
    runs: dict[str, list[dict]], env_id: str, peer: str, seeds: Sequence[int], loads: list[float]
) -> list[Row]:
    """hopper-time's claims: each mode's seconds to the threshold and score at the fixed wall
    time against SB3's, and each parallel mode's rate against single's."""
    load = _kept_loads(loads)
    sb3_seconds = _seconds_to_threshold(runs["sb3"])
    sb3_score = _score_at(runs["sb3"], MUJOCO_AT_SECONDS)
    rows = []
    for mode in ("single", "sync", "async"):
        results = runs[mode]
        algorithm = "PPO, single process" if mode == "single" else f"PPO, {mode}, 2 actors"
        seconds = _seconds_to_threshold(results)
        steps = ", ".join(f"{r['reached_at'] or 0:,}" for r in results)
        if seconds is not None and sb3_seconds:
            rows.append(
                Row(
                    task=env_id, algorithm=algorithm,
                    metric=f"seconds of training to a training mean of {MUJOCO_THRESHOLD:g}",
                    better="lower", ours=round(seconds, 1), peer=peer,
                    peer_value=round(sb3_seconds, 1), seeds=list(seeds), command=command_line(),
                    note=f"{load}; env steps to it by seed: {steps}",
                )
            )  # fmt: skip
        if mode != "single":
            rows.append(
                Row(
                    task=env_id, algorithm=algorithm, metric="env steps per second of training",
                    better="higher", ours=round(_rate(results)),
                    peer=f"parl-train {MUJOCO_CONFIG} single",
                    peer_value=round(_rate(runs["single"])), seeds=list(seeds),
                    command=command_line(), note=load,
                )
            )  # fmt: skip
        score = _score_at(results, MUJOCO_AT_SECONDS)
        if score is not None and sb3_score is not None:
            rows.append(
                Row(
                    task=env_id, algorithm=algorithm,
                    metric=f"mean return of the last 10 training episodes after "
                    f"{MUJOCO_AT_SECONDS:g} s of training",
                    better="higher", ours=round(score, 1), peer=peer,
                    peer_value=round(sb3_score, 1), seeds=list(seeds), command=command_line(),
                    note=f"{load}; a run that reached {MUJOCO_THRESHOLD:g} sooner counts its "
                    "last mean",
                )
            )  # fmt: skip
    return rows


ATARI_CONFIGS = {"DQN": "dqn/roadrunner", "Rainbow": "rainbow/roadrunner"}
ATARI_STEPS = int(os.environ.get("PARL_BENCH_ATARI_STEPS", "50000"))
ATARI_THRESHOLD = float(os.environ.get("PARL_BENCH_ATARI_THRESHOLD", "500"))
ATARI_FLAGS = shlex.split(os.environ.get("PARL_BENCH_ATARI_FLAGS", ""))
ATARI_FIGURE = os.environ.get(
    "PARL_BENCH_ATARI_FIGURE", os.path.join(REPO, ".benchmarks", "atari-roadrunner.png")
)
ATARI_ACTORS = 2


def run_atari(seeds: Sequence[int], timeout: float, json_path: str | None = None) -> str:
    """Rainbow vs DQN on RoadRunner (one figure), and Ape-X (2 actors) vs DQN in one process.

    Each seed runs `parl-train dqn/roadrunner` and `rainbow/roadrunner` in `single` mode, then
    `dqn/roadrunner --mode async --actors 2` (Ape-X: the learner and its replay memory here,
    2 actors with their own epsilons), every run for `PARL_BENCH_ATARI_STEPS` env steps
    (default 50k, the configs' budget) without evaluations, with `PARL_BENCH_ATARI_FLAGS`
    added to each command. The figure (`PARL_BENCH_ATARI_FIGURE`, default
    `.benchmarks/atari-roadrunner.png`) draws each run's mean of the last 10 training returns
    (game scores) against env steps, the mean over the seeds in bold. The table gives env
    steps per second of training (to progress.csv's last row: the final checkpoint, whose
    replay memory is 3 GB of frames, left out) and the ratio to single-process DQN's, and the
    seconds until the mean of the last 10 training returns first reaches
    `PARL_BENCH_ATARI_THRESHOLD` (default 500) and the ratio to DQN's, every number from this
    one invocation, with the load average around it.
    """
    common = ["--train.total_steps", str(ATARI_STEPS), "--train.eval_every", "0"]
    common += ["--train.target_return", str(ATARI_THRESHOLD), *ATARI_FLAGS]
    kinds = {
        "DQN": (ATARI_CONFIGS["DQN"], []),
        "Rainbow": (ATARI_CONFIGS["Rainbow"], []),
        "DQN, Ape-X": (ATARI_CONFIGS["DQN"], ["--mode", "async", "--actors", str(ATARI_ACTORS)]),
    }
    runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
    loads = [os.getloadavg()[0]]
    for seed in seeds:  # seed by seed, so that every run sees the same load
        for kind, (config, mode) in kinds.items():
            flags = [*common, *mode, "--train.seed", str(seed)]
            runs[kind].append(run_parl_train(config, flags, timeout, curve=True))
            loads.append(os.getloadavg()[0])
            summary = {k: v for k, v in runs[kind][-1].items() if k != "curve"}
            print(f"atari {kind} seed {seed}: {summary}", flush=True)
    _dump(json_path, "atari", runs)
    _draw_curves(runs, ATARI_FIGURE)

    def rate(results: list[dict]) -> float:  # the last row of progress.csv: training only
        return statistics.median(r["env_steps"] / r["train_seconds"] for r in results)

    single, single_reached = rate(runs["DQN"]), _seconds_to_threshold(runs["DQN"])
    lines = [
        f"\nRoadRunner (ALE/RoadRunner-v5, Nature DQN preprocessing), {ATARI_STEPS // 1000}k env "
        f"steps a run, seeds {','.join(map(str, seeds))} (medians), load average "
        f"{min(loads):.1f}-{max(loads):.1f} (1 minute, between runs); learning curves in "
        f"{ATARI_FIGURE}\n",
        f"| run | env steps / s of training (x DQN) | seconds to a mean of {ATARI_THRESHOLD:g} "
        "(x DQN) | env steps to it | final mean of 10 | whole command, s |",
        "|---|---|---|---|---|---|",
    ]
    for kind, results in runs.items():
        seconds = _seconds_to_threshold(results)
        if seconds is None:
            missed = sum(r["reached_at"] is None for r in results)
            reached = f"missed ({missed}/{len(results)})"
        else:
            ratio = f" ({seconds / single_reached:.2f}x)" if single_reached else ""
            reached = f"{seconds:.0f}{ratio}"
        steps = [r["reached_at"] for r in results if r["reached_at"] is not None]
        at = f"{statistics.median(steps) / 1000:.1f}k" if steps else "-"
        final = [r["final_mean_return"] for r in results if r["final_mean_return"] is not None]
        final_text = f"{statistics.median(final):.0f}" if final else "-"
        command = statistics.median(r["command_seconds"] for r in results)
        name = f"{kind} ({ATARI_ACTORS} actors, async)" if "Ape-X" in kind else f"{kind} (single)"
        lines.append(
            f"| {name} | {rate(results):.0f} ({rate(results) / single:.2f}x) | {reached} "
            f"| {at} | {final_text} | {command:.0f} |"
        )
    return "\n".join(lines)


APEX_RATE_STEPS = int(os.environ.get("PARL_BENCH_APEX_RATE_STEPS", "12000"))
APEX_RATE_FROM = int(os.environ.get("PARL_BENCH_APEX_RATE_FROM", "3000"))
APEX_RATE_STARTS = int(os.environ.get("PARL_BENCH_APEX_RATE_STARTS", "1000"))
APEX_WEIGHTS_EVERY = 100  # Ape-X's 400 frames


def run_apex_rate(seeds: Sequence[int], timeout: float, json_path: str | None = None) -> str:
    """Ape-X's env steps per second on Atari frames beside one process, and with fewer sends.

    Each seed runs `parl-train dqn/roadrunner` three ways, one after the other: `single`
    mode, `--mode async --actors 2` (Ape-X, the learner's weights to an actor after each of
    its batches) and the same with `--train.weights_every 100` (Ape-X's 400 frames), each for
    `PARL_BENCH_APEX_RATE_STEPS` env steps (default 12k) with learning from
    `PARL_BENCH_APEX_RATE_STARTS` (default 1000) on, no evaluation and no checkpoint before
    the end. The rate is taken between progress.csv's first row at or past
    `PARL_BENCH_APEX_RATE_FROM` (default 3000: past the warm-up and the actors' start) and
    its last row, and given as a ratio to single mode's of the same seed.
    """
    common = ["--train.total_steps", str(APEX_RATE_STEPS), "--train.eval_every", "0"]
    common += ["--agent.learning_starts", str(APEX_RATE_STARTS)]
    common += ["--train.checkpoint_every", str(APEX_RATE_STEPS)]
    apex = ["--mode", "async", "--actors", str(ATARI_ACTORS)]
    kinds = {
        "single": ["--mode", "single"],
        "Ape-X": apex,
        f"Ape-X, weights every {APEX_WEIGHTS_EVERY}": [
            *apex,
            "--train.weights_every",
            str(APEX_WEIGHTS_EVERY),
        ],
    }
    rates: dict[str, list[float]] = {kind: [] for kind in kinds}
    loads = [os.getloadavg()[0]]
    for seed in seeds:
        for kind, flags in kinds.items():
            run = run_parl_train(
                ATARI_CONFIGS["DQN"], [*common, *flags, "--train.seed", str(seed)], timeout,
                rate_from=APEX_RATE_FROM,
            )  # fmt: skip
            rates[kind].append(run["rate"])
            loads.append(os.getloadavg()[0])
            print(f"apex-rate {kind} seed {seed}: {run['rate']:.1f} env steps/s", flush=True)
    _dump(json_path, "apex-rate", rates)
    lines = [
        f"\n`dqn/roadrunner`, {APEX_RATE_STEPS / 1000:g}k env steps a run, learning from "
        f"{APEX_RATE_STARTS}; env steps per second from env step {APEX_RATE_FROM} to the end, "
        f"seeds {','.join(map(str, seeds))}; load average {min(loads):.1f}-{max(loads):.1f} "
        "(1 minute, between runs)\n",
        "| run | env steps / s (each seed) | x single (median) |",
        "|---|---|---|",
    ]
    for kind, values in rates.items():
        ratio = statistics.median(v / s for v, s in zip(values, rates["single"], strict=True))
        each = ", ".join(f"{v:.1f}" for v in values)
        lines.append(f"| {kind} | {each} | {ratio:.2f}x |")
    return "\n".join(lines)


def _draw_curves(runs: dict[str, list[dict]], path: str) -> None:
    """Each run's curve faintly, the mean over seeds (at the steps every seed has) in bold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for (kind, results), color in zip(runs.items(), ("C0", "C3", "C2"), strict=False):
        style = "--" if "Ape-X" in kind else "-"
        for r in results:
            steps, returns = zip(*r["curve"], strict=True) if r["curve"] else ((), ())
            ax.plot(steps, returns, style, color=color, alpha=0.3, linewidth=1)
        curves = [dict(map(tuple, r["curve"])) for r in results]
        steps = sorted(set.intersection(*(set(curve) for curve in curves)))
        mean = [statistics.mean(curve[step] for curve in curves) for step in steps]
        ax.plot(steps, mean, style, color=color, linewidth=2, label=kind)
    ax.axhline(ATARI_THRESHOLD, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("env steps (4 frames each)")
    ax.set_ylabel("mean of the last 10 training returns (game score)")
    ax.set_title(f"RoadRunner, {ATARI_STEPS // 1000}k env steps: Rainbow vs DQN")
    ax.legend()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


BUDGET_CONFIGS = {
    "mujoco": [
        f"{a}/{e}" for a in ("ppo", "sac", "td3") for e in ("hopper", "halfcheetah", "walker2d")
    ],
    "atari": ["ppo/pong", "ppo/breakout", "impala/pong"],
}
BUDGET_STEPS = int(os.environ.get("PARL_BENCH_BUDGET_STEPS", "0"))  # 0: the configs' budgets
BUDGET_EVAL_EPISODES = 10
# RL Baselines3 Zoo's benchmark table (benchmark.md, rl_zoo3.benchmark: one trained agent,
# deterministic evaluation but on Atari): the published score of each config's task.
ZOO = "RL Baselines3 Zoo's benchmark"
PUBLISHED = {
    "ppo/hopper": (f"{ZOO}, PPO, Hopper-v3, 1M", 2410.4),
    "ppo/halfcheetah": (f"{ZOO}, PPO, HalfCheetah-v3, 1M", 5819.1),
    "ppo/walker2d": (f"{ZOO}, PPO, Walker2d-v3, 1M", 3478.8),
    "sac/hopper": (f"{ZOO}, SAC, Hopper-v3, 1M", 2325.5),
    "sac/halfcheetah": (f"{ZOO}, SAC, HalfCheetah-v3, 1M", 9535.5),
    "sac/walker2d": (f"{ZOO}, SAC, Walker2d-v3, 1M", 3863.2),
    "td3/hopper": (f"{ZOO}, TD3, Hopper-v3, 1M", 3606.4),
    "td3/halfcheetah": (f"{ZOO}, TD3, HalfCheetah-v3, 1M", 9655.7),
    "td3/walker2d": (f"{ZOO}, TD3, Walker2d-v3, 1M", 4717.8),
    "ppo/pong": (f"{ZOO}, PPO, PongNoFrameskip-v4, 10M", 21.0),
    "ppo/breakout": (f"{ZOO}, PPO, BreakoutNoFrameskip-v4, 10M", 398.0),
}


def run_budget_sb3(
    config_name: str, seed: int, steps: int, timeout: float, eval_episodes: int = 0
) -> dict:
    """SB3 with the config's hyperparameters for `steps` env steps, in its own venv."""
    from parl_algos.train import load_config

    config = load_config(config_name)
    env = config.env
    args = {**dataclasses.asdict(config.agent), "env_id": env.id, "torch_threads": 1}
    args |= {"num_envs": getattr(env, "num_envs", 1), "atari": getattr(env, "atari", False)}
    args["fire_reset"] = getattr(env, "fire_reset", False)
    spec = {"algo": config.algorithm.lower(), "threshold": float("inf"), "cap": steps}
    spec |= {"seed": seed, "args": args, "stop_at_threshold": False}
    spec["eval_episodes"] = eval_episodes
    out = subprocess.run(
        [ensure_sb3(), SB3_RUNNER, json.dumps(spec)],
        capture_output=True, text=True, timeout=timeout, check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    return json.loads(
        next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[7:]
    )


def run_budget(
    group: str, seeds: Sequence[int], timeout: float, json_path: str | None = None
) -> str:
    """Each config of `group` for its whole budget, ours and SB3's, seed by seed (see the
    module's docstring); result rows unless `PARL_BENCH_BUDGET_STEPS` shortened the runs."""
    from parl_algos.train import get_spec, load_config

    kept = KeptRuns(group, {"steps": BUDGET_STEPS, "eval_episodes": BUDGET_EVAL_EPISODES})
    table = [
        f"\nthe configs' budgets{f' cut to {BUDGET_STEPS} env steps' if BUDGET_STEPS else ''}, "
        f"seeds {','.join(map(str, seeds))} (medians): the mean of the last 100 training "
        f"episodes / the trained policy over {BUDGET_EVAL_EPISODES} episodes / wall seconds\n",
        "| config (task, budget) | parl-train | Stable-Baselines3 2.9.2 | published |",
        "|---|---|---|---|",
    ]
    rows, everything = [], {}
    for name in BUDGET_CONFIGS[group]:
        config = load_config(name)
        steps = BUDGET_STEPS or config.train.total_steps
        flags = ["--train.total_steps", str(steps), "--train.eval_every", str(steps)]
        flags += ["--train.eval_episodes", str(BUDGET_EVAL_EPISODES)]
        flags += ["--train.target_return", "inf"]
        peer = "sb3" if config.algorithm in ("PPO", "SAC", "TD3") else None
        runs: dict[str, list[dict]] = {"ours": [], **({"sb3": []} if peer else {})}
        for seed in seeds:  # seed by seed, so that both sides see the same load
            if (run := kept.get(f"ours/{name}/{seed}")) is None:
                flags_seed = [*flags, "--train.seed", str(seed)]
                run = run_parl_train(name, flags_seed, timeout, returns=True)
                returns = run["returns"]
                run["last_100"] = statistics.fmean(returns[-100:]) if returns else None
                run = kept.put(f"ours/{name}/{seed}", run)
            runs["ours"].append(run)
            print(f"{name} parl seed {seed}: {_budget_cell([run])}", flush=True)
            if peer:
                if (run := kept.get(f"sb3/{name}/{seed}")) is None:
                    run = run_budget_sb3(name, seed, steps, timeout, BUDGET_EVAL_EPISODES)
                    run = kept.put(f"sb3/{name}/{seed}", run)
                runs["sb3"].append(run)
                print(f"{name} sb3 seed {seed}: {_budget_cell(runs['sb3'][-1:])}", flush=True)
        everything[name] = runs
        published = PUBLISHED.get(name)
        table.append(
            f"| `{name}` ({config.env.id}, {steps:,}) | {_budget_cell(runs['ours'])} "
            f"| {_budget_cell(runs['sb3']) if peer else 'no counterpart'} "
            f"| {f'{published[1]:g} ({published[0]})' if published else '-'} |"
        )
        if peer and not BUDGET_STEPS:
            rows += _budget_rows(name, config, get_spec(config.algorithm), runs, seeds, published)
    _dump(json_path, group, everything)
    loads = [r["load"] for runs in everything.values() for side in runs.values() for r in side]
    table.append(f"\n{_kept_loads([load for load in loads if load is not None])}")
    if rows:
        table.append(f"result rows: {record('learning', rows)}")
    return "\n".join(table)


def _median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _budget_cell(runs: list[dict]) -> str:
    figures = [_median(runs, key) for key in ("last_100", "evaluation", "seconds")]
    return " / ".join("-" if f is None else f"{f:,.1f}" for f in figures)


def _budget_rows(
    name: str,
    config: object,
    spec: object,
    runs: dict[str, list[dict]],
    seeds: Sequence[int],
    published: tuple[str, float] | None,
) -> list[Row]:
    """Result rows of one config at its budget: the two scores and the wall time, against SB3."""
    env_id, steps = config.env.id, config.train.total_steps  # type: ignore[attr-defined]
    algorithm = algorithm_name(name.split("/")[0])
    peer = f"Stable-Baselines3 {SB3_VERSION} {algorithm}"
    note = f"published: {published[1]:g} ({published[0]})" if published else ""
    claims = [
        ("last_100", f"mean of the last 100 training episodes after {steps:,} env steps", "higher"),
        (
            "evaluation",
            f"the trained policy's mean return over {BUDGET_EVAL_EPISODES} episodes "
            f"after {steps:,} env steps",
            "higher",
        ),
        ("seconds", f"wall seconds for {steps:,} env steps, one process", "lower"),
    ]
    rows = []
    for key, metric, better in claims:
        ours, theirs = _median(runs["ours"], key), _median(runs["sb3"], key)
        if ours is None or not theirs:
            continue
        rows.append(
            Row(
                task=env_id,
                algorithm=algorithm,
                metric=f"{metric} (median of the seeds)",
                better=better,
                ours=round(ours, 1),
                peer=peer,
                peer_value=round(theirs, 1),
                seeds=list(seeds),
                command=command_line(),
                note=note,
            )
        )
    return rows


ATARI_COST_CONFIGS = ("ppo/breakout", "ppo/pong")
ATARI_COST_STEPS = int(os.environ.get("PARL_BENCH_ATARI_COST_STEPS", "4096"))


def atari_cost_child(name: str, steps: int, seed: int) -> dict:
    """In a fresh process (`run_atari_cost`): PPO's rounds of `name` in single mode, the CPU
    seconds of collecting (the environments and acting) and of the updates, each summed."""
    import torch

    from parl_algos.train import get_spec, load_config
    from parl_algos.train._envs import make_collector, make_env_fn

    torch.set_num_threads(1)
    config = load_config(name)
    config.train.seed, config.train.total_steps = seed, steps
    spec = get_spec(config.algorithm)
    env = make_env_fn(config)()
    learner = spec.build(config, env.observation_space, env.action_space)
    env.close()
    collector = make_collector(config, spec, learner.agent)
    collect_cpu = learn_cpu = 0.0
    start = time.perf_counter()
    while collector.env_steps < steps:
        t0 = time.process_time()
        trajectory = collector.collect(config.agent.n_steps)
        t1 = time.process_time()
        if learner.before_learn is not None:
            learner.before_learn(collector.env_steps)
        learner.agent.learn(trajectory)
        learn_cpu += time.process_time() - t1
        collect_cpu += t1 - t0
    seconds = time.perf_counter() - start
    env_steps = collector.env_steps
    collector.close()
    return {"env_steps": env_steps, "collect_cpu": collect_cpu, "learn_cpu": learn_cpu,
            "seconds": seconds}  # fmt: skip


def run_atari_cost(seeds: Sequence[int], timeout: float, json_path: str | None = None) -> str:
    """What an agent step of PPO on Atari frames costs here, ours and SB3's (see the module's
    docstring): CPU milliseconds an agent step of collecting and of updating, one thread."""
    from parl_algos.train import load_config

    loads = [os.getloadavg()[0]]
    lines = [
        f"\nPPO on Atari frames, {ATARI_COST_STEPS:,} agent steps a run in one process and one "
        f"thread, seeds {','.join(map(str, seeds))} (medians): CPU ms an agent step\n",
        "| config | side | collecting (env + acting) | updating | update share | wall s |",
        "|---|---|---|---|---|---|",
    ]
    rows, everything = [], {}
    for name in ATARI_COST_CONFIGS:
        config = load_config(name)
        runs: dict[str, list[dict]] = {"ours": [], "sb3": []}
        for seed in seeds:
            code = (
                f"import json, sys; sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
                "import learning\n"
                f"print('RESULT', json.dumps(learning.atari_cost_child({name!r}, "
                f"{ATARI_COST_STEPS}, {seed})))\n"
            )
            out = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                check=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
            )  # fmt: skip
            runs["ours"].append(json.loads(out.stdout.split("RESULT ", 1)[1]))
            run = run_budget_sb3(name, seed, ATARI_COST_STEPS, timeout, eval_episodes=0)
            run["collect_cpu"] = run["rollout_cpu_seconds"]
            run["learn_cpu"] = run["cpu_seconds"] - run["rollout_cpu_seconds"]
            run["seconds"] = run["total_seconds"]
            runs["sb3"].append(run)
            loads.append(os.getloadavg()[0])
            print(f"{name} seed {seed}: ours {_cost(runs['ours'][-1])}, "
                  f"sb3 {_cost(runs['sb3'][-1])}", flush=True)  # fmt: skip
        everything[name] = runs
        per_step = {}
        for side, results in runs.items():
            collect = statistics.median(1000 * r["collect_cpu"] / r["env_steps"] for r in results)
            learn = statistics.median(1000 * r["learn_cpu"] / r["env_steps"] for r in results)
            wall = statistics.median(r["seconds"] for r in results)
            per_step[side] = (collect, learn)
            who = "parl-train" if side == "ours" else f"Stable-Baselines3 {SB3_VERSION}"
            lines.append(
                f"| `{name}` | {who} | {collect:.2f} | {learn:.2f} "
                f"| {learn / (collect + learn):.0%} | {wall:.0f} |"
            )
        load = f"load average {min(loads):.1f}-{max(loads):.1f} (1 minute, between runs)"
        for i, phase in enumerate(("collecting (environments and acting)", "updating")):
            rows.append(
                Row(
                    task=config.env.id, algorithm=f"PPO ({name}), Nature CNN",
                    metric=f"CPU ms an agent step of {phase}, one thread",
                    better="lower", ours=round(per_step["ours"][i], 3),
                    peer=f"Stable-Baselines3 {SB3_VERSION} PPO, CnnPolicy",
                    peer_value=round(per_step["sb3"][i], 3), seeds=list(seeds),
                    command=command_line(), note=f"{ATARI_COST_STEPS:,} agent steps a run; {load}",
                )
            )  # fmt: skip
    _dump(json_path, "atari-cost", everything)
    lines.append(f"\nresult rows: {record('learning', rows)}")
    return "\n".join(lines)


def _cost(run: dict) -> str:
    steps = run["env_steps"]
    collect, learn = (1000 * run[key] / steps for key in ("collect_cpu", "learn_cpu"))
    return f"collect {collect:.2f} ms, learn {learn:.2f} ms"


SECTIONS = {"offline": run_offline, "marl": run_marl}
SECTIONS |= {"hopper-time": run_mujoco, "roadrunner": run_atari, "apex-rate": run_apex_rate}
SECTIONS["atari-cost"] = run_atari_cost
SECTIONS |= {
    "mujoco": lambda seeds, timeout, json_path: run_budget("mujoco", seeds, timeout, json_path),
    "atari": lambda seeds, timeout, json_path: run_budget("atari", seeds, timeout, json_path),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tasks",
        default=",".join(TASKS),
        help="comma-separated: " + ", ".join([*TASKS, *SECTIONS]),
    )
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    parser.add_argument("--baseline", choices=["sb3"], help="also run Stable-Baselines3")
    parser.add_argument(
        "--via",
        choices=["example", "parl-train", "both"],
        default="example",
        help=f"run {', '.join(sorted(CONFIG_TASKS))} by their example scripts, their shipped "
        "configs, or both (side by side, seed by seed)",
    )
    parser.add_argument(
        "--marl-env",
        choices=MARL_ENVS,
        default="simple_spread",
        help="the MPE task of the marl section",
    )
    parser.add_argument(
        "--marl-algos",
        default="maddpg,mappo",
        help="the marl section's learners: maddpg (and independent DDPG), mappo (and "
        "independent PPO), comma-separated",
    )
    parser.add_argument(
        "--marl-steps", type=int, default=MARL_STEPS, help="the marl section's env steps"
    )
    parser.add_argument(
        "--marl-flags",
        default="",
        help="more flags for examples/mpe/train.py, in one string (e.g. '--num-envs 32')",
    )
    parser.add_argument(
        "--configs",
        help="the mujoco and atari sections: only these of their shipped configs, "
        "comma-separated (default: all of them)",
    )
    parser.add_argument("--json", help="write every run's numbers to this file")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.tasks.split(",")
    if args.configs:
        wanted = args.configs.split(",")
        known = sorted(c for group in BUDGET_CONFIGS.values() for c in group)
        unknown = [c for c in wanted if c not in known]
        if unknown:
            parser.error(
                f"--configs: {', '.join(unknown)} is not a config of the mujoco or atari "
                f"sections (those are {', '.join(known)})"
            )
        for group, configs in BUDGET_CONFIGS.items():
            BUDGET_CONFIGS[group] = [c for c in configs if c in wanted]
    for name in [n for n in names if n in SECTIONS]:
        if name == "marl":
            report = run_marl(
                seeds,
                args.timeout,
                args.json,
                env=args.marl_env,
                steps=args.marl_steps,
                algos=args.marl_algos.split(","),
                example_flags=shlex.split(args.marl_flags),
            )
            print(report, flush=True)
        else:
            print(SECTIONS[name](seeds, args.timeout, args.json), flush=True)
    tasks = [TASKS[name] for name in names if name not in SECTIONS]
    if not tasks:
        return

    results: dict[str, dict] = {}
    loads = [os.getloadavg()[0]]  # the 1-minute load average, before and after each run
    for task in tasks:
        via_config = args.via != "example" and task.algo in CONFIG_TASKS
        runners = [("parl", run_config if via_config else run_ours)]
        if via_config and args.via == "both":
            runners.append(("example", run_ours))
        if task.single is not None:
            runners.append(("single", run_single))
        elif args.baseline and task.algo in SB3_ALGOS:
            runners.append(("sb3", run_sb3))
        runs: dict[str, list] = {who: [] for who, _ in runners}
        for seed in seeds:  # seed by seed, so that both sides see the same load
            for who, runner in runners:
                run = runner(task, seed, args.timeout)
                loads.append(os.getloadavg()[0])
                shown = {key: value for key, value in run.items() if key != "curve"}
                print(f"{task.algo} {task.env_id} {who} seed {seed}: {shown}", flush=True)
                runs[who].append({"seed": seed, **run})
        results[task.algo] = {who: summarise(task, r) for who, r in runs.items()}

    print(f"\nmedian of seeds {args.seeds}: env steps until the mean return of the last 10 "
          "episodes first reaches the threshold, and wall seconds to get there; load average "
          f"{min(loads):.1f}-{max(loads):.1f} (1 minute, between runs)\n")  # fmt: skip
    alone = [task for task in tasks if task.single is None]
    if alone:
        header = "| task (threshold, cap) | PARL: steps / seconds |"
        rule = "|---|---|"
        columns = ["parl"]
        if args.via == "both":
            header = "| task (threshold, cap) | parl-train: steps / seconds |"
            header += " the example script: steps / seconds |"
            rule += "---|"
            columns.append("example")
        if args.baseline:
            header += " SB3 2.9.2: steps / seconds |"
            rule += "---|"
            columns.append("sb3")
        print(header)
        print(rule)
        for task in alone:
            row = f"| {_name(task)} |"
            for who in columns:
                summary = results[task.algo].get(who)
                row += f" {cell(summary, task, len(seeds)) if summary else 'no peer'} |"
            print(row)
    parallel = [task for task in tasks if task.single is not None]
    if parallel:
        print(
            "\n| task (threshold, cap) | 2 remote actors: steps / seconds (whole command) "
            "| examples/a2c in one process: steps / seconds (whole command) | its flags |"
        )
        print("|---|---|---|---|")
        for task in parallel:
            row = f"| {_name(task)} |"
            for who in ["parl", "single"]:
                summary = results[task.algo][who]
                command = summary["median_command_seconds"]
                row += f" {cell(summary, task, len(seeds))} ({command:.1f} s) |"
            print(row + f" {' '.join(task.single) or 'defaults'} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    path = record_rows(tasks, results, seeds, f"load average {min(loads):.1f}-{max(loads):.1f}")
    if path:
        print(f"\nresult rows: {path}")


ALGORITHM_NAMES = {"qrdqn": "QR-DQN", "rainbow": "Rainbow", "duelingdqn": "Dueling DQN"}


def algorithm_name(algo: str) -> str:
    """How result rows name an algorithm: `qrdqn` -> `QR-DQN`, `ppo` -> `PPO`."""
    return ALGORITHM_NAMES.get(algo, algo.upper())


def record_rows(tasks: list[Task], results: dict, seeds: list[int], load: str) -> str | None:
    """Write each task's median against its peer's (SB3, or one process) as result rows."""
    rows = []
    for task in tasks:
        summaries = results[task.algo]
        peer_key = "single" if task.single is not None else "sb3"
        if peer_key not in summaries:
            continue
        ours, peer = summaries["parl"], summaries[peer_key]
        name = algorithm_name(task.algo.removesuffix("_parallel"))
        if task.single is not None:
            algorithm = f"{name} on 2 remote actors"
            peer_name = f"examples/a2c in one process ({' '.join(task.single) or 'defaults'})"
            metric, key = f"seconds of training to a training mean of {task.threshold:g}", "seconds"
        else:
            algorithm = name
            peer_name = f"Stable-Baselines3 {SB3_VERSION} {name}"
            if task.algo == "qrdqn":
                peer_name = f"sb3-contrib {SB3_VERSION} QR-DQN"
            metric = f"env steps to a training mean of {task.threshold:g} (median of the seeds)"
            key = "steps"
        missed = f"; missed within {task.cap} env steps: ours {ours['missed']}, peer "
        rows.append(
            Row(
                task=task.env_id,
                algorithm=algorithm,
                metric=metric,
                better="lower",
                ours=ours[f"median_{key}"],
                peer=peer_name,
                peer_value=peer[f"median_{key}"],
                seeds=seeds,
                command=command_line(),
                curves=curves_on_a_grid({"ours": ours["runs"], "peer": peer["runs"]}),
                note=f"Medians: {cell(ours, task, len(seeds))} against "
                f"{cell(peer, task, len(seeds))} (env steps / seconds); {load}"
                + (missed + str(peer["missed"]) if ours["missed"] or peer["missed"] else ""),
            )
        )
    return record("learning", rows)


if __name__ == "__main__":
    main()

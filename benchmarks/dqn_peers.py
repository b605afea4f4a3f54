"""The DQN family through `parl-train` beside its peers, and what memory and actors buy.

Four sections, each a table; every run is a `parl-train` command (or a peer's) in a fresh
process with one torch thread, seed by seed so that both sides of a row see the same load.

`peers`: the shipped configs `dqn/<env>` and `qrdqn/<env>` on CartPole-v1 (QR-DQN only: the
light schedule), Acrobot-v1 and LunarLander-v3 (box2d) against Stable-Baselines3's DQN and
sb3-contrib's QR-DQN given the same hyperparameters (read from the config: layers, learning
rate, batch, replay size, warm-up, updates per step, target period, epsilon schedule,
quantiles, Adam's epsilon and the gradient clip, where sb3-contrib's QR-DQN would otherwise
take 0.01 / batch_size and no clipping). Each run stops when the mean return of the last 10
training episodes first reaches the config's `target_return` (or `--threshold`, for both
sides), or at its `total_steps` (the cap, which the epsilon schedule of both sides is a
fraction of). The table gives the median over the seeds of the env steps and seconds of
training to the threshold (a miss counts as the cap and its full time, and says so). The
configs' DQN uses the plain target, as SB3's does; SB3 decays epsilon from step 0, PARL from
the end of the warm-up (`learning_starts`, 0 in the Acrobot and LunarLander configs).

`tianshou`: the shipped `c51/<env>` and `rainbow/<env>` configs (CartPole-v1, Acrobot-v1,
LunarLander-v3) against Tianshou's C51 and Rainbow (`benchmarks/tianshou_runner.py`, which says
where Tianshou's algorithms differ by design) given the same hyperparameters and the same
schedule, to the config's threshold within its cap, as `peers` does. Tianshou's collector acts
without the noise of noisy layers, so its Rainbow gets the config's epsilon schedule;
`--noise-only` gives it PARL's epsilon 0 instead, and `--noisy-epsilon` gives PARL's Rainbow
the config's epsilon schedule besides its noise (`--agent.noisy_epsilon true`). Tianshou's
C51 and Rainbow prioritize replay by the cross-entropy of the target distribution and the
prediction; `--ours '--agent.c51_priority cross_entropy'` gives PARL's the same (any
`parl-train` flags for our side go in `--ours`). Tianshou 2.0.1's C51 and Rainbow take the
target distribution of the state one step on even with n-step returns (the Rainbow configs'
`n_step = 3`), where the Rainbow paper and PARL take that of the state n steps on, which the
returns lead to; `--bootstrap-after-n` gives Tianshou's the paper's bootstrap
(`tianshou_runner.py`). `--only ours` or `--only peer` runs one side of each row.

`masked`: CartPole-v1 with the velocities masked out (`CartPoleNoVelocity-v1`), where a
feed-forward Q-network has no way to know which way the pole moves: `parl-train
r2d2/cartpole-masked --mode async` (2 actors) against plain DQN (the `dqn/cartpole` config on
the light schedule of the QR-DQN config, feed-forward) with R2D2's budget and threshold (100).
Besides the steps to 100, it reports each seed's mean return of its last 10 training episodes
(at the threshold, or at the end of the budget).

`apex`: Ape-X (`duelingdqn/cartpole` with 3-step returns and prioritized replay, in `async`
mode: 2 actors with their own epsilons) against the same learner in one process (`single`),
both on the light schedule, for the same budget and past the threshold: env steps per second
of training, the seconds of training until the mean return first reaches the threshold, and
the whole command's seconds (the actors' start included).

    nice python benchmarks/dqn_peers.py peers --seeds 1,2,3
    nice python benchmarks/dqn_peers.py peers --envs acrobot --algos qrdqn --seeds 1
    nice python benchmarks/dqn_peers.py peers --envs lunarlander --algos dqn --threshold 100
    nice python benchmarks/dqn_peers.py masked apex --seeds 1
    nice python benchmarks/dqn_peers.py peers --sb3-python /path/to/venv/bin/python
    nice python benchmarks/dqn_peers.py tianshou --algos c51,rainbow --seeds 1,2,3
    nice python benchmarks/dqn_peers.py tianshou --envs acrobot --algos c51 --seeds 1
    nice python benchmarks/dqn_peers.py tianshou --algos rainbow --noise-only --seeds 1
    nice python benchmarks/dqn_peers.py tianshou --envs lunarlander --algos rainbow --noisy-epsilon
    nice python benchmarks/dqn_peers.py tianshou --algos rainbow --ours '--agent.c51_priority ...'
    nice python benchmarks/dqn_peers.py tianshou --algos rainbow --bootstrap-after-n --only peer
    nice python benchmarks/dqn_peers.py tianshou --envs lunarlander --seeds 1,2,3,4 --jobs 2

The peers run in virtual environments of their own, never dependencies of this repository:
SB3 through `benchmarks/sb3_runner.py` (`--sb3-python`, or the venv `benchmarks/learning.py`
makes under `.benchmarks/`, git-ignored, to which this script adds `gymnasium[box2d]`),
Tianshou through `benchmarks/tianshou_runner.py` (`--tianshou-python`, or a venv this script
makes under `.benchmarks/` with Tianshou, the repository's pinned torch and box2d). Each table's
heading gives the load average when the section started and ended.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import venv
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import Row, command_line, record
from learning import (
    REPO,
    SB3_RUNNER,
    SB3_VERSION,
    algorithm_name,
    curves_on_a_grid,
    ensure_sb3,
    run_parl_train,
)

TIANSHOU_VERSION = "2.0.1"
TIANSHOU_VENV = os.path.join(REPO, ".benchmarks", f"tianshou-{TIANSHOU_VERSION}")
TIANSHOU_RUNNER = os.path.join(REPO, "benchmarks", "tianshou_runner.py")
TIANSHOU_ENVS = {
    "cartpole": ("c51", "rainbow"),
    "acrobot": ("c51", "rainbow"),
    "lunarlander": ("c51", "rainbow"),
}

ENVS = {"cartpole": ("qrdqn",), "acrobot": ("dqn", "qrdqn"), "lunarlander": ("dqn", "qrdqn")}
# The light schedule of the QR-DQN and Rainbow configs: 64-unit layers, 16 updates every 64
# env steps after 500.
LIGHT = ["--agent.hidden_size", "64", "--agent.learning_starts", "500"]
LIGHT += ["--agent.train_freq", "64", "--agent.gradient_steps", "16"]
LIGHT += ["--agent.exploration_fraction", "0.16", "--agent.eps_end", "0.04"]
APEX = ["--agent.n_step", "3", "--agent.prioritized", "true", *LIGHT]
APEX_CONFIG = "duelingdqn/cartpole"
APEX_THRESHOLD = 150.0
APEX_STEPS = int(os.environ.get("PARL_BENCH_APEX_STEPS", "30000"))
MASKED_STEPS = 60_000
MASKED_THRESHOLD = 100.0


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def sb3_python(python: str | None) -> str:
    """The peers' python: `python` if given, else learning.py's SB3 venv, with box2d added."""
    if python:
        return python
    python = ensure_sb3()
    if subprocess.run([python, "-c", "import Box2D"], capture_output=True).returncode != 0:
        constraints = os.path.join(REPO, "constraints.txt")
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "-c", constraints, "gymnasium[box2d]"],
            check=True,
        )
    return python


def tianshou_python(python: str | None) -> str:
    """The Tianshou peer's python: `python` if given, else a venv made once under .benchmarks/."""
    if python:
        return python
    python = os.path.join(TIANSHOU_VENV, "bin", "python")
    marker = os.path.join(TIANSHOU_VENV, ".installed")
    if not os.path.exists(marker) or pathlib.Path(marker).read_text() != TIANSHOU_VERSION:
        print(f"installing tianshou=={TIANSHOU_VERSION} into {TIANSHOU_VENV} ...", flush=True)
        venv.create(TIANSHOU_VENV, with_pip=True, clear=True)
        constraints = os.path.join(REPO, "constraints.txt")
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "-c", constraints,
             f"tianshou=={TIANSHOU_VERSION}", "torch", "gymnasium[box2d]"],
            check=True,
        )  # fmt: skip
        pathlib.Path(marker).write_text(TIANSHOU_VERSION)
    return python


def to_threshold(threshold: float, cap: int, seed: int) -> list[str]:
    return [
        "--train.seed", str(seed), "--train.total_steps", str(cap),
        "--train.target_return", str(threshold), "--train.stop_at_target", "true",
        "--train.eval_every", "0", "--train.checkpoint_every", str(cap),
    ]  # fmt: skip


def run_to_threshold(config: str, flags: Sequence[str], timeout: float) -> dict:
    """`run_parl_train` (with its curve), its `seconds` those to the threshold where it was
    reached."""
    run = run_parl_train(config, flags, timeout, curve=True)
    run["seconds"] = run["reached_seconds"] or run["seconds"]
    return run


def run_peer(
    config_name: str,
    seed: int,
    python: str,
    timeout: float,
    runner: str = SB3_RUNNER,
    threshold: float | None = None,
    **extra: object,
) -> dict:
    """`runner` with the config's hyperparameters, in `python`'s venv: sb3_runner.py (SB3's
    DQN or sb3-contrib's QR-DQN) or tianshou_runner.py (Tianshou's C51 or Rainbow), to
    `threshold` (default: the config's `target_return`); `extra` joins the runner's spec."""
    from parl_algos.train import load_config

    config = load_config(config_name)
    args = {**dataclasses.asdict(config.agent), "env_id": config.env.id, "torch_threads": 1}
    spec = {
        "algo": config.algorithm.lower(),
        "threshold": config.train.target_return if threshold is None else threshold,
        "cap": config.train.total_steps,
        "seed": seed,
        "args": args,
        **extra,
    }
    out = subprocess.run(
        [python, runner, json.dumps(spec)],
        capture_output=True, text=True, timeout=timeout, check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    line = next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[7:])


def _steps_cell(runs: list[dict], cap: int) -> str:
    if not runs:
        return "(not run)"
    steps = [r["reached_at"] if r["reached_at"] is not None else cap for r in runs]
    seconds = [r["seconds"] for r in runs]
    missed = sum(r["reached_at"] is None for r in runs)
    median = statistics.median(steps)
    text = f">{cap // 1000}k" if missed > len(runs) // 2 else f"{median / 1000:.1f}k"
    text += f" / {statistics.median(seconds):.1f} s"
    text += f" ({', '.join(f'{s / 1000:.1f}k' for s in steps)})"
    return text + (f", {missed}/{len(runs)} missed" if missed else "")


def _peer_row(
    name: str,
    peer: str,
    python: str,
    runner: str,
    args: argparse.Namespace,
    ours_flags: Sequence[str] = (),
    peer_name: str = "",
    **extra: object,
) -> str:
    """One table row: config `name` through `parl-train` (with `ours_flags`) and through
    `runner` (its spec with `extra`), seed by seed."""
    from parl_algos.train import load_config

    config = load_config(name)
    cap = config.train.total_steps
    threshold = config.train.target_return if args.threshold is None else args.threshold

    def ours_run(seed: int) -> dict:
        flags = [*to_threshold(threshold, cap, seed), *ours_flags]
        run = run_to_threshold(name, flags, args.timeout)
        print(f"{name} parl seed {seed}: {_shown(run)}", flush=True)
        return run

    def peer_run(seed: int) -> dict:
        run = run_peer(name, seed, python, args.timeout, runner, threshold, **extra)
        print(f"{name} {peer} seed {seed}: {_shown(run)}", flush=True)
        return run

    # Seed by seed, ours then the peer's; with --jobs N, N of these runs side by side.
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        ours_futures, peer_futures = [], []
        for seed in args.seeds:
            if args.only != "peer":
                ours_futures.append(pool.submit(ours_run, seed))
            if args.only != "ours":
                peer_futures.append(pool.submit(peer_run, seed))
        ours = [future.result() for future in ours_futures]
        peers = [future.result() for future in peer_futures]
    if ours and peers:  # a result row, under the peer's full name and version
        _record(name, config.env.id, threshold, cap, ours, peers, peer_name or peer, args)
    return (
        f"| `{name}` ({config.env.id}, ≥ {threshold:g}, cap {cap // 1000}k) "
        f"| {_steps_cell(ours, cap)} | {peer}: {_steps_cell(peers, cap)} |"
    )


def _shown(run: dict) -> dict:
    """A run's figures as printed: without its curve."""
    return {key: value for key, value in run.items() if key != "curve"}


def _record(
    name: str,
    env_id: str,
    threshold: float,
    cap: int,
    ours: list[dict],
    peers: list[dict],
    peer: str,
    args: argparse.Namespace,
) -> None:
    """A result row of the learning file: the medians of env steps to the threshold."""

    def median_steps(runs: list[dict]) -> float:
        return statistics.median(
            r["reached_at"] if r["reached_at"] is not None else cap for r in runs
        )

    row = Row(
        task=env_id,
        algorithm=algorithm_name(name.split("/")[0]),
        metric=f"env steps to a training mean of {threshold:g} (median of the seeds)",
        better="lower",
        ours=median_steps(ours),
        peer=peer,
        peer_value=median_steps(peers),
        seeds=list(args.seeds),
        command=command_line(),
        note=f"parl-train {name}: {_steps_cell(ours, cap)}; the peer: {_steps_cell(peers, cap)}; "
        f"load average {load()} at the end"
        + (f", {args.jobs} runs side by side." if args.jobs > 1 else "."),
        curves=curves_on_a_grid({"ours": ours, "peer": peers}),
    )
    record("learning", [row])


def _peer_table(peer: str, start: str, lines: list[str], args: argparse.Namespace) -> str:
    head = [
        f"\nenv steps / seconds of training to the threshold, median of seeds "
        f"{','.join(map(str, args.seeds))} (each seed's steps); load average {start} -> {load()}\n",
        f"| config | parl-train | peer ({peer}), same hyperparameters |",
        "|---|---|---|",
    ]
    return "\n".join(head + lines)


def run_peers(args: argparse.Namespace) -> str:
    python = sb3_python(args.sb3_python)
    lines, start = [], load()
    for env in args.envs.split(","):
        for algo in [a for a in ENVS[env] if a in args.algos.split(",")]:
            peer = "sb3-contrib QR-DQN" if algo == "qrdqn" else "SB3 DQN"
            full = f"sb3-contrib {SB3_VERSION} QR-DQN" if algo == "qrdqn" else ""
            full = full or f"Stable-Baselines3 {SB3_VERSION} DQN"
            row = _peer_row(f"{algo}/{env}", peer, python, SB3_RUNNER, args, (), full)
            lines.append(row)
    return _peer_table(f"SB3 {SB3_VERSION}", start, lines, args)


def run_tianshou(args: argparse.Namespace) -> str:
    python = tianshou_python(args.tianshou_python)
    lines, start = [], load()
    for env in [e for e in args.envs.split(",") if e in TIANSHOU_ENVS]:
        for algo in [a for a in TIANSHOU_ENVS[env] if a in args.algos.split(",")]:
            peer, extra, ours = "Tianshou C51", {}, shlex.split(args.ours)
            if algo == "rainbow":
                peer, extra = "Tianshou Rainbow", {"noise_only": args.noise_only}
                peer += " (epsilon 0, noise only)" if args.noise_only else " (epsilon schedule)"
                ours += ["--agent.noisy_epsilon", "true"] if args.noisy_epsilon else []
            if args.bootstrap_after_n:
                extra["bootstrap_after_n"] = True
                peer += ", bootstrapping after n steps"
            name = f"{algo}/{env}"
            full = f"Tianshou {TIANSHOU_VERSION} {peer.removeprefix('Tianshou ')}"
            row = _peer_row(name, peer, python, TIANSHOU_RUNNER, args, ours, full, **extra)
            if ours:
                row = row.replace(f"`{name}`", f"`{name} {' '.join(ours)}`", 1)
            lines.append(row)
    return _peer_table(f"Tianshou {TIANSHOU_VERSION}", start, lines, args)


def _final(runs: list[dict]) -> str:
    return ", ".join(
        f"{r['final_mean_return']:.1f}" if r["final_mean_return"] is not None else "-" for r in runs
    )


def run_masked(args: argparse.Namespace) -> str:
    start = load()
    runs: dict[str, list[dict]] = {"r2d2": [], "dqn": []}
    for seed in args.seeds:
        flags = to_threshold(MASKED_THRESHOLD, MASKED_STEPS, seed)
        r2d2 = [*flags, "--mode", "async", "--actors", "2"]
        runs["r2d2"].append(run_to_threshold("r2d2/cartpole-masked", r2d2, args.timeout))
        print(f"masked r2d2 seed {seed}: {runs['r2d2'][-1]}", flush=True)
        dqn = [*flags, "--env.id", "CartPoleNoVelocity-v1", *LIGHT]
        runs["dqn"].append(run_to_threshold("dqn/cartpole", dqn, args.timeout))
        print(f"masked dqn seed {seed}: {runs['dqn'][-1]}", flush=True)
    names = {
        "r2d2": "`r2d2/cartpole-masked --mode async`, 2 actors (LSTM)",
        "dqn": "`dqn/cartpole --env.id CartPoleNoVelocity-v1`, light schedule (feed-forward)",
    }
    lines = [
        f"\nCartPoleNoVelocity-v1, ≥ {MASKED_THRESHOLD:g} within {MASKED_STEPS // 1000}k env "
        f"steps, seeds {','.join(map(str, args.seeds))}; load average {start} -> {load()}\n",
        "| run | steps / seconds to the threshold (each seed) | mean of the last 10 episodes |",
        "|---|---|---|",
    ]
    for who, results in runs.items():
        lines.append(f"| {names[who]} | {_steps_cell(results, MASKED_STEPS)} | {_final(results)} |")
    return "\n".join(lines)


def run_apex(args: argparse.Namespace) -> str:
    start = load()
    runs: dict[str, list[dict]] = {"single": [], "async": []}
    for seed in args.seeds:
        for mode in runs:
            flags = to_threshold(APEX_THRESHOLD, APEX_STEPS, seed)
            flags = [*flags, "--train.stop_at_target", "false", "--mode", mode, *APEX]
            if mode == "async":
                flags += ["--actors", "2"]
            runs[mode].append(run_parl_train(APEX_CONFIG, flags, args.timeout))
            print(f"apex {mode} seed {seed}: {runs[mode][-1]}", flush=True)
    single = statistics.median(r["env_steps"] / r["seconds"] for r in runs["single"])
    lines = [
        f"\nApe-X vs one process: `{APEX_CONFIG}` with {' '.join(APEX[:4])} and the light "
        f"schedule, {APEX_STEPS // 1000}k env steps, seeds {','.join(map(str, args.seeds))} "
        f"(medians); load average {start} -> {load()}\n",
        f"| run | env steps / s of training (x single) | seconds of training to "
        f"{APEX_THRESHOLD:g} (env steps) | final mean return | whole command, s |",
        "|---|---|---|---|---|",
    ]
    names = {"single": "`--mode single`", "async": "`--mode async --actors 2` (Ape-X)"}
    for mode, results in runs.items():
        rate = statistics.median(r["env_steps"] / r["seconds"] for r in results)
        reached = [r for r in results if r["reached_at"] is not None]
        cell = "missed"
        if reached:
            seconds = statistics.median(r["reached_seconds"] for r in reached)
            steps = statistics.median(r["reached_at"] for r in reached)
            cell = f"{seconds:.1f} ({steps / 1000:.1f}k)"
            if len(reached) < len(results):
                cell += f", {len(results) - len(reached)} missed"
        final = [r["final_mean_return"] for r in results if r["final_mean_return"] is not None]
        final_cell = f"{statistics.median(final):.1f}" if final else "-"
        command = statistics.median(r["command_seconds"] for r in results)
        lines.append(
            f"| {names[mode]} | {rate:.0f} ({rate / single:.2f}x) | {cell} | {final_cell} "
            f"| {command:.1f} |"
        )
    _record_apex(runs, args, f"{start} -> {load()}")
    return "\n".join(lines)


def _record_apex(runs: dict[str, list[dict]], args: argparse.Namespace, loads: str) -> None:
    """Ape-X's result row: its env steps a second against one process's, each seed's figures."""

    def seeds(results: list[dict]) -> str:
        return "; ".join(
            f"seed {seed}: {r['env_steps'] / r['seconds']:.0f} steps/s, "
            + (
                f"{APEX_THRESHOLD:g} at {r['reached_at'] / 1000:.1f}k steps "
                f"({r['reached_seconds']:.1f} s)"
                if r["reached_at"] is not None
                else f"{APEX_THRESHOLD:g} missed"
            )
            + f", final mean {_final([r])}, command {r['command_seconds']:.1f} s"
            for seed, r in zip(args.seeds, results, strict=True)
        )

    def rate(results: list[dict]) -> float:
        return statistics.median(r["env_steps"] / r["seconds"] for r in results)

    row = Row(
        task="CartPole-v1",
        algorithm="Ape-X (`duelingdqn/cartpole --mode async --actors 2`)",
        metric=f"env steps per second of training over {APEX_STEPS // 1000}k env steps "
        "(median of the seeds)",
        better="higher",
        ours=rate(runs["async"]),
        peer="the same learner in one process (`--mode single`)",
        peer_value=rate(runs["single"]),
        seeds=list(args.seeds),
        command=command_line(),
        note=f"{' '.join(APEX[:4])} on the light schedule. Ape-X: {seeds(runs['async'])}. "
        f"One process: {seeds(runs['single'])}. Load average {loads}.",
    )
    record("learning", [row])


SECTIONS = {"peers": run_peers, "tianshou": run_tianshou, "masked": run_masked, "apex": run_apex}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sections", nargs="+", choices=list(SECTIONS))
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="peers and tianshou: runs side by side (env steps to the threshold do not depend "
        "on it; seconds do: compare seconds only between tables of the same --jobs)",
    )
    parser.add_argument(
        "--envs",
        default=",".join(ENVS),
        help="peers and tianshou: comma-separated envs (tianshou: cartpole, acrobot, lunarlander)",
    )
    parser.add_argument(
        "--algos",
        default="dqn,qrdqn,c51,rainbow",
        help="peers (dqn, qrdqn) and tianshou (c51, rainbow): comma-separated algorithms",
    )
    parser.add_argument("--sb3-python", help="peers: the python of a venv with SB3 installed")
    parser.add_argument("--tianshou-python", help="tianshou: the python of a venv with Tianshou")
    parser.add_argument(
        "--noise-only",
        action="store_true",
        help="tianshou: Tianshou's Rainbow with epsilon 0 after the warm-up, as PARL's (its "
        "collector acts without the noise; by default it gets the config's epsilon schedule)",
    )
    parser.add_argument(
        "--noisy-epsilon",
        action="store_true",
        help="tianshou: PARL's Rainbow with the config's epsilon schedule besides its noise "
        "(--agent.noisy_epsilon true), as Tianshou's acts by default",
    )
    parser.add_argument(
        "--bootstrap-after-n",
        action="store_true",
        help="tianshou: Tianshou's C51/Rainbow take the target distribution of the state n "
        "steps on (the Rainbow paper's, PARL's) instead of one step on (Tianshou 2.0.1's)",
    )
    parser.add_argument(
        "--only",
        choices=["ours", "peer"],
        help="peers and tianshou: run one side of each row only",
    )
    parser.add_argument(
        "--ours",
        default="",
        help="tianshou: more parl-train flags for our side, in one string "
        "(e.g. '--agent.c51_priority cross_entropy')",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        help="peers and tianshou: the mean return both sides run to, instead of each config's "
        "`target_return`",
    )
    parser.add_argument("--json", help="write every table to this file too")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    args = parser.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 or more runs side by side")
    tables = {}
    for name in args.sections:
        tables[name] = SECTIONS[name](args)
        print(tables[name], flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(tables, indent=2))


if __name__ == "__main__":
    main()

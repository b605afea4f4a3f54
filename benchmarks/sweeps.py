"""Sweeps and population-based training of `parl-train` on PPO CartPole, against plain search.

Three measurements, in one run, each against its baseline measured in the same run:

- `sweep`: a sweep of `ppo/cartpole` (`--trials` trials, 50k env steps a trial, one seed,
  the space below with TPE and the median pruner) with `--parallel 2` on the embedded cluster,
  against the same trials (their parameters enqueued in a study of their own) run one by one
  without pruning: the ratio of their wall times (the target: at most 0.5x).
- `best`: the best trial's config, trained on `--check-seeds` fresh seeds (101, 102, ...) to a
  mean return of 475 over the last 10 training episodes (at most 100k env steps, stopping
  there), against the shipped config on the same seeds: the median env steps to 475 (a run
  that never reaches it counts its budget).
- `pbt`: population-based training of 4 members (`--pbt-interval`, the lr, clip range and
  epochs explored; `agent.n_steps` shapes the rollouts and is not explored), stopping once a
  member reaches 475, against a 4-trial random sweep of the same space and budget (4 trials
  side by side, as the members are): the PBT command's wall seconds (start-up, copies and
  restarts included, to the end of the interval in which a member reached 475, where it
  stops) against the median trial's training seconds to 475 (from its progress.csv rows);
  where the median trial never reaches 475 within its budget, against the random sweep
  command's whole wall seconds (by then it had not: a bound from below).

Every run goes through the real `parl-train` command (the sweep's baseline through the same
`sweep` function, in this process), niced like the caller. Prints the tables and the load
average before and after; the figures go to the result file `sweeps`
(`benchmarks/results/sweeps.json`, see `_results.py`).

    nice python benchmarks/sweeps.py                         # 20-40 minutes on 2 busy cores
    nice python benchmarks/sweeps.py --trials 2 --steps 5000 --check-seeds 1 --check-budget 5000 \
        --pbt-interval 1000 --quick                          # a few minutes: that it runs
    nice python benchmarks/sweeps.py --sections pbt

`--quick` writes no result rows (a check that the script runs).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _results import Row, command_line, record

SWEEP_SPACE = """
[space]
"agent.lr" = { log_uniform = [1e-5, 1e-2] }
"agent.n_steps" = { choice = [16, 32, 64] }
"agent.clip_coef" = { uniform = [0.1, 0.3] }
"agent.update_epochs" = { int = [4, 20] }
[sweep]
objective = "final"
sampler = "tpe"
pruner = "median"
"""

PBT_SPACE = """
[space]
"agent.lr" = { log_uniform = [1e-5, 1e-2] }
"agent.clip_coef" = { uniform = [0.1, 0.3] }
"agent.update_epochs" = { int = [4, 20] }
"""

RANDOM_SPACE = PBT_SPACE + '[sweep]\nobjective = "final"\nsampler = "random"\npruner = "none"\n'
TARGET = 475.0
PARL_TRAIN = str(Path(sys.executable).with_name("parl-train"))
QUIET = ["--no-progress", "--train.eval_every", "0"]


def _parl_train(*args: str, log: Path) -> float:
    """Run `parl-train ARGS` (its output to `log`); its wall seconds. Raises if it fails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.run([PARL_TRAIN, *args], stdout=out, stderr=subprocess.STDOUT, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8")[-2000:]
        raise RuntimeError(f"parl-train {' '.join(args)} failed ({proc.returncode}):\n{tail}")
    return seconds


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _reached(run_dir: Path, column: str) -> float:
    """The `column` (env_step or seconds) of the first row at the target (inf: none)."""
    for row in _rows(run_dir / "progress.csv"):
        if row["mean_return"] and float(row["mean_return"]) >= TARGET:
            return float(row[column])
    return math.inf


def _baseline(sweep_dir: Path, base_dir: Path, steps: int) -> float:
    """The sweep's trials again, one at a time, unpruned, in this process; wall seconds."""
    import optuna

    from parl_algos.train import get_spec, load_config
    from parl_algos.train._sweep import read_space, sweep

    space_path = base_dir.parent / "baseline-space.toml"
    space_path.write_text(SWEEP_SPACE.replace('pruner = "median"', 'pruner = "none"'))
    config = load_config("ppo/cartpole")
    config.train.total_steps = steps
    config.train.eval_every = 0
    config.train.progress = False
    space = read_space(str(space_path), config)
    trials = _rows(sweep_dir / "trials.csv")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{base_dir / 'study.db'}"
    base_dir.mkdir(parents=True)
    study = optuna.create_study(study_name=str(base_dir), storage=url, direction="maximize")
    keys = [p.key for p in space.params]
    for t in trials:
        study.enqueue_trial({k: _value(t[k]) for k in keys})
    start = time.perf_counter()
    sweep(
        config,
        get_spec("PPO"),
        space,
        trials=len(trials),
        parallel=1,
        sweep_dir=str(base_dir),
        out=lambda line: None,
    )
    return time.perf_counter() - start


def _value(text: str) -> float | int:
    number = float(text)
    return int(number) if re.fullmatch(r"-?\d+", text) else number


def _ratio(ours: float, peer: float) -> str:
    return f"{ours / peer:5.2f}x" if math.isfinite(ours) and math.isfinite(peer) else "    -"


def _command() -> str:
    """The command line without `--keep DIR` (where it kept its runs is no part of it)."""
    words = command_line().split(" ")
    while "--keep" in words:
        i = words.index("--keep")
        del words[i : i + 2]
    return " ".join(words)


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="sweep,best,pbt", help="which to measure")
    parser.add_argument("--trials", type=int, default=16, help="trials of the sweep")
    parser.add_argument("--steps", type=int, default=50_000, help="env steps a trial, a member")
    parser.add_argument("--check-seeds", type=int, default=3, help="fresh seeds of `best`")
    parser.add_argument("--check-budget", type=int, default=100_000, help="env steps of `best`")
    parser.add_argument("--pbt-interval", type=int, default=5_000, help="env steps")
    parser.add_argument("--quick", action="store_true", help="write no result rows")
    parser.add_argument("--keep", metavar="DIR", help="keep the run directories in DIR")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    root = Path(args.keep or tempfile.mkdtemp(prefix="parl-sweeps-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    (root / "space.toml").write_text(SWEEP_SPACE)
    (root / "pbt.toml").write_text(PBT_SPACE)
    (root / "random.toml").write_text(RANDOM_SPACE)
    budget = ["--train.total_steps", str(args.steps)]
    load_before = os.getloadavg()
    rows: list[Row] = []
    lines: list[str] = []
    sweep_dir = root / "sweep"
    if sections & {"sweep", "best"}:
        parallel = _parl_train(
            "ppo/cartpole",
            "--sweep",
            str(root / "space.toml"),
            "--trials",
            str(args.trials),
            "--parallel",
            "2",
            *budget,
            *QUIET,
            "--logdir",
            str(sweep_dir),
            log=root / "sweep.log",
        )
        trials = _rows(sweep_dir / "trials.csv")
        pruned = sum(t["state"] == "PRUNED" for t in trials)
        print(f"sweep: {len(trials)} trials, {pruned} pruned, --parallel 2: {parallel:.0f} s")
    if "sweep" in sections:
        one_by_one = _baseline(sweep_dir, root / "baseline", args.steps)
        print(f"sweep: the same trials one by one, unpruned: {one_by_one:.0f} s")
        lines.append(
            f"sweep of {args.trials} trials (--parallel 2, median pruner, {pruned} pruned)    "
            f"{parallel:8.0f} s  vs one by one unpruned {one_by_one:8.0f} s  "
            f"{parallel / one_by_one:5.2f}x"
        )
        rows.append(
            Row(
                task=f"CartPole-v1, {args.trials} trials of {args.steps // 1000}k env steps",
                algorithm="PPO sweep: --parallel 2, TPE, median pruner",
                metric="wall seconds of the sweep",
                better="lower",
                ours=round(parallel, 1),
                peer="the same trials one by one, unpruned",
                peer_value=round(one_by_one, 1),
                seeds=[],
                command=_command(),
                note=f"{pruned} of {len(trials)} trials pruned",
            )
        )
    if "best" in sections:
        best_toml = sweep_dir / "best.toml"
        seeds = [101 + i for i in range(args.check_seeds)]
        runs = {
            (name, seed): root / f"check-{name}-{seed}"
            for name in ("best", "shipped")
            for seed in seeds
        }

        def check(key: tuple[str, int]) -> float:
            name, seed = key
            config = str(best_toml) if name == "best" else "ppo/cartpole"
            _parl_train(
                config,
                "--train.seed",
                str(seed),
                "--train.total_steps",
                str(args.check_budget),
                "--train.stop_at_target",
                "true",
                "--train.target_return",
                str(TARGET),
                *QUIET,
                "--logdir",
                str(runs[key]),
                log=root / f"check-{name}-{seed}.log",
            )
            reached = _reached(runs[key], "env_step")
            return float(args.check_budget) if math.isinf(reached) else reached

        with ThreadPoolExecutor(2) as pool:  # env steps do not depend on the load
            steps = dict(zip(runs, pool.map(check, runs), strict=True))
        best = _median([steps["best", s] for s in seeds])
        shipped = _median([steps["shipped", s] for s in seeds])
        each = ", ".join(f"{steps['best', s]:.0f}/{steps['shipped', s]:.0f}" for s in seeds)
        print(f"best: env steps to {TARGET:g}, best/shipped by seed: {each}")
        lines.append(
            f"best trial's config, env steps to {TARGET:g} (median of {len(seeds)} seeds)  "
            f"{best:8.0f}    vs shipped config {shipped:8.0f}    {best / shipped:5.2f}x"
        )
        rows.append(
            Row(
                task="CartPole-v1, fresh seeds",
                algorithm=f"PPO, the best config of a {args.trials}-trial sweep",
                metric=f"env steps to a training mean return of {TARGET:g} (median)",
                better="lower",
                ours=best,
                peer="the shipped ppo/cartpole config",
                peer_value=shipped,
                seeds=seeds,
                command=_command(),
                note=f"by seed (best/shipped): {each}",
            )
        )
    if "pbt" in sections:
        pbt_dir = root / "pbt"
        pbt_wall = _parl_train(
            "ppo/cartpole",
            "--pbt",
            str(root / "pbt.toml"),
            "--population",
            "4",
            "--pbt-interval",
            str(args.pbt_interval),
            *budget,
            "--train.stop_at_target",
            "true",
            *QUIET,
            "--logdir",
            str(pbt_dir),
            log=root / "pbt.log",
        )
        text = (root / "pbt.log").read_text(encoding="utf-8")
        intervals = re.findall(
            r"pbt: interval (\d+) of \d+ \(env step (\d+), (\d+) s\): (.*)", text
        )
        reached_at = None
        for k, _, _, returns in intervals:
            if any(float(r) >= TARGET for r in returns.split(", ") if r != "-"):
                reached_at = int(k)
                break
        random_dir = root / "random"
        random_wall = _parl_train(
            "ppo/cartpole",
            "--sweep",
            str(root / "random.toml"),
            "--trials",
            "4",
            "--parallel",
            "4",
            *budget,
            *QUIET,
            "--logdir",
            str(random_dir),
            log=root / "random.log",
        )
        run_dirs = [Path(t["run_dir"]) for t in _rows(random_dir / "trials.csv")]
        trial_seconds = sorted(_reached(d, "seconds") for d in run_dirs)
        shown = ", ".join("never" if math.isinf(s) else f"{s:.0f}" for s in trial_seconds)
        median = _median(trial_seconds)
        if math.isinf(median):  # the median trial never reached it: the whole sweep's wall
            peer_value, how = (
                random_wall,
                (
                    f"the median trial never reached {TARGET:g} in {args.steps} env steps: the "
                    "sweep command's wall seconds, a bound from below"
                ),
            )
        else:
            peer_value, how = median, "the median trial's training seconds to it"
        print(f"pbt: {pbt_wall:.0f} s in all, {TARGET:g} reached in interval {reached_at}")
        print(f"pbt: the random sweep {random_wall:.0f} s; its trials' seconds to it: {shown}")
        lines.append(
            f"PBT of 4, wall seconds to {TARGET:g} (the command's)           {pbt_wall:8.0f}    "
            f"vs median of a 4-trial random sweep {peer_value:8.0f}    "
            f"{_ratio(pbt_wall, peer_value)}"
        )
        if reached_at is not None:
            rows.append(
                Row(
                    task=f"CartPole-v1, 4 runs of at most {args.steps // 1000}k env steps",
                    algorithm=f"PPO, PBT of 4 members, an exploit every {args.pbt_interval} steps",
                    metric=f"wall seconds to a training mean return of {TARGET:g}",
                    better="lower",
                    ours=round(pbt_wall, 1),
                    peer="the median trial of a 4-trial random sweep, 4 side by side",
                    peer_value=round(peer_value, 1),
                    seeds=[],
                    command=_command(),
                    note=(
                        "ours: the PBT command's wall seconds, start-up included, to the end of "
                        f"interval {reached_at}, where a member reached {TARGET:g} and it "
                        f"stopped; the peer: {how}; the trials' training seconds to "
                        f"{TARGET:g}: {shown}"
                    ),
                )
            )
        else:
            print(f"pbt: no row (no member reached {TARGET:g})")
    load_after = os.getloadavg()
    print()
    for line in lines:
        print(line)
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; runs in {root}")
    loads = f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after"
    for r in rows:
        r.note = f"{r.note}; {loads}" if r.note else loads
    if not args.quick:
        path = record("sweeps", rows, title="Sweeps and population-based training")
        if path:
            print(f"result rows: {path}")


if __name__ == "__main__":
    main()

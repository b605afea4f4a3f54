"""Elastic training under fire: `parl-train` while a random sampling actor is killed every T s.

Each run is `parl-train CONFIG --mode MODE --actors 2` on CartPole until an evaluation of the
greedy policy (5 episodes every 2,000 env steps, on the run's evaluator actor) has a mean return
of 475 (DQN: 200, see `RUNS`), on a cluster of its own: a master and one worker of 3 slots, the
slots `parl-train` gives itself without `--address`. Undisturbed first, then with one of the
run's `EnvWorker` actors, chosen at random among the live ones that the master lists, killed
with SIGKILL (`--train.max_restarts` is set out of reach: the kills are the benchmark's, not
faults to stop at). The target is the evaluation's rather than the training episodes' (the
config's): with a kill every T seconds, a worker's 500-step episodes end only where it outlives
them, so on a slow machine the mean of the training episodes stops moving.

The kill schedule follows the run, not the clock of the benchmark: the first kill comes as soon
as progress.csv has its first row (training under way, every actor made: a kill before it
would time the cluster's start, not training), the next ones every T s after it. A run quick
enough to reach its target within T s is still disturbed once; a run that reached it before
its first kill (at its first row) was not disturbed at all, and gives no row of its time to
the target (the table says so): every such row counts at least one kill before the target.
The undisturbed run is the same command on a cluster of its own, stopped by the same rule (the
first evaluation at the target) and timed by the same clock (the run's `reached_seconds`,
training seconds); nothing in it waits for a kill. Each kill's time on that clock comes from
progress.csv: the time a row was written, less the row's `seconds`.

Every figure is set beside the undisturbed run of the same invocation:

- time to 475: the run's own `reached_seconds` (training time, the clock of its rows), its
  ratio to the undisturbed run's; the row's note gives the kills before the target, and in
  all (the run goes on to its next evaluation after the last);
- env steps lost to faults: the environments count every step they take (`CountedCartPole-v1`,
  CartPole-v1 that writes its count to a file of its process's own, which outlives a SIGKILL);
  the sampling actors' steps taken and not counted by the run, less the undisturbed run's (the
  steps under way when a run ends; the evaluator's environment counts none);
- replacement latency: each replacement's log line (`... died: ...; replaced in X s`): from
  the death seen to the new actor ready, its weights and shared memory set; and each phase
  of it, in seconds from the kill, from the sampler's debug line (`--debug`): the death seen,
  the first new actor asked for, the last failure of a new actor as it started (where the
  schedule killed one: it is listed among the run's actors from its ask on; the next is asked
  for at once), the process of the one that took the worker's place importing the worker's
  module, its constructor, its environments made, the actor handed back, the weights set,
  ready, its first batch finished (async: the batch then waits for the learner's next
  collect), its first batch in the learner's hands; one result row a phase (the median over
  the run's replacements that have it, against the first batch's).

    nice python benchmarks/chaos.py                  # 3 runs x (undisturbed, T=5, T=2)
    python benchmarks/chaos.py --runs ppo-sync --periods 5 --seed 2

The table goes to the result file `chaos` (`benchmarks/results/chaos.json`, see
`_results.py`), one row a disturbed run, the load average around it in its note; each run's
rows are written as soon as its three runs are done.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

__all__ = ["CountedCartPole", "main"]

_COUNTS = "PARL_CHAOS_COUNTS"
RUNS = {
    "ppo-sync": ("ppo/cartpole", "sync", "PPO", 475.0),
    "ppo-async": ("ppo/cartpole", "async", "PPO", 475.0),
    "dqn-async": ("dqn/cartpole", "async", "DQN", 200.0),
}
"""Each run: its config, mode, algorithm and target (DQN's lower: its undisturbed run alone
takes minutes to 475 on a loaded 2-core machine, its learner being the bottleneck)."""
PHASES = (
    "asked", "retried", "imported", "constructed", "envs", "made", "weights", "ready",
    "collected", "first_batch",
)  # fmt: skip
"""A replacement's phases, as the sampler's debug line names them (`WorkerGroup.delivered`)."""
PARL_TRAIN = os.path.join(os.path.dirname(sys.executable), "parl-train")
EVAL_EVERY = 2000
"""Env steps between two evaluations of the greedy policy, whose mean return is the target's."""


class CountedCartPole(CartPoleEnv):
    """CartPole-v1 that keeps the steps of its process in `$PARL_CHAOS_COUNTS/<pid>`.

    Every step rewrites the file's 20 digits in place: the page cache keeps the last count
    when the process is killed. The evaluator's environment (made by `Evaluator`) counts none:
    only the sampling actors' steps are the run's.
    """

    _fd: int | None = None
    _steps = 0

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        frame, self._counted = sys._getframe(), True
        while frame is not None:
            if frame.f_code.co_filename.endswith("_evaluator.py"):
                self._counted = False
                break
            frame = frame.f_back  # type: ignore[assignment]

    def step(self, action: Any) -> Any:
        if not self._counted:
            return super().step(action)
        cls = type(self)
        if cls._fd is None:
            path = os.path.join(os.environ[_COUNTS], str(os.getpid()))
            cls._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        cls._steps += 1
        os.pwrite(cls._fd, b"%020d" % cls._steps, 0)
        return super().step(action)


gym.register(
    "CountedCartPole-v1", entry_point=CountedCartPole, max_episode_steps=500, reward_threshold=475.0
)


def _steps_taken(directory: str) -> int:
    total = 0
    for name in os.listdir(directory):
        with open(os.path.join(directory, name), "rb") as f:
            total += int(f.read() or b"0")
    return total


class Killer(threading.Thread):
    """SIGKILL a random live `EnvWorker` at the first progress row, then every `period` s."""

    def __init__(self, cluster: Any, period: float, progress: str, seed: int) -> None:
        super().__init__(name="chaos-killer", daemon=True)
        self.cluster, self.period, self.progress = cluster, period, progress
        self.random = random.Random(seed)
        self.killed_at: list[float] = []
        """The Unix time of each kill."""
        self.offset: float | None = None
        """Unix time less the run's training seconds (its rows' clock), from the first row."""
        self.stop = threading.Event()

    def _workers(self) -> list[int]:
        from parl_remote.cli import _request
        from parl_remote.wire.protocol import messages as m

        token = self.cluster.env["PARL_CLUSTER_TOKEN"].encode()
        status = _request(self.cluster.address, lambda rid: m.StatusRequest(rid), token=token)
        return [
            a["pid"]
            for a in status.status["actors"]
            if a["class_name"] == "EnvWorker" and a["state"] != "dead" and a["pid"]
        ]

    def _clock(self) -> float | None:
        """`offset` from progress.csv's last row and the time it was written; None before one.

        The file is read between two looks at its time: a row written meanwhile is read again.
        """
        try:
            written = os.stat(self.progress).st_mtime
            with open(self.progress, newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
            if not rows or os.stat(self.progress).st_mtime != written:
                return None
        except FileNotFoundError:
            return None
        return written - float(rows[-1]["seconds"])

    def training_seconds(self) -> list[float]:
        """Each kill's time on the run's training clock (`reached_seconds`'s)."""
        assert self.offset is not None or not self.killed_at
        return [at - (self.offset or 0.0) for at in self.killed_at]

    def run(self) -> None:
        while (offset := self._clock()) is None:
            if self.stop.wait(0.05):
                return
        self.offset = offset
        while True:
            try:
                pids = self._workers()
                if pids:
                    os.kill(self.random.choice(pids), signal.SIGKILL)
                    self.killed_at.append(time.time())
            except (OSError, RuntimeError):  # gone already, or the master busy: next period
                pass
            if self.stop.wait(self.period if self.killed_at else 0.2):  # the first: soon
                return


def run_once(name: str, period: float | None, seed: int, timeout: float) -> dict[str, Any]:
    """One run of `RUNS[name]` with a kill every `period` s (None: undisturbed)."""
    from _cluster_util import BenchCluster  # here: actors import this module for the env

    config, mode, _, target = RUNS[name]
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory() as counts, tempfile.TemporaryDirectory() as logdir:
        os.environ.update({"PYTHONPATH": path, _COUNTS: counts})  # the cluster's processes too
        cluster = BenchCluster(3)
        load = [os.getloadavg()[0]]
        killer = None
        try:
            command = [
                PARL_TRAIN, config, "--mode", mode, "--actors", "2",
                "--address", cluster.address, "--env.id", "chaos:CountedCartPole-v1",
                "--train.seed", str(seed), "--train.eval_every", str(EVAL_EVERY),
                "--train.target_on", "eval", "--train.stop_at_target", "true",
                "--train.target_return", str(target),
                "--train.max_restarts", "1000000", "--no-progress", "--debug", "--logdir", logdir,
            ]  # fmt: skip
            env = {**cluster.env, "OMP_NUM_THREADS": "1"}
            proc = subprocess.Popen(
                command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
            )
            if period is not None:
                progress = os.path.join(logdir, "progress.csv")
                killer = Killer(cluster, period, progress, seed)
                killer.start()
            try:
                _, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, stderr = proc.communicate()
            load.append(os.getloadavg()[0])
            if killer is not None:
                killer.stop.set()
                killer.join()
            with open(os.path.join(logdir, "log.log"), encoding="utf-8") as f:
                log = f.read()
            if proc.returncode != 0:
                what = f"{name}, a kill every {period} s: exit {proc.returncode}"
                raise RuntimeError(f"{what}\n{stderr[-2000:]}\nlog.log:\n{log[-6000:]}")
            with open(os.path.join(logdir, "progress.csv"), newline="") as f:
                rows = list(csv.DictReader(f))
        finally:
            cluster.stop()
        taken = _steps_taken(counts)
    done = log[log.rindex("done: RunResult(") :]
    fields = dict(re.findall(r"(\w+)=([-\w.]+)", done[: done.index(")")]))
    steps = [int(r["env_step"]) for r in rows]
    reached = fields["reached_at"] != "None"
    reached_seconds = float(fields["reached_seconds"]) if reached else None
    kills = killer.training_seconds() if killer is not None else []
    return {
        "reached_seconds": reached_seconds,
        "seconds": float(fields["seconds"]),
        "env_steps": int(fields["env_steps"]),
        "uncounted": taken - int(fields["env_steps"]),
        "kills": len(kills),
        "kills_before": sum(reached_seconds is None or k < reached_seconds for k in kills),
        "restarts": int(rows[-1]["actor_restarts"]) if rows else 0,
        "replaced_in": [float(x) for x in re.findall(r"; replaced in ([\d.]+) s", log)],
        "phases": _phases(log, killer.killed_at if killer is not None else []),
        "rows_increasing": steps == sorted(set(steps)),
        "load": (min(load), max(load)),
    }


def _phases(log: str, killed_at: list[float]) -> list[dict[str, float]]:
    """Each replacement's phases (s from the kill) from the sampler's debug lines of `log`.

    `detected` is the death seen (the sampler's `seen_at`) after the last kill before it.
    """
    found = []
    for seen, rest, failed in re.findall(
        r"replacement, seconds from its death seen at ([\d.]+): ([^;\n]+); (\d+) failed starts",
        log,
    ):
        at = float(seen)
        before = [k for k in killed_at if k <= at]
        if not before:
            continue
        base = at - before[-1]
        phases = {"detected": base}
        phases.update({k: base + float(v) for k, v in re.findall(r"(\w+)=([-\d.]+)", rest)})
        phases["failed_starts"] = int(failed)
        found.append(phases)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", default=",".join(RUNS), help=f"of {', '.join(RUNS)}")
    parser.add_argument("--periods", default="5,2", help="seconds between two kills")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")
    args = parser.parse_args()
    names = args.runs.split(",")
    unknown = sorted(set(names) - set(RUNS))
    if unknown:
        parser.error(f"--runs: {', '.join(unknown)} not among {', '.join(RUNS)}")
    periods = [float(p) for p in args.periods.split(",")]
    from _results import Row, command_line, record

    header = (
        f"{'run':<10} {'kill every':>10} {'target':>6} {'to it s':>8} {'ratio':>6} "
        f"{'kills':>7} {'replaced':>8} {'lost steps':>10} {'replace med/max s':>18} {'load':>9}"
    )
    print(header)
    rows = []
    for name in names:
        _, mode, algorithm, target = RUNS[name]
        base = run_once(name, None, args.seed, args.timeout)
        results = [(None, base)]
        for period in periods:
            try:
                results.append((period, run_once(name, period, args.seed, args.timeout)))
            except RuntimeError as exc:  # killed faster than replaced: no progress in time
                print(f"{name:<10} {period:>8g} s  failed: {str(exc).splitlines()[0]}", flush=True)
        for period, r in results:
            lost = r["uncounted"] - base["uncounted"]
            ratio = (
                r["reached_seconds"] / base["reached_seconds"]
                if r["reached_seconds"] and base["reached_seconds"]
                else float("nan")
            )
            kills = "-" if period is None else f"{r['kills_before']}/{r['kills']}"
            took = r["replaced_in"]
            latency = f"{statistics.median(took):.2f}/{max(took):.2f}" if took else "-"
            reached = f"{r['reached_seconds']:.1f}" if r["reached_seconds"] else "missed"
            print(
                f"{name:<10} {('-' if period is None else f'{period:g} s'):>10} {target:>6g} "
                f"{reached:>8} {ratio:>6.2f} {kills:>7} {r['restarts']:>8} {lost:>10} "
                f"{latency:>18} {r['load'][0]:>4.1f}-{r['load'][1]:<4.1f}",
                flush=True,
            )
            if period is None:
                continue
            what = f"{algorithm} {mode}, 2 actors, one killed every {period:g} s"
            load = (
                f"1-minute load {min(r['load'][0], base['load'][0]):.1f}-"
                f"{max(r['load'][1], base['load'][1]):.1f} on this 2-core machine"
            )
            kills = f"{r['kills']} kills"
            rows += _phase_rows(what, r["phases"], args.seed, f"{kills}; {load}")
            if not (r["reached_seconds"] and base["reached_seconds"]):
                continue
            if not r["kills_before"]:  # it reached the target before its first kill
                print(f"{name:<10} {period:>8g} s  no kill before the target: no row", flush=True)
                continue
            rows.append(
                Row(
                    task="CartPole-v1",
                    algorithm=what,
                    metric=f"seconds of training to a greedy evaluation of {target:g}",
                    better="lower",
                    ours=round(r["reached_seconds"], 1),
                    peer="the same run undisturbed",
                    peer_value=round(base["reached_seconds"], 1),
                    seeds=[args.seed],
                    command=command_line(),
                    note=(
                        f"{r['kills_before']} kills before the target ({r['kills']} in all: the "
                        "first at the run's first row of progress), "
                        f"{r['restarts']} replacements, each ready in "
                        f"{latency} s (median/max, from the death seen), {lost} env steps lost "
                        f"to faults ({lost / max(r['kills'], 1):.0f} a kill; the sampling "
                        f"actors' steps, the evaluator's left out); rows strictly increasing: "
                        f"{r['rows_increasing']}; {load}"
                    ),
                )
            )
        path = record("chaos", rows, title="Elastic training: a run whose actors are killed")
        if path:
            print(f"result rows: {path}", flush=True)


def _phase_rows(what: str, phases: list[dict[str, float]], seed: int, load: str) -> list[Any]:
    """One row a phase of the replacements: the median seconds from the kill to its end."""
    from _results import Row, command_line

    ends = [p["first_batch"] for p in phases if "first_batch" in p]
    if not ends:
        return []
    rows = []
    whole = statistics.median(ends)
    retried = sum(p["failed_starts"] > 0 for p in phases)
    failed = sum(p["failed_starts"] for p in phases)
    for phase in ("detected", *PHASES):
        values = [p[phase] for p in phases if phase in p]
        if not values:
            continue
        median = statistics.median(values)
        print(f"  {phase:>12}: median {median:6.2f} s, max {max(values):6.2f} s from the kill")
        if median <= 0:  # imported before the kill: warm processes that had preloaded
            continue
        rows.append(
            Row(
                task="CartPole-v1",
                algorithm=what,
                metric=f"seconds from a kill to a replacement's phase '{phase}' (median)",
                better="lower",
                ours=round(median, 3),
                peer="the replacement's first batch (median, the same replacements)",
                peer_value=round(whole, 3),
                seeds=[seed],
                command=command_line(),
                note=(
                    f"{len(values)} of {len(phases)} replacements, max {max(values):.2f} s; "
                    f"{retried} of them had new actors killed as they started ({failed} in "
                    "all); phases: detected (the sampler sees the death), asked (the first new "
                    "actor asked for), retried (the last failure of a new actor as it started, "
                    "the next one asked for at once), imported (the process of the actor that "
                    "took the worker's place imported the worker's module: before the kill for "
                    "a warm process), constructed (its constructor began, its arguments "
                    "unpickled), envs (its environments made), made (the actor handed back), "
                    "weights (the latest weights set), ready (shared memory and signal set "
                    "up), collected (async: its first batch finished, waiting for the "
                    f"learner), first_batch (its first batch in the learner's hands); {load}"
                ),
            )
        )
    return rows


if __name__ == "__main__":
    main()

"""Evolution-strategies benchmark: noise, CMA-ES and distributed ES, each against a baseline.

What it measures, in one run, with the baseline side by side and the ratio printed:

1. Noise regeneration for a 100k-parameter model, in microseconds per vector:
   - `NoiseTable.noise` (a slice of the shared table) against a plain numpy slice of an
     in-memory array written here;
   - `SeedNoise.noise` (PCG64, float32) against plain numpy written here: `default_rng(seed)`
     drawing float64 normals (what most code does) and `RandomState(seed).randn` (what the
     original OpenAI-ES code did).
2. CMA-ES evaluations to reach f < 1e-8 on 10-D Rosenbrock from x0 = 0, sigma0 = 0.5 (the median
   over seeds) against pycma, if installed. pycma is not a dependency of this repository; to
   include it, install it into the same environment first:

       pip install cma

3. ES generation throughput on remote actors, 1 against 2: the workload of
   `examples/es/cartpole.py` (its actor class, policy and generation loop; seed 1, the same
   generations from the same start, each candidate one CartPole-v1 episode), timed on one fresh
   actor (the baseline) and on two, in a local cluster this script starts; best of 3 rounds.
   The target is >= 1.7x on 2 cores. The runs must also play the same episodes and end at the
   same weights, and the last line says whether they did. On a shared machine other processes
   take CPUs from the actors, so the load average is printed, and so is how the actors spent
   the run (Linux schedstat): running, runnable but waiting for a CPU, or idle (waiting for the
   learner: the runtime's and the algorithm's share). Leaving out the waiting gives an estimate
   of the speedup on a machine of one's own, printed as such.

Run: `python benchmarks/es_bench.py` (about a minute on 2 cores; `--quick` for a smoke run).
The three tables go to the result file `es` (`benchmarks/results/es.json`, see `_results.py`;
`--quick` runs write none).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import psutil
from _results import Row, command_line, record

import parl
from parl_evo import CMAES, NoiseTable, SeedNoise

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DIM = 100_000


def per_call_us(fn: Callable[[int], object], repeats: int) -> float:
    """Median microseconds of `fn(i)` over `repeats` calls (after a warm-up call)."""
    fn(0)
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i + 1)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _row(task: str, algorithm: str, metric: str, better: str, **figures) -> Row:
    return Row(
        task=task, algorithm=algorithm, metric=metric, better=better, command=command_line(),
        **figures,
    )  # fmt: skip


def bench_noise(repeats: int) -> list[Row]:
    print(f"\n1. noise regeneration, {DIM:,} parameters (median us per vector)")
    size = 10 * DIM
    with tempfile.TemporaryDirectory() as directory:
        table = NoiseTable(seed=1, size=size, directory=directory, cleanup=True)
        plain_table = np.random.default_rng(1).standard_normal(size, dtype=np.float32)
        rng = np.random.default_rng(0)
        keys = [table.draw_key(rng, DIM) for _ in range(repeats + 1)]
        ours_slice = per_call_us(lambda i: table.noise(keys[i], DIM), repeats)
        base_slice = per_call_us(lambda i: plain_table[keys[i] : keys[i] + DIM], repeats)
        ours_copy = per_call_us(lambda i: table.noise(keys[i], DIM).astype(np.float64), repeats)
        base_copy = per_call_us(
            lambda i: plain_table[keys[i] : keys[i] + DIM].astype(np.float64), repeats
        )
        table.close()
    seed_noise = SeedNoise()
    ours_seed = per_call_us(lambda i: seed_noise.noise(1000 + i, DIM), repeats)
    base_rng = per_call_us(lambda i: np.random.default_rng(1000 + i).standard_normal(DIM), repeats)
    base_legacy = per_call_us(lambda i: np.random.RandomState(1000 + i).randn(DIM), repeats)
    rows = [
        ("table slice (view)", ours_slice, "numpy array slice", base_slice),
        ("table slice -> float64", ours_copy, "numpy slice -> float64", base_copy),
        ("seed, PCG64 float32", ours_seed, "default_rng(seed) float64", base_rng),
        ("seed, PCG64 float32", ours_seed, "RandomState(seed).randn", base_legacy),
    ]
    print(f"   {'parl.evo':<24} {'us':>9}   {'plain numpy':<26} {'us':>9}   ratio")
    for name, ours, base_name, base in rows:
        print(f"   {name:<24} {ours:9.1f}   {base_name:<26} {base:9.1f}   {ours / base:5.2f}x")
    print(f"   seed regeneration / table copy: {ours_seed / ours_copy:.1f}x slower")
    task = f"noise for {DIM:,} parameters"
    return [
        _row(
            task,
            f"parl.evo {name}",
            "µs a vector (median)",
            "lower",
            ours=round(ours, 1),
            peer=f"plain numpy: {base_name}",
            peer_value=round(base, 1),
            seeds=[],
        )
        for name, ours, base_name, base in rows
    ]


def rosenbrock(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1.0 - x[:-1]) ** 2))


def ours_evals(seed: int, target: float, budget: int) -> tuple[int, float]:
    solver = CMAES(x0=np.zeros(10), sigma=0.5, noise=SeedNoise())
    rng = np.random.default_rng(seed)
    evals, best = 0, np.inf
    while evals < budget and best >= target:
        infos = solver.ask(rng)
        values = [rosenbrock(solver.candidate(info)) for info in infos]
        evals += len(values)
        best = min(best, *values)
        solver.tell(infos, [-v for v in values])
    return evals, best


def pycma_evals(seed: int, target: float, budget: int) -> tuple[int, float] | None:
    try:
        import cma
    except ModuleNotFoundError:
        return None
    options = {"seed": seed, "ftarget": target, "verbose": -9, "maxfevals": budget}
    es = cma.CMAEvolutionStrategy(np.zeros(10), 0.5, options)
    es.optimize(rosenbrock)
    return es.result.evaluations, es.result.fbest


def bench_cma(seeds: int) -> list[Row]:
    target, budget = 1e-8, 40_000
    print(f"\n2. CMA-ES on 10-D Rosenbrock: evaluations to f < {target:g} (x0 = 0, sigma0 = 0.5)")
    ours, theirs = [], []
    start = time.perf_counter()
    for seed in range(1, seeds + 1):
        evals, best = ours_evals(seed, target, budget)
        if best < target:
            ours.append(evals)
    ours_s = time.perf_counter() - start
    start = time.perf_counter()
    for seed in range(1, seeds + 1):
        result = pycma_evals(seed, target, budget)
        if result is None:
            break
        if result[1] < target:
            theirs.append(result[0])
    theirs_s = time.perf_counter() - start
    print(f"   parl.evo CMAES: median {statistics.median(ours):.0f} evaluations "
          f"({len(ours)}/{seeds} runs reached the target; {ours_s:.1f} s)")  # fmt: skip
    if not theirs:
        print("   pycma: not installed (`pip install cma` to compare)")
        return []
    print(f"   pycma         : median {statistics.median(theirs):.0f} evaluations "
          f"({len(theirs)}/{seeds} runs reached the target; {theirs_s:.1f} s)")  # fmt: skip
    ratio = statistics.median(ours) / statistics.median(theirs)
    print(f"   ratio parl.evo / pycma: {ratio:.2f}x (the requirement: at most 1.5x)")
    import cma

    row = _row(
        "10-D Rosenbrock, f < 1e-8 from x0 = 0, sigma0 = 0.5",
        "parl.evo CMAES",
        f"evaluations to the target (median of the runs that reached it, of {seeds} seeds)",
        "lower",
        ours=statistics.median(ours),
        peer=f"pycma {cma.__version__.split()[0]}",
        peer_value=statistics.median(theirs),
        seeds=list(range(1, seeds + 1)),
        note=f"runs that reached the target: ours {len(ours)}/{seeds}, pycma {len(theirs)}/{seeds}",
    )
    return [row]


@dataclass(frozen=True)
class ESRun:
    seconds: float  # wall time of the generations
    env_steps: int
    digest: int  # of the final weights
    actors_running_s: float  # summed over the actor processes: on a CPU
    actors_waiting_s: float  # runnable, but waiting for a CPU (other processes had them)


def actors_sched_s(worker: psutil.Process) -> tuple[float, float]:
    """Seconds the worker's actor processes have run, and waited for a CPU (Linux schedstat).

    Idle actors add nothing, so the sums over every actor process are those of the busy ones.
    Where there is no schedstat, the running time comes from psutil and the waiting time is 0.
    """
    running = waiting = 0.0
    for child in worker.children(recursive=True):
        try:
            with open(f"/proc/{child.pid}/schedstat") as f:
                run_ns, wait_ns, _ = (int(x) for x in f.read().split())
            running, waiting = running + run_ns / 1e9, waiting + wait_ns / 1e9
        except (OSError, ValueError):
            with contextlib.suppress(psutil.Error):
                times = child.cpu_times()
                running += times.user + times.system
    return running, waiting


async def es_generations(
    cartpole: ModuleType, actors: list, generations: int, worker: psutil.Process
) -> ESRun:
    """Run `generations` of the example's ES loop from its start on fresh `actors`."""
    args = cartpole.Args(seed=1)
    agent, _ = cartpole.make_agent(args)
    rng = np.random.default_rng(args.seed)
    steps = 0
    running, waiting = actors_sched_s(worker)
    start = time.perf_counter()
    for _ in range(generations):
        _, played = await cartpole.run_generation(agent, actors, rng, args.chunk_size)
        steps += played
    seconds = time.perf_counter() - start
    running_after, waiting_after = actors_sched_s(worker)
    digest = cartpole.weights_digest(agent)
    return ESRun(seconds, steps, digest, running_after - running, waiting_after - waiting)


async def es_rounds(
    cartpole: ModuleType, generations: int, rounds: int, worker: psutil.Process
) -> dict[int, list[ESRun]]:
    """Each round: the same generations on 1 fresh actor, then on 2 fresh actors."""
    args = cartpole.Args(seed=1)
    # Every run gets fresh actors, and all stay alive until the end: an idle actor costs
    # nothing, while a freed one has its slot refilled (a process start) during the next run.
    actors = await asyncio.gather(*(cartpole.Evaluator.aio(args) for _ in range(3 * rounds)))
    runs: dict[int, list[ESRun]] = {1: [], 2: []}
    for r in range(rounds):
        for n_actors, group in ((1, actors[3 * r : 3 * r + 1]), (2, actors[3 * r + 1 : 3 * r + 3])):
            runs[n_actors].append(await es_generations(cartpole, group, generations, worker))
    return runs


def play_episodes(episodes: int, seed: int) -> int:
    """CartPole-v1 episodes the way an actor plays them: a 4-16-2 tanh network's forward pass
    each step (its output mixed with a balancing rule, so that episodes run long, as a trained
    policy's do); returns the env steps played."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(seed)
    w1, w2 = rng.normal(size=(4, 16)) * 0.5, rng.normal(size=(16, 2)) * 0.5
    steps = 0
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        done = False
        while not done:
            logits = np.tanh(obs @ w1) @ w2
            action = int(obs[2] + 0.5 * obs[3] + 1e-3 * (logits[1] - logits[0]) > 0)
            obs, _, terminated, truncated, _ = env.step(action)
            steps += 1
            done = terminated or truncated
    return steps


def machine_speedup(episodes: int, rounds: int) -> float:
    """The machine's own 2-vs-1 speedup on this kind of work: plain processes, no parl."""
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    times = {1: [], 2: []}
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as pool:
        list(pool.map(play_episodes, [20, 20], [0, 1]))  # start both processes first
        for _ in range(rounds):
            for n in (1, 2):
                start = time.perf_counter()
                list(pool.map(play_episodes, [episodes // n] * n, [0, episodes // 2][:n]))
                times[n].append(time.perf_counter() - start)
    return min(times[1]) / min(times[2])


def bench_remote_throughput(generations: int, rounds: int) -> list[Row]:
    sys.path.insert(0, os.path.join(REPO_ROOT, "examples", "es"))
    import cartpole  # the example's actor, policy and generation loop: its real workload

    args = cartpole.Args(seed=1)
    print(
        f"\n3. ES generations/s on remote actors, examples/es/cartpole.py's workload: seed "
        f"{args.seed}, {generations} generations of {args.population_size} CartPole-v1 episodes "
        "from the same start, on 1 and on 2 actors"
    )
    load_before = os.getloadavg()[0]
    client = parl.connect(cpu_num=3 * rounds, log_to_driver=False)
    try:
        worker = psutil.Process(client.cluster.worker.pid)
        runs = asyncio.run(es_rounds(cartpole, generations, rounds, worker))
    finally:
        parl.disconnect()
    load_after = os.getloadavg()[0]
    floor = machine_speedup(episodes=80, rounds=rounds)
    best = {n: min(results, key=lambda run: run.seconds) for n, results in runs.items()}
    print(
        f"   {'actors':<7} {'seconds':>8} {'generations/s':>14} {'env steps/s':>12}   speedup   "
        "actors' time: running / waiting for a CPU / idle"
    )
    unhindered = {}  # each run's wall time without its waiting for a CPU (an estimate)
    for n_actors, run in best.items():
        total = n_actors * run.seconds
        idle_s = max(0.0, total - run.actors_running_s - run.actors_waiting_s)
        running, waiting, idle = (
            100 * share / total for share in (run.actors_running_s, run.actors_waiting_s, idle_s)
        )
        unhindered[n_actors] = (run.actors_running_s + idle_s) / n_actors
        print(
            f"   {n_actors:<7} {run.seconds:8.2f} {generations / run.seconds:14.2f} "
            f"{run.env_steps / run.seconds:12,.0f}   {best[1].seconds / run.seconds:5.2f}x   "
            f"{running:3.0f}% / {waiting:3.0f}% / {idle:3.0f}%"
        )
    speedup = best[1].seconds / best[2].seconds
    print(
        f"   2 actors vs 1: {speedup:.2f}x (target >= 1.7x on 2 cores); "
        f"best of {rounds} round(s); {os.cpu_count()} CPUs, load average {load_before:.1f} "
        f"before, {load_after:.1f} after"
    )
    print(
        f"   baseline, this machine in the same run: 2 plain processes playing the same kind of "
        f"episodes vs 1: {floor:.2f}x; ES on 2 actors reaches {speedup / floor:.0%} of it"
    )
    print(
        "   (waiting: runnable actors that other processes kept off the CPUs; idle: actors with "
        "no work, waiting for the learner)"
    )
    print(
        f"   estimate without the waiting (each run's running + idle time): "
        f"{unhindered[1] / unhindered[2]:.2f}x"
    )
    results = [run for results in runs.values() for run in results]
    same = len({(run.env_steps, run.digest) for run in results}) == 1
    print(f"   every run played the same episodes and ended at the same weights: {same}")
    row = _row(
        "CartPole-v1, ES generations",
        "OpenAI-ES on 2 remote actors",
        f"speed-up of 2 actors over 1 (generations per second, best of {rounds})",
        "higher",
        ours=round(speedup, 2),
        peer="two plain processes playing the same episodes",
        peer_value=round(floor, 2),
        seeds=[args.seed],
        note=f"load average {load_before:.1f} before, {load_after:.1f} after; "
        f"the same episodes and final weights in every run: {same}",
    )
    return [row]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and seeds")
    args = parser.parse_args()
    np.random.default_rng(0).standard_normal(10)  # import and warm numpy before timing
    rows = bench_noise(repeats=20 if args.quick else 200)
    rows += bench_cma(seeds=2 if args.quick else 10)
    rows += bench_remote_throughput(
        generations=3 if args.quick else 20, rounds=1 if args.quick else 3
    )
    path = None if args.quick else record("es", rows)
    if path:
        print(f"\nresult rows: {path}")


if __name__ == "__main__":
    main()

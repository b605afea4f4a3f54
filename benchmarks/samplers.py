"""Env steps per second collected by the samplers, against gymnasium's and SB3's vector envs.

All in one run. 16 environments in all (2 workers x 8 for the cluster samplers), each task
with a random-action agent and a small network agent (torch, one thread): CartPole-v1 with an
MLP (two hidden layers of 64); when `ale-py` is installed, ALE Pong-v5 (RGB frames) with a
small CNN; when `mujoco` is installed, HalfCheetah-v5 with a Gaussian MLP. Baselines measured
in the same run, driven by the same agent: gymnasium's `SyncVectorEnv` (one process) and
`AsyncVectorEnv` (a process per env), and, when `stable-baselines3` is installed, its
`SubprocVecEnv` (a process per env), and envpool (C++ threads, random actions only) where it is
importable or `--envpool-python` names a Python that has it (a virtual environment of its own:
envpool is never a dependency; `benchmarks/envpool_rate.py` runs there). `CentralSampler` (and
its alternating mode) against `ParallelSampler` is printed apart: the samplers open at once and
take turns, one `collect()` each (a shared machine's load moves within seconds, so each sees
the same load), and each of `--repeat` repetitions of about `--seconds` of each gives a ratio;
the table has their median; so does `ParallelSampler` against a one-process `SyncVectorEnv`.
`--crossover` measures where the alternating mode starts
to pay with the MLP: CartPole with extra CPU work in every environment step, from none to more
than the network's call costs. Scaling: `ParallelSampler` with 1 and with 2
workers of 8 environments, against 1 and 2 plain processes stepping 8 environments each with
no framework (the machine's own ceiling). Every measurement starts once the machine has
settled (`settle`: the cluster's fresh processes after a sampler's close have done their
imports). Prints the tables and the load average before and
after (a shared machine's figures mean little without it). `mujoco` and `stable-baselines3`
are optional, never dependencies of the project: without them their rows are left out; to
have them, `pip install -c constraints.txt "gymnasium[mujoco]" stable-baselines3`.

    python benchmarks/samplers.py                 # about ten minutes
    python benchmarks/samplers.py --seconds 2 --tasks CartPole-v1   # a quicker look
    python benchmarks/samplers.py --envpool-python ../envpool-venv/bin/python
    python benchmarks/samplers.py --tasks --crossover   # the alternating mode's crossover only
    python benchmarks/samplers.py --tasks CartPole-v1 --socket-handoff   # flags against socket
    python benchmarks/samplers.py --tasks CartPole-v1 --fixed-spin   # adaptive spin against 50 µs
    python benchmarks/samplers.py --tasks CartPole-v1 --unpinned --caller-free  # CPU pinning
    python benchmarks/samplers.py --zero-copy --seconds 5   # shared batches against copies only
    python benchmarks/samplers.py --ceiling --tasks ALE/Pong-v5   # against 2 plain processes

`--zero-copy` measures only `ParallelSampler`'s batches in shared memory (its workers write
into the batch) against its copy path (the caller copies every worker's rollout into a fresh
batch), one sampler switching path every turn, with a one-process `SyncVectorEnv` taking turns
too, random actions, on each task. `--ceiling` measures only what two cores give over one on
each task with no framework at all (two plain processes of 8 envs against one of 16, each
answering a pipe's request for `HORIZON` random steps) beside `ParallelSampler` 2x8 against a
one-process `SyncVectorEnv`, the four taking turns: a target over `SyncVectorEnv` above the
machine's own ceiling cannot be met by any framework.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import gymnasium as gym
import numpy as np
import torch

import parl
from parl.samplers import AsyncSampler, CentralSampler, ParallelSampler, SerialSampler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _results import Row, command_line, record

WORKERS, ENVS_PER_WORKER, HORIZON = 2, 8, 64


class RandomAgent:
    """Uniformly random actions from the action space (numpy): discrete choices or a box."""

    def __init__(self, space: gym.Space, seed: int = 0) -> None:
        self.space = space
        self.rng = np.random.default_rng(seed)

    def sample(self, obs: np.ndarray) -> np.ndarray:
        if isinstance(self.space, gym.spaces.Discrete):
            return self.rng.integers(self.space.n, size=len(obs))
        low, high = self.space.low, self.space.high
        return self.rng.uniform(low, high, size=(len(obs), *low.shape)).astype(np.float32)

    def get_weights(self) -> dict:
        return {}

    def set_weights(self, weights: dict) -> None:
        pass


class TorchAgent:
    """A small policy network; discrete actions drawn from its logits, boxes from a Gaussian."""

    def __init__(self, space: gym.Space, obs_shape: tuple[int, ...]) -> None:
        torch.manual_seed(0)
        self.discrete = isinstance(space, gym.spaces.Discrete)
        out = space.n if self.discrete else int(np.prod(space.shape))
        self.net = self.body(obs_shape, out)

    def body(self, obs_shape: tuple[int, ...], out: int) -> torch.nn.Module:
        """An MLP, 64 x 64, tanh."""
        return torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(int(np.prod(obs_shape)), 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, out),
        )

    def features(self, obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(obs, dtype=torch.float32)

    @torch.no_grad()
    def sample(self, obs: np.ndarray) -> np.ndarray:
        out = self.net(self.features(obs))
        if self.discrete:
            return torch.distributions.Categorical(logits=out).sample().numpy()
        return torch.normal(out, 1.0).clamp(-1.0, 1.0).numpy()

    def get_weights(self) -> dict:
        return {k: v.numpy() for k, v in self.net.state_dict().items()}

    def set_weights(self, weights: dict) -> None:
        self.net.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})


class CNNAgent(TorchAgent):
    """A small CNN on every other pixel of the frame (Nature-DQN-like, 2 conv layers)."""

    def body(self, obs_shape: tuple[int, ...], out: int) -> torch.nn.Module:
        h, w, c = obs_shape
        conv = torch.nn.Sequential(
            torch.nn.Conv2d(c, 16, 8, stride=4),
            torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 4, stride=2),
            torch.nn.ReLU(),
            torch.nn.Flatten(),
        )
        with torch.no_grad():
            n = conv(torch.zeros(1, c, (h + 1) // 2, (w + 1) // 2)).shape[1]
        return torch.nn.Sequential(
            conv, torch.nn.Linear(n, 256), torch.nn.ReLU(), torch.nn.Linear(256, out)
        )

    def features(self, obs: np.ndarray) -> torch.Tensor:
        frames = torch.as_tensor(obs[:, ::2, ::2]).permute(0, 3, 1, 2)
        return frames.float() / 255.0


def make_pong() -> gym.Env:
    import ale_py

    gym.register_envs(ale_py)
    return gym.make("ALE/Pong-v5")


def make_cheetah() -> gym.Env:
    return gym.make("HalfCheetah-v5")


class BusyStep(gym.Wrapper):
    """An environment whose every step also does `work` iterations of a Python loop (CPU)."""

    def __init__(self, env: gym.Env, work: int) -> None:
        super().__init__(env)
        self.work = work

    def step(self, action):
        total = 0
        for i in range(self.work):
            total += i
        return self.env.step(action)


def make_busy_cartpole(work: int) -> gym.Env:
    return BusyStep(gym.make("CartPole-v1"), work)


def loop_us() -> float:
    """Microseconds of one iteration of `BusyStep`'s loop here (best of 5)."""
    env = BusyStep(gym.make("CartPole-v1"), 100_000)
    env.reset(seed=0)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        env.step(0)
        best = min(best, time.perf_counter() - start)
    env.close()
    return best / env.work * 1e6


def settle(limit: float = 30.0) -> None:
    """Wait (at most `limit` seconds) until at most one other task on the machine is runnable.

    Closing a sampler frees its actors, and the cluster starts fresh processes in their place
    (importing numpy, torch, gymnasium): measured during those seconds, a one-process
    baseline made a tenth of its rate. Every cell starts on a settled machine; the
    `/proc/loadavg` count of runnable tasks (this one included) must stay at 2 or fewer for
    0.6 s. Where there is no such file (not Linux), nothing is waited for.
    """
    deadline, calm = time.monotonic() + limit, 0
    while calm < 3:
        try:
            with open("/proc/loadavg", encoding="ascii") as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return
        calm = calm + 1 if running <= 2 else 0
        if time.monotonic() > deadline:
            print(f"(the machine did not settle in {limit:.0f} s: {running} tasks runnable)")
            return
        time.sleep(0.2)


def timed(step: Callable[[], int], seconds: float) -> float:
    """Call `step` (returns env steps taken) for about `seconds` after one warm-up; steps/s."""
    settle()
    step()
    steps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        steps += step()
    return steps / elapsed


def vector_rate(kind: str, env_fn, agent, seconds: float, *, n: int) -> float:
    cls = gym.vector.SyncVectorEnv if kind == "sync" else gym.vector.AsyncVectorEnv
    envs = cls([env_fn] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs, _ = envs.reset(seed=0)
    state = {"obs": obs}

    def step() -> int:
        for _ in range(HORIZON):
            state["obs"], *_ = envs.step(agent.sample(state["obs"]))
        return HORIZON * n

    try:
        return timed(step, seconds)
    finally:
        envs.close()


def subproc_rate(env_fn, agent, seconds: float, *, n: int) -> float:
    from stable_baselines3.common.vec_env import SubprocVecEnv

    envs = SubprocVecEnv([env_fn] * n)
    envs.seed(0)
    state = {"obs": envs.reset()}

    def step() -> int:
        for _ in range(HORIZON):
            state["obs"], *_ = envs.step(agent.sample(state["obs"]))
        return HORIZON * n

    try:
        return timed(step, seconds)
    finally:
        envs.close()


def sampler_rate(cls, env_fn, agent, seconds: float, **kwargs) -> float:
    kwargs = {"num_workers": WORKERS, "envs_per_worker": ENVS_PER_WORKER, **kwargs}
    with cls(env_fn, agent, horizon=HORIZON, seed=0, **kwargs) as sampler:

        def step() -> int:
            batch = sampler.collect()
            return batch.rewards.size

        return timed(step, seconds)


COMPARED = {
    "ParallelSampler 2x8": (ParallelSampler, {}),
    "CentralSampler 2x8": (CentralSampler, {}),
    "CentralSampler 2x8 alternating": (CentralSampler, {"alternating": True}),
}
"""The samplers compared by turns (`interleaved`): label -> (class, extra arguments)."""


class SocketCentralSampler(CentralSampler):
    """`CentralSampler` handing steps over by one byte each way on its socket, not by flags."""

    _spin_s = None


class FixedSpinCentralSampler(CentralSampler):
    """`CentralSampler` whose step flags always spin 50 µs before sleeping (not adaptive)."""

    _spin_s = (50e-6, 50e-6)
    _spin_adaptive = False


class CallerFreeCentralSampler(CentralSampler):
    """`CentralSampler` whose pinned workers' caller is not pinned to the last one's CPU."""

    _pin_caller = False


def rates_by_turns(
    sides: list[Callable[[], int]], seconds: float, repeat: int
) -> list[list[float]]:
    """Each side's env steps/s in each of `repeat` repetitions, the sides taking turns.

    A side is a call that takes some env steps and returns how many. After one warm-up call
    each and a settled machine, the sides are called in turn, the first of a round moving on
    by one every round, until each has spent `seconds` in the repetition: the load of a shared
    machine, which moves within seconds, falls on all of them alike.
    """
    for side in sides:
        side()  # warm-up
    settle()
    n, rates = len(sides), []
    for _ in range(repeat):
        steps, spent, turn = [0] * n, [0.0] * n, 0
        while min(spent) < seconds:
            for i in range(n):
                k = (turn + i) % n
                start = time.perf_counter()
                steps[k] += sides[k]()
                spent[k] += time.perf_counter() - start
            turn += 1
        rates.append([taken / t for taken, t in zip(steps, spent, strict=True)])
    return rates


@contextlib.contextmanager
def vector_side(env_fn, make_agent) -> Iterator[Callable[[], int]]:
    """A one-process `SyncVectorEnv` of 16 with its own agent, as a side of `rates_by_turns`.

    Each call takes `HORIZON` vector steps.
    """
    envs = gym.vector.SyncVectorEnv(
        [env_fn] * N_ALL, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    agent = make_agent()
    state = {"obs": envs.reset(seed=0)[0]}

    def vector_steps() -> int:
        for _ in range(HORIZON):
            state["obs"], *_ = envs.step(agent.sample(state["obs"]))
        return HORIZON * N_ALL

    try:
        yield vector_steps
    finally:
        envs.close()


def interleaved(env_fn, make_agent, seconds: float, repeat: int) -> dict[str, list[float]]:
    """Each `COMPARED` sampler's env steps/s in each of `repeat` repetitions, taking turns.

    The samplers are open at once (each with its own agent and workers) and collect one batch
    each in turn (`rates_by_turns`).
    """
    with contextlib.ExitStack() as stack:
        samplers = [
            stack.enter_context(
                cls(
                    env_fn,
                    make_agent(),
                    num_workers=WORKERS,
                    envs_per_worker=ENVS_PER_WORKER,
                    horizon=HORIZON,
                    seed=0,
                    **kwargs,
                )
            )
            for cls, kwargs in COMPARED.values()
        ]
        sides = [functools.partial(collect_size, sampler) for sampler in samplers]
        rates = rates_by_turns(sides, seconds, repeat)
    return {label: [rate[k] for rate in rates] for k, label in enumerate(COMPARED)}


def collect_size(sampler) -> int:
    """One `collect()` of `sampler`; the env steps it took."""
    return sampler.collect().rewards.size


def parallel_over_sync(env_fn, make_agent, seconds: float, repeat: int) -> list[float]:
    """ParallelSampler 2x8 over a one-process `SyncVectorEnv` of 16, by turns, per repetition.

    Both open at once, each with its own agent, one `collect()` (or `HORIZON` vector steps)
    each in turn until each has spent `seconds` in the repetition.
    """
    with (
        vector_side(env_fn, make_agent) as vector_steps,
        ParallelSampler(
            env_fn, make_agent(), WORKERS, ENVS_PER_WORKER, horizon=HORIZON, seed=0
        ) as sampler,
    ):
        rates = rates_by_turns(
            [vector_steps, functools.partial(collect_size, sampler)], seconds, repeat
        )
    return [parallel / sync for sync, parallel in rates]


def zero_copy_over_copy(env_fn, make_agent, seconds: float, repeat: int) -> list[tuple]:
    """Shared batches against the copy path, and each against `SyncVectorEnv`, by turns.

    One `ParallelSampler` collects with its batches in shared memory and with the copy path
    (`_zero_copy`) in turn, and a one-process `SyncVectorEnv` of 16 takes its turns too
    (`rates_by_turns`). Returns `(shared / copy, shared / sync, copy / sync)` of each
    repetition.
    """
    with (
        vector_side(env_fn, make_agent) as vector_steps,
        ParallelSampler(
            env_fn, make_agent(), WORKERS, ENVS_PER_WORKER, horizon=HORIZON, seed=0
        ) as sampler,
    ):

        def collect(zero_copy: bool) -> int:
            sampler._zero_copy = zero_copy
            return collect_size(sampler)

        sides = [vector_steps, functools.partial(collect, True), functools.partial(collect, False)]
        rates = rates_by_turns(sides, seconds, repeat)
    return [(shared / copy, shared / sync, copy / sync) for sync, shared, copy in rates]


def compare_line(rates: dict[str, list[float]], i: int) -> tuple[float, ...]:
    """Repetition `i`'s rate of each `COMPARED` sampler but the first over ParallelSampler's."""
    parallel = rates["ParallelSampler 2x8"][i]
    return tuple(rates[label][i] / parallel for label in list(COMPARED)[1:])


def crossover(seconds: float, repeat: int) -> None:
    """The alternating mode against the plain one with the MLP, as env steps cost more."""
    per_iteration = loop_us()
    print()
    print(
        f"Crossover: CartPole-v1 with the MLP 64x64, extra work in every env step "
        f"(a loop's iterations, {per_iteration * 1000:.0f} ns each here), median of {repeat}:"
    )
    print(
        "| extra work per env step | CentralSampler / ParallelSampler "
        "| alternating / ParallelSampler | alternating / CentralSampler | load |"
    )
    print("|---:|---:|---:|---:|---|")
    space = gym.spaces.Discrete(2)
    for extra_us in (0, 10, 25, 50, 100, 200):
        work = round(extra_us / per_iteration)
        before = load()
        rates = interleaved(
            functools.partial(make_busy_cartpole, work),
            functools.partial(TorchAgent, space, (4,)),
            seconds,
            repeat,
        )
        central, alternating, *_ = zip(
            *(compare_line(rates, i) for i in range(repeat)), strict=True
        )
        versus = [a / c for a, c in zip(alternating, central, strict=True)]
        print(
            f"| {extra_us} µs ({work} iterations) | {statistics.median(central):.2f}x "
            f"| {statistics.median(alternating):.2f}x "
            f"| {statistics.median(versus):.2f}x ({spread(versus)}) | {before} -> {load()} |",
            flush=True,
        )


def envpool_cell(python: str | None, task: str, seconds: float) -> float | None:
    """envpool's rate on `task` (16 envs, 2 threads, random actions); None where it cannot run."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from envpool_rate import TASKS, envpool_rate

    if task not in TASKS:
        return None
    settle()
    if installed("envpool"):
        return envpool_rate(task, seconds, N_ALL, WORKERS, HORIZON)
    if python is None:
        return None
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "envpool_rate.py")
    command = [python, "-W", "ignore", script, task, "--seconds", str(seconds)]
    command += ["--num-envs", str(N_ALL), "--threads", str(WORKERS), "--horizon", str(HORIZON)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 300)
    if done.returncode != 0:
        print(f"envpool row failed: {done.stderr.strip()[-300:]}")
        return None
    return float(done.stdout.split()[-1])


def _plain_process(env_fn, n: int, seconds: float, out) -> None:
    envs = [env_fn() for _ in range(n)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
        env.action_space.seed(i)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for env in envs:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        steps += n
    out.put(steps / (time.perf_counter() - start))


def plain_rate(env_fn, processes: int, n: int, seconds: float) -> float:
    """Env steps/s of `processes` plain processes stepping `n` envs each, random actions."""
    settle()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_plain_process, args=(env_fn, n, seconds, out)) for _ in range(processes)
    ]
    for p in procs:
        p.start()
    rates = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return sum(rates)


def _plain_server(env_fn, n: int, seed: int, conn) -> None:
    """A plain process of `n` envs that takes `HORIZON` random steps of each per request."""
    envs = [env_fn() for _ in range(n)]
    agent = RandomAgent(envs[0].action_space, seed)
    obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
    conn.send(True)
    while conn.recv():
        for _ in range(HORIZON):
            for j, (env, action) in enumerate(zip(envs, agent.sample(obs), strict=True)):
                obs[j], _, terminated, truncated, _ = env.step(action)
                if terminated or truncated:
                    obs[j] = env.reset()[0]
        conn.send(HORIZON * n)
    for env in envs:
        env.close()


@contextlib.contextmanager
def plain_side(env_fn, processes: int, n: int) -> Iterator[Callable[[], int]]:
    """`processes` plain processes of `n` envs each, as a side of `rates_by_turns`.

    No framework: each call sends every process one request over a pipe, and each takes
    `HORIZON` steps of its envs with random actions (numpy's generator, as `RandomAgent`) and
    answers. Two processes of 8 envs against one of 16, by turns, is the machine's own
    ceiling for a two-worker sampler on this task.
    """
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    try:
        for i in range(processes):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_plain_server, args=(env_fn, n, i * n, theirs), daemon=True)
            proc.start()
            pipes.append(ours)
            procs.append(proc)
        for pipe in pipes:
            if not pipe.poll(120):
                raise RuntimeError("a plain process did not start within 120 s")
            pipe.recv()

        def plain_steps() -> int:
            for pipe in pipes:
                pipe.send(True)
            return sum(pipe.recv() for pipe in pipes)

        yield plain_steps
    finally:
        for pipe in pipes:
            with contextlib.suppress(OSError):
                pipe.send(False)
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)


def ceiling_over_sync(env_fn, make_agent, seconds: float, repeat: int) -> list[tuple]:
    """ParallelSampler 2x8 against the machine's two-process ceiling on a task, by turns.

    Four sides take turns: a one-process `SyncVectorEnv` of 16, one plain process of 16 envs,
    two plain processes of 8 (`plain_side`), and `ParallelSampler` 2x8, random actions.
    Returns `(two plain / one plain, parallel / sync, parallel / two plain)` of each
    repetition: the first is what two cores give over one here with no framework at all.
    """
    with (
        vector_side(env_fn, make_agent) as vector_steps,
        plain_side(env_fn, 1, N_ALL) as one_plain,
        plain_side(env_fn, WORKERS, ENVS_PER_WORKER) as two_plain,
        ParallelSampler(
            env_fn, make_agent(), WORKERS, ENVS_PER_WORKER, horizon=HORIZON, seed=0
        ) as sampler,
    ):
        sides = [vector_steps, one_plain, two_plain, functools.partial(collect_size, sampler)]
        rates = rates_by_turns(sides, seconds, repeat)
    return [(two / one, par / sync, par / two) for sync, one, two, par in rates]


RATIO_TABLES = {
    "zero_copy": (
        zero_copy_over_copy,
        "ParallelSampler 2x8, random actions, by turns",
        ["shared / copy", "shared / SyncVectorEnv", "copy / SyncVectorEnv"],
    ),
    "ceiling": (
        ceiling_over_sync,
        "Two cores against one, random actions, by turns",
        [
            "2 plain processes / 1 (the ceiling)",
            "ParallelSampler / SyncVectorEnv",
            "ParallelSampler / 2 plain processes",
        ],
    ),
}
"""The tables of `--zero-copy` and `--ceiling`: mode -> (measure, title, its ratios' names)."""


def ratio_table(tasks: list, mode: str, seconds: float, repeat: int) -> None:
    """Each task's `RATIO_TABLES[mode]` measure (a tuple of ratios a repetition), printed.

    Random actions; a line per task as it is measured, then the table of medians (each
    repetition's ratio in brackets) under `title`, one column a ratio.
    """
    measure, title, columns = RATIO_TABLES[mode]
    results = []
    for name, env_fn, *_ in tasks:
        probe = env_fn()
        space = probe.action_space
        probe.close()
        before = load()
        lines = measure(env_fn, lambda space=space: RandomAgent(space), seconds, repeat)
        results.append((name, lines, f"{before} -> {load()}"))
        each = "; ".join(spread(list(values)) for values in zip(*lines, strict=True))
        print(f"{name:14} {'; '.join(columns)}: {each}", flush=True)
    print()
    print(f"{title}, median of {repeat} repetitions (each repetition's ratio in brackets):")
    print("| task | " + " | ".join(columns) + " | load |")
    print("|---|" + "---:|" * len(columns) + "---|")
    for name, lines, loads in results:
        cells = [
            f"{statistics.median(values):.2f}x ({spread(values)})"
            for values in zip(*lines, strict=True)
        ]
        print(f"| {name} | " + " | ".join(cells) + f" | {loads} |")


N_ALL = WORKERS * ENVS_PER_WORKER
CELLS = [
    ("SyncVectorEnv (1 process)", functools.partial(vector_rate, "sync", n=N_ALL)),
    ("AsyncVectorEnv (16 processes)", functools.partial(vector_rate, "async", n=N_ALL)),
    ("SB3 SubprocVecEnv (16 processes)", functools.partial(subproc_rate, n=N_ALL)),
    ("SerialSampler", functools.partial(sampler_rate, SerialSampler)),
    ("ParallelSampler 2x8", functools.partial(sampler_rate, ParallelSampler)),
    ("CentralSampler 2x8", functools.partial(sampler_rate, CentralSampler)),
    (
        "CentralSampler 2x8 alternating",
        functools.partial(sampler_rate, CentralSampler, alternating=True),
    ),
    ("AsyncSampler 2x8", functools.partial(sampler_rate, AsyncSampler)),
]
"""(label, measure(env_fn, agent, seconds) -> env steps/s) of every collector compared."""


def scaling_rates(seconds: float) -> tuple[float, float, float, float]:
    """CartPole, random actions: ParallelSampler with 1 and 2 workers of 8 envs, 1 and 2 plain
    processes of 8 envs (env steps/s each, measured one after the other)."""
    env_fn = TASKS[0][1]
    space = gym.spaces.Discrete(2)
    one = sampler_rate(ParallelSampler, env_fn, RandomAgent(space), seconds, num_workers=1)
    two = sampler_rate(ParallelSampler, env_fn, RandomAgent(space), seconds)
    plain_one = plain_rate(env_fn, 1, ENVS_PER_WORKER, seconds)
    plain_two = plain_rate(env_fn, 2, ENVS_PER_WORKER, seconds)
    print(
        f"scaling: ParallelSampler {one:.0f} -> {two:.0f}, plain processes {plain_one:.0f} -> "
        f"{plain_two:.0f}  load {load()}",
        flush=True,
    )
    return one, two, plain_one, plain_two


def print_scaling(runs: list[tuple[float, float, float, float]]) -> None:
    """The scaling table: each repetition, and the median of ParallelSampler's share."""
    print()
    print("| scaling, CartPole-v1, random actions | 1 x 8 envs | 2 x 8 envs | 2 vs 1 |")
    print("|---|---:|---:|---:|")
    shares = []
    for one, two, plain_one, plain_two in runs:
        print(f"| ParallelSampler (workers) | {one:,.0f} | {two:,.0f} | {two / one:.2f}x |")
        print(
            f"| plain processes | {plain_one:,.0f} | {plain_two:,.0f} "
            f"| {plain_two / plain_one:.2f}x |"
        )
        shares.append((two / one) / (plain_two / plain_one))
    print(
        f"ParallelSampler's scaling against the machine's own, median of {len(runs)}: "
        f"{100 * statistics.median(shares):.0f}% ({', '.join(f'{100 * x:.0f}%' for x in shares)})"
    )


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def spread(values: list[float]) -> str:
    return ", ".join(f"{value:.2f}" for value in values)


def installed(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


TASKS = [
    # (name, env_fn, network agent, its label, the module it needs)
    ("CartPole-v1", functools.partial(gym.make, "CartPole-v1"), TorchAgent, "MLP 64x64", None),
    ("ALE/Pong-v5", make_pong, CNNAgent, "CNN", "ale_py"),
    ("HalfCheetah-v5", make_cheetah, TorchAgent, "MLP 64x64", "mujoco"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per cell")
    parser.add_argument(
        "--tasks", nargs="*", default=[t[0] for t in TASKS], help="which tasks (default: all)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="repetitions of CentralSampler vs ParallelSampler"
    )
    parser.add_argument(
        "--envpool-python", help="a Python with envpool installed (for the envpool rows)"
    )
    parser.add_argument(
        "--crossover", action="store_true", help="also the alternating mode's crossover"
    )
    parser.add_argument(
        "--no-scaling", action="store_true", help="leave out the 1 vs 2 workers scaling rows"
    )
    parser.add_argument(
        "--fixed-spin",
        action="store_true",
        help="also CentralSampler with a fixed 50 µs spin (not adaptive), by turns",
    )
    parser.add_argument(
        "--socket-handoff",
        action="store_true",
        help="also CentralSampler with steps handed over on its socket (not by flags), by turns",
    )
    parser.add_argument(
        "--unpinned",
        action="store_true",
        help="also CentralSampler with its workers left unpinned (pin_workers=False), by turns",
    )
    parser.add_argument(
        "--caller-free",
        action="store_true",
        help="also CentralSampler with pinned workers but its own thread left free, by turns",
    )
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="only ParallelSampler against two plain processes (the machine's ceiling), by turns",
    )
    parser.add_argument(
        "--zero-copy",
        action="store_true",
        help="only ParallelSampler's shared batches against its copy path, by turns",
    )
    args = parser.parse_args()
    if args.fixed_spin:
        COMPARED["CentralSampler 2x8 fixed 50 µs spin"] = (FixedSpinCentralSampler, {})
    if args.unpinned:
        COMPARED["CentralSampler 2x8 unpinned"] = (CentralSampler, {"pin_workers": False})
    if args.caller_free:
        COMPARED["CentralSampler 2x8 caller free"] = (CallerFreeCentralSampler, {})
    if args.socket_handoff:
        COMPARED["CentralSampler 2x8 socket hand-off"] = (SocketCentralSampler, {})
    torch.set_num_threads(1)
    first_load = load()
    print(f"load average before: {first_load}  ({os.cpu_count()} cores)", flush=True)
    parl.connect(cpu_num=len(COMPARED) * WORKERS, log_to_driver=False)
    cells = [cell for cell in CELLS if "SB3" not in cell[0] or installed("stable_baselines3")]
    if len(cells) < len(CELLS):
        print("stable-baselines3 is not installed: no SubprocVecEnv rows")
    tasks = []
    for task in TASKS:
        if task[0] not in args.tasks:
            continue
        if task[4] is not None and not installed(task[4]):
            print(f"{task[4]} is not installed: no {task[0]} rows")
            continue
        tasks.append(task)
    for mode in RATIO_TABLES:
        if getattr(args, mode):
            ratio_table(tasks, mode, args.seconds, args.repeat)
            print(f"load average after: {load()}")
            parl.disconnect()
            return
    rows, ratios, versus_sync = [], [], []
    for name, env_fn, network, network_label, _ in tasks:
        probe = env_fn()
        space, obs_shape = probe.action_space, probe.observation_space.shape
        probe.close()
        for agent_name in ("random", network_label):
            random = agent_name == "random"

            def make_agent(random=random, space=space, obs_shape=obs_shape, network=network):
                return RandomAgent(space) if random else network(space, obs_shape)

            rates = {}
            for label, measure in cells:
                rate = rates[label] = measure(env_fn, make_agent(), args.seconds)
                base = rates[cells[0][0]]
                rows.append((name, agent_name, label, rate, rate / base))
                line = f"{name:14} {agent_name:9} {label:34} {rate:10.0f} steps/s"
                print(f"{line}  {rate / base:5.2f}x", flush=True)
            if random:
                rate = envpool_cell(args.envpool_python, name, args.seconds)
                if rate is not None:
                    label = "envpool (2 threads; Pong: 84x84 gray)"
                    base = rates[cells[0][0]]
                    rows.append((name, agent_name, label, rate, rate / base))
                    line = f"{name:14} {agent_name:9} {label:34} {rate:10.0f} steps/s"
                    print(f"{line}  {rate / base:5.2f}x", flush=True)
            if random:
                before = load()
                over_sync = parallel_over_sync(env_fn, make_agent, args.seconds, args.repeat)
                print(
                    f"{'':14} ParallelSampler / SyncVectorEnv by turns: {spread(over_sync)}"
                    f"  load {before} -> {load()}",
                    flush=True,
                )
                versus_sync.append((name, over_sync))
            before = load()
            compared = interleaved(env_fn, make_agent, args.seconds, args.repeat)
            lines = [compare_line(compared, i) for i in range(args.repeat)]
            columns = [list(values) for values in zip(*lines, strict=True)]
            print(
                f"{'':14} over ParallelSampler by turns: "
                + "; ".join(spread(values) for values in columns)
                + f"  load {before} -> {load()}",
                flush=True,
            )
            ratios.append((name, agent_name, columns))
    scaling = [] if args.no_scaling else [scaling_rates(args.seconds) for _ in range(args.repeat)]
    print()
    print("| task | agent | collector | env steps/s | vs SyncVectorEnv |")
    print("|---|---|---|---:|---:|")
    for name, agent_name, label, rate, ratio in rows:
        print(f"| {name} | {agent_name} | {label} | {rate:,.0f} | {ratio:.2f}x |")
    print()
    print(
        f"CentralSampler / ParallelSampler by turns, median of {args.repeat} repetitions "
        "(each repetition's ratio in brackets):"
    )
    labels = list(COMPARED)[1:]
    print("| task | agent | " + " | ".join(f"{label} / ParallelSampler" for label in labels) + " |")
    print("|---|---|" + "---:|" * len(labels))
    for name, agent_name, columns in ratios:
        medians = [f"{statistics.median(values):.2f}x ({spread(values)})" for values in columns]
        print(f"| {name} | {agent_name} | " + " | ".join(medians) + " |")
    print()
    print()
    print(f"ParallelSampler / SyncVectorEnv by turns, random actions, median of {args.repeat}:")
    for name, over_sync in versus_sync:
        print(f"| {name} | {statistics.median(over_sync):.2f}x ({spread(over_sync)}) |")
    if scaling:
        print_scaling(scaling)
    if args.crossover:
        crossover(args.seconds, args.repeat)
    after = load()
    print(f"load average after: {after}")
    parl.disconnect()
    path = record_rows(rows, versus_sync, cells[0][0], args.repeat, f"{first_load} -> {after}")
    if path:
        print(f"result rows: {path}")


def record_rows(rows: list, versus_sync: list, base: str, repeat: int, loads: str) -> str | None:
    """Write each collector's rate against the first cell's, and the by-turns ratios."""
    results = []
    for name, agent_name, label, rate, _ in rows:
        if label == base:
            base_rate = rate
            continue
        results.append(
            Row(
                task=name,
                algorithm=label if agent_name == "random" else f"{label}, {agent_name}",
                metric="env steps per second",
                better="higher",
                ours=round(rate),
                peer=f"gymnasium {base}",
                peer_value=round(base_rate),
                seeds=[],
                command=command_line(),
                note=f"16 environments; load average {loads}.",
            )
        )
    for name, over_sync in versus_sync:
        results.append(
            Row(
                task=name,
                algorithm="ParallelSampler 2x8",
                metric="env steps per second, relative to the peer",
                better="higher",
                ours=None,
                peer=f"gymnasium {base}, by turns",
                peer_value=None,
                seeds=[],
                command=command_line(),
                note=f"Median of {repeat} repetitions ({spread(over_sync)}); load {loads}.",
                ratio=round(statistics.median(over_sync), 3),
            )
        )
    return record("samplers", results)


if __name__ == "__main__":
    main()

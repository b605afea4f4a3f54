"""Env steps per second collected by the samplers, against gymnasium's vector envs, one run.

16 environments in all (2 workers x 8 for the cluster samplers), with a random-action agent and
a small-MLP agent (two hidden layers of 64, torch, one thread), on CartPole-v1 and, when
`ale-py` is installed, ALE Pong-v5 (random actions; RGB frames). Baselines measured in the same
run: gymnasium's `SyncVectorEnv` (one process) and `AsyncVectorEnv` (a process per env), driven
by the same agent. Scaling: `ParallelSampler` with 1 and with 2 workers of 8 environments,
against 1 and 2 plain processes stepping 8 environments each with no framework (the machine's
own ceiling). Prints the table and the load average before and after (a shared machine's
figures mean little without it).

    python benchmarks/samplers.py                 # about five minutes
    python benchmarks/samplers.py --seconds 2     # a quicker look
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

import parl
from parl.samplers import AsyncSampler, CentralSampler, ParallelSampler, SerialSampler

WORKERS, ENVS_PER_WORKER, HORIZON = 2, 8, 64


class RandomAgent:
    """Uniformly random actions from the action space's `n` choices (numpy)."""

    def __init__(self, obs_dim: int, n: int, seed: int = 0) -> None:
        self.n = n
        self.rng = np.random.default_rng(seed)

    def sample(self, obs: np.ndarray) -> np.ndarray:
        return self.rng.integers(self.n, size=len(obs))

    def get_weights(self) -> dict:
        return {}

    def set_weights(self, weights: dict) -> None:
        pass


class MLPAgent:
    """A small policy network (64 x 64, tanh), actions drawn from its logits (torch)."""

    def __init__(self, obs_dim: int, n: int) -> None:
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(obs_dim, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, 64),
            torch.nn.Tanh(),
            torch.nn.Linear(64, n),
        )

    @torch.no_grad()
    def sample(self, obs: np.ndarray) -> np.ndarray:
        logits = self.net(torch.as_tensor(obs, dtype=torch.float32).reshape(len(obs), -1))
        return torch.distributions.Categorical(logits=logits).sample().numpy()

    def get_weights(self) -> dict:
        return {k: v.numpy() for k, v in self.net.state_dict().items()}

    def set_weights(self, weights: dict) -> None:
        self.net.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})


def make_pong() -> gym.Env:
    import ale_py

    gym.register_envs(ale_py)
    return gym.make("ALE/Pong-v5")


def timed(step: Callable[[], int], seconds: float) -> float:
    """Call `step` (returns env steps taken) for about `seconds` after one warm-up; steps/s."""
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


def sampler_rate(cls, env_fn, agent, seconds: float, **kwargs) -> float:
    kwargs = {"num_workers": WORKERS, "envs_per_worker": ENVS_PER_WORKER, **kwargs}
    with cls(env_fn, agent, horizon=HORIZON, seed=0, **kwargs) as sampler:

        def step() -> int:
            batch = sampler.collect()
            return batch.rewards.size

        return timed(step, seconds)


def _plain_process(env_fn, n: int, seconds: float, out) -> None:
    envs = [env_fn() for _ in range(n)]
    rng = np.random.default_rng(0)
    for i, env in enumerate(envs):
        env.reset(seed=i)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for env in envs:
            _, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            if terminated or truncated:
                env.reset()
        steps += n
    out.put(steps / (time.perf_counter() - start))


def plain_rate(env_fn, processes: int, n: int, seconds: float) -> float:
    """Env steps/s of `processes` plain processes stepping `n` envs each, random actions."""
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


N_ALL = WORKERS * ENVS_PER_WORKER
CELLS = [
    ("SyncVectorEnv (1 process)", functools.partial(vector_rate, "sync", n=N_ALL)),
    ("AsyncVectorEnv (16 processes)", functools.partial(vector_rate, "async", n=N_ALL)),
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


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="measuring time per cell")
    parser.add_argument("--no-pong", action="store_true", help="CartPole only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average before: {load()}  ({os.cpu_count()} cores)", flush=True)
    parl.connect(cpu_num=WORKERS + 1, log_to_driver=False)
    tasks = [("CartPole-v1", functools.partial(gym.make, "CartPole-v1"), ("random", "mlp"))]
    if not args.no_pong:
        try:
            import ale_py  # noqa: F401
        except ImportError:
            print("ale-py is not installed: CartPole only")
        else:
            tasks.append(("ALE/Pong-v5", make_pong, ("random",)))
    rows = []
    for name, env_fn, agents in tasks:
        probe = env_fn()
        n_actions, obs_dim = probe.action_space.n, int(np.prod(probe.observation_space.shape))
        probe.close()
        for agent_name in agents:
            base = None
            for label, measure in CELLS:
                make = RandomAgent if agent_name == "random" else MLPAgent
                rate = measure(env_fn, make(obs_dim, n_actions), args.seconds)
                base = base or rate
                rows.append((name, agent_name, label, rate, rate / base))
                line = f"{name:12} {agent_name:6} {label:32} {rate:10.0f} steps/s"
                print(f"{line}  {rate / base:5.2f}x", flush=True)
    # Scaling: 1 vs 2 workers against 1 vs 2 plain processes (random actions, CartPole).
    env_fn = tasks[0][1]
    one = sampler_rate(ParallelSampler, env_fn, RandomAgent(4, 2), args.seconds, num_workers=1)
    two = sampler_rate(ParallelSampler, env_fn, RandomAgent(4, 2), args.seconds)
    plain_one = plain_rate(env_fn, 1, ENVS_PER_WORKER, args.seconds)
    plain_two = plain_rate(env_fn, 2, ENVS_PER_WORKER, args.seconds)
    print()
    print("| task | agent | collector | env steps/s | vs SyncVectorEnv |")
    print("|---|---|---|---:|---:|")
    for name, agent_name, label, rate, ratio in rows:
        print(f"| {name} | {agent_name} | {label} | {rate:,.0f} | {ratio:.2f}x |")
    print()
    print("| scaling, CartPole-v1, random actions | 1 x 8 envs | 2 x 8 envs | 2 vs 1 |")
    print("|---|---:|---:|---:|")
    print(f"| ParallelSampler (workers) | {one:,.0f} | {two:,.0f} | {two / one:.2f}x |")
    print(
        f"| plain processes | {plain_one:,.0f} | {plain_two:,.0f} | {plain_two / plain_one:.2f}x |"
    )
    print(
        f"ParallelSampler's scaling is {100 * (two / one) / (plain_two / plain_one):.0f}% of "
        "the machine's own"
    )
    print(f"load average after: {load()}")
    parl.disconnect()


if __name__ == "__main__":
    main()

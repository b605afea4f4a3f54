"""Env steps per second of envpool (C++ threads, random actions): the samplers benchmark's row.

It needs only numpy and envpool, so that it runs in a Python of its own: envpool is never a
dependency of the project. `benchmarks/samplers.py` imports it where envpool is importable, and
otherwise runs this file with the Python given by `--envpool-python` (a virtual environment
with `pip install envpool`). Prints the rate, one number.

    python benchmarks/envpool_rate.py CartPole-v1 --seconds 3 --num-envs 16 --threads 2
"""

from __future__ import annotations

import argparse
import time

import numpy as np

TASKS = {"CartPole-v1": "CartPole-v1", "ALE/Pong-v5": "Pong-v5"}
"""The benchmark's task names -> envpool's (Pong: envpool's own 84x84 grayscale frames)."""


def envpool_rate(task: str, seconds: float, num_envs: int, threads: int, horizon: int) -> float:
    """Env steps/s of `num_envs` envpool environments on `threads` threads, random actions."""
    import envpool

    envs = envpool.make_gymnasium(
        TASKS[task], num_envs=num_envs, batch_size=num_envs, num_threads=threads, seed=0
    )
    rng = np.random.default_rng(0)
    space = envs.action_space
    envs.reset()

    def step() -> int:
        for _ in range(horizon):
            if hasattr(space, "n"):
                actions = rng.integers(space.n, size=num_envs)
            else:
                actions = rng.uniform(space.low, space.high, (num_envs, *space.shape))
            envs.step(actions.astype(space.dtype))
        return horizon * num_envs

    step()
    steps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        steps += step()
    envs.close()
    return steps / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--horizon", type=int, default=64)
    args = parser.parse_args()
    print(envpool_rate(args.task, args.seconds, args.num_envs, args.threads, args.horizon))


if __name__ == "__main__":
    main()

"""Samplers: collecting experience from many environments, apart from learning (`parl.samplers`).

Every sampler steps `num_workers * envs_per_worker` environments `horizon` steps per
`collect()` and returns a `Batch` of numpy arrays, time-major, with worker-major columns
(worker `w`'s environment `j` is column `w * envs_per_worker + j`):

- `SerialSampler`: every environment in the calling process (no cluster);
- `ParallelSampler`: worker actors, each with a copy of the agent, collect on their own;
- `CentralSampler`: worker actors only step environments; the caller chooses all actions with
  one `agent.sample` call a step (optionally alternating two groups of workers);
- `AsyncSampler`: worker actors with agent copies collect continuously; `collect()` returns the
  next batch any worker finished, with its worker and weights version.

Column `k` is reset with `seed + k` on its first reset, later resets are automatic (in the step
that ends an episode) and unseeded. With `restart=True` the three cluster samplers replace a
worker that dies by a new actor with the last weights sent (`SamplerWorkerError`: the worker's
own environment kept failing); the replacement's column `k` is first reset with
`seed + k + RESTART_SEED_STRIDE * r` (1_000_003), `r` being how many times that worker was
replaced. With a deterministic agent the three return the same batches, bit for bit. Workers
on the caller's host hand their rollouts over through shared memory (`/dev/shm`); workers on
other hosts through the ordinary call path.

`from parl.samplers import SerialSampler, Batch` reaches this module.
"""

from __future__ import annotations

from parl_algos.samplers._async import AsyncSampler
from parl_algos.samplers._central import CentralSampler
from parl_algos.samplers._core import Batch
from parl_algos.samplers._group import (
    RESTART_SEED_STRIDE,
    Replacements,
    RestartWindow,
    SamplerWorkerError,
)
from parl_algos.samplers._parallel import ParallelSampler
from parl_algos.samplers._serial import SerialSampler

__all__ = [
    "AsyncSampler",
    "Batch",
    "CentralSampler",
    "ParallelSampler",
    "RESTART_SEED_STRIDE",
    "Replacements",
    "RestartWindow",
    "SamplerWorkerError",
    "SerialSampler",
]

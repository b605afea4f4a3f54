"""Samplers: collecting experience from many environments, apart from learning (`parl.samplers`).

Every sampler steps `num_workers * envs_per_worker` environments `horizon` steps per
`collect()` and returns a `Batch` of numpy arrays, time-major, with worker-major columns
(worker `w`'s environment `j` is column `w * envs_per_worker + j`):

- `SerialSampler`: every environment in the calling process (no cluster);

Column `k` is reset with `seed + k` on its first reset, later resets are automatic (in the step
that ends an episode) and unseeded.

`from parl.samplers import SerialSampler, Batch` reaches this module.
"""

from __future__ import annotations

from parl_algos.samplers._core import Batch
from parl_algos.samplers._serial import SerialSampler

__all__ = ["Batch", "SerialSampler"]

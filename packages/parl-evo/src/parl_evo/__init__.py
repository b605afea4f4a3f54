"""parl_evo: evolution strategies with seeded noise (EvoKit in Python), exposed as `parl.evo`.

- Seeded noise: `SamplingInfo` names a perturbation; `SeedNoise` and the shared `NoiseTable`
  regenerate it bit for bit in any process.
- Solvers (ask / candidate / tell, rewards maximized): `GaussianES` (OpenAI-ES), `CMAES`,
  `SepCMAES`, `GA`; optimizers `SGD`, `Momentum`, `Adam` for the gradient-based ES.
- `ESAgent`: EvoKit's workflow (`clone`, `add_noise`, `predict`, `update`, `save_solver`,
  `load_solver`) over a numpy vector or a torch module, configured by `ESConfig` (TOML/YAML).
- The sample log (`SampleLogWriter`, `read_sample_log`): online sampling, offline update.

Importing this package never imports torch.
"""

from __future__ import annotations

from parl_evo._agent import ESAgent, make_optimizer, make_solver
from parl_evo._cma import CMAES, SepCMAES
from parl_evo._config import AsyncConfig, ESConfig, OptimizerConfig, SamplingConfig, SolverConfig
from parl_evo._es import GaussianES
from parl_evo._exceptions import (
    ConfigError,
    EvoError,
    FutureSampleError,
    NoiseTableError,
    NoUsableSamplesError,
    SampleError,
    SampleLogCorruptError,
    SampleLogError,
    SampleLogTruncatedError,
    SolverStateError,
)
from parl_evo._ga import GA
from parl_evo._log import SampleBatch, SampleLogWriter, read_sample_log
from parl_evo._noise import (
    NoiseSource,
    NoiseTable,
    SamplingInfo,
    SeedNoise,
    default_table_directory,
)
from parl_evo._optimizers import SGD, Adam, Momentum, Optimizer
from parl_evo._solver import Solver, UpdateStats, centered_ranks

__all__ = [
    "Adam",
    "AsyncConfig",
    "CMAES",
    "ConfigError",
    "ESAgent",
    "ESConfig",
    "EvoError",
    "FutureSampleError",
    "GA",
    "GaussianES",
    "Momentum",
    "NoUsableSamplesError",
    "NoiseSource",
    "NoiseTable",
    "NoiseTableError",
    "Optimizer",
    "OptimizerConfig",
    "SGD",
    "SampleBatch",
    "SampleError",
    "SampleLogCorruptError",
    "SampleLogError",
    "SampleLogTruncatedError",
    "SampleLogWriter",
    "SamplingConfig",
    "SamplingInfo",
    "SeedNoise",
    "SepCMAES",
    "Solver",
    "SolverConfig",
    "SolverStateError",
    "UpdateStats",
    "centered_ranks",
    "default_table_directory",
    "make_optimizer",
    "make_solver",
    "read_sample_log",
]

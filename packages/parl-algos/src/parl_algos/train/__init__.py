"""`parl-train`: one config-driven command that trains every algorithm of the zoo.

Configs are TOML files shipped in `parl_algos/configs/<algorithm>/<env>.toml` (or a user's
own), read and checked by `load_config`, overridden key by key with `apply_override`;
`run_single` trains one in this process and writes its run directory (config, TensorBoard
events, progress.csv, learning curve, checkpoints, log); `main` is the command line.
"""

from __future__ import annotations

from parl_algos.train._algorithms import SPECS, AlgorithmSpec, Learner, get_spec
from parl_algos.train._cli import main
from parl_algos.train._config import (
    Config,
    ConfigError,
    TrainSection,
    apply_override,
    dump_config,
    load_config,
    shipped_configs,
)
from parl_algos.train._offline import OfflineEnvSection, make_sac_dataset, scale_rewards
from parl_algos.train._runner import ProgressLog, RunResult, latest_checkpoint, run_single

__all__ = [
    "AlgorithmSpec",
    "Config",
    "ConfigError",
    "Learner",
    "OfflineEnvSection",
    "ProgressLog",
    "RunResult",
    "SPECS",
    "TrainSection",
    "apply_override",
    "dump_config",
    "get_spec",
    "latest_checkpoint",
    "load_config",
    "main",
    "make_sac_dataset",
    "run_single",
    "scale_rewards",
    "shipped_configs",
]

"""`parl-train`: one config-driven command that trains every algorithm of the zoo.

Configs are TOML files shipped in `parl_algos/configs/<algorithm>/<env>.toml` (or a user's
own), read and checked by `load_config`, overridden key by key with `apply_override`; `run`
trains one in this process with its algorithm's `Trainer` and writes its run directory
(config, TensorBoard events, progress.csv, learning curve, checkpoints, log); `main` is the
command line.

The modules read top-down: the command line (`_cli`) imports the spec registry (`_registry`),
the run skeleton (`_skeleton`) and the export of a run's policy (`_export`); the registry
imports the families' Trainers (`_on_policy`, `_off_policy`, `_a3c`, `_recurrent`, `_marl`,
`_offline`); below them lie the parts they share
(`_spec`: specs and the `Trainer` protocol; `_run`: the run's rows and checkpoints schedule;
`_envs`: environments, samplers and the cluster; `_evaluator`, `_apex`, `_marl_actors`) and
the configs (`_config`).
"""

from __future__ import annotations

from parl_algos.train._cli import main
from parl_algos.train._config import (
    Config,
    ConfigError,
    TrainSection,
    apply_override,
    dump_config,
    shipped_configs,
)
from parl_algos.train._offline import OfflineEnvSection, make_sac_dataset, scale_rewards
from parl_algos.train._registry import SPECS, get_spec, load_config
from parl_algos.train._run import ProgressLog, Run, RunResult, latest_checkpoint
from parl_algos.train._skeleton import run
from parl_algos.train._spec import AlgorithmSpec, Learner, Trainer

__all__ = [
    "AlgorithmSpec",
    "Config",
    "ConfigError",
    "Learner",
    "OfflineEnvSection",
    "ProgressLog",
    "Run",
    "RunResult",
    "SPECS",
    "TrainSection",
    "Trainer",
    "apply_override",
    "dump_config",
    "get_spec",
    "latest_checkpoint",
    "load_config",
    "main",
    "make_sac_dataset",
    "run",
    "scale_rewards",
    "shipped_configs",
]

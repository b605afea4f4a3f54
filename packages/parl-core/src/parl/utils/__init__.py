"""`parl.utils`: the utilities researchers use every day.

- `logger`: readable, timestamped logging; `logger.set_dir(d)` also writes `d/log.log`.
- `summary`: TensorBoard scalars and histograms (`summary.add_scalar(tag, value, step)`).
- `ReplayMemory`: a numpy ring buffer of transitions for off-policy algorithms; it samples
  a `Batch` (a NamedTuple: `obs, act, reward, next_obs, terminal`).
- `PrioritizedReplayMemory`: a `ReplayMemory` sampled in proportion to TD-error priorities; it
  samples a `PrioritizedBatch` (a `Batch`'s fields plus `weights` and `indices`).
- `NStepAdder`: folds single steps into n-step transitions on their way into a memory, which
  then stores each one's bootstrap discount and samples `NStepBatch`es
  (`PrioritizedNStepBatch`es), a batch's fields plus `discount`.
- `OfflineDataset`: a fixed dataset of transitions for offline RL (`.npz`, a replay memory, or
  minari), sampled in the same `Batch`es.
- `machine_info`: CPU and GPU counts, the machine's address, a free TCP port.
- `parse_args`: a command line from a `@dataclass` of settings (the examples' `Args`).
- `require`, `optional_import`, `progress_bar`: optional packages fail early with the command
  that installs them, or degrade with one warning.

None of these import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from parl.utils import machine_info, summary
    from parl.utils._args import parse_args
    from parl.utils._logger import logger
    from parl.utils._n_step import NStepAdder
    from parl.utils._offline_dataset import OfflineDataset
    from parl.utils._optional import optional_import, progress_bar, require
    from parl.utils._prioritized_replay_memory import (
        PrioritizedBatch,
        PrioritizedNStepBatch,
        PrioritizedReplayMemory,
    )
    from parl.utils._replay_memory import Batch, NStepBatch, ReplayMemory

__all__ = [
    "Batch",
    "NStepAdder",
    "NStepBatch",
    "OfflineDataset",
    "PrioritizedBatch",
    "PrioritizedNStepBatch",
    "PrioritizedReplayMemory",
    "ReplayMemory",
    "logger",
    "machine_info",
    "optional_import",
    "parse_args",
    "progress_bar",
    "require",
    "summary",
]

_LAZY: dict[str, tuple[str, str | None]] = {
    "Batch": ("parl.utils._replay_memory", "Batch"),
    "NStepAdder": ("parl.utils._n_step", "NStepAdder"),
    "NStepBatch": ("parl.utils._replay_memory", "NStepBatch"),
    "PrioritizedBatch": ("parl.utils._prioritized_replay_memory", "PrioritizedBatch"),
    "PrioritizedNStepBatch": ("parl.utils._prioritized_replay_memory", "PrioritizedNStepBatch"),
    "OfflineDataset": ("parl.utils._offline_dataset", "OfflineDataset"),
    "PrioritizedReplayMemory": (
        "parl.utils._prioritized_replay_memory",
        "PrioritizedReplayMemory",
    ),
    "ReplayMemory": ("parl.utils._replay_memory", "ReplayMemory"),
    "logger": ("parl.utils._logger", "logger"),
    "machine_info": ("parl.utils.machine_info", None),
    "optional_import": ("parl.utils._optional", "optional_import"),
    "parse_args": ("parl.utils._args", "parse_args"),
    "progress_bar": ("parl.utils._optional", "progress_bar"),
    "require": ("parl.utils._optional", "require"),
    "summary": ("parl.utils.summary", None),
}


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'parl.utils' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

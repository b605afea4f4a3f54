"""`parl.utils`: the utilities researchers use every day.

- `logger`: readable, timestamped logging; `logger.set_dir(d)` also writes `d/log.log`.
- `summary`: TensorBoard scalars and histograms (`summary.add_scalar(tag, value, step)`).
- `ReplayMemory`: a numpy ring buffer of transitions for off-policy algorithms.
- `PrioritizedReplayMemory`: a `ReplayMemory` sampled in proportion to TD-error priorities.
- `OfflineDataset`: a fixed dataset of transitions for offline RL (`.npz`, a replay memory, or
  minari), sampled in `Batch`es.
- `machine_info`: CPU and GPU counts, the machine's address, a free TCP port.
- `parse_args`: a command line from a `@dataclass` of settings (the examples' `Args`).

None of these import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from parl.utils import machine_info, summary
    from parl.utils._args import parse_args
    from parl.utils._logger import logger
    from parl.utils._offline_dataset import Batch, OfflineDataset
    from parl.utils._prioritized_replay_memory import PrioritizedReplayMemory
    from parl.utils._replay_memory import ReplayMemory

__all__ = [
    "Batch",
    "OfflineDataset",
    "PrioritizedReplayMemory",
    "ReplayMemory",
    "logger",
    "machine_info",
    "parse_args",
    "summary",
]

_LAZY: dict[str, tuple[str, str | None]] = {
    "Batch": ("parl.utils._offline_dataset", "Batch"),
    "OfflineDataset": ("parl.utils._offline_dataset", "OfflineDataset"),
    "PrioritizedReplayMemory": (
        "parl.utils._prioritized_replay_memory",
        "PrioritizedReplayMemory",
    ),
    "ReplayMemory": ("parl.utils._replay_memory", "ReplayMemory"),
    "logger": ("parl.utils._logger", "logger"),
    "machine_info": ("parl.utils.machine_info", None),
    "parse_args": ("parl.utils._args", "parse_args"),
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

"""Every algorithm `parl-train` runs, by name: the spec registry, the top of `train/`.

`SPECS` gathers the specs each family module declares (`_on_policy`, `_off_policy`, `_a3c`,
`_recurrent`, `_marl`, `_offline`); `get_spec` looks one up by the name a config gives, and
`load_config` reads a config against it. Only the command line imports this module: below it,
the skeleton and the Trainers get the spec passed in.
"""

from __future__ import annotations

from typing import Any

from parl_algos.train._a3c import ACTOR_SPECS
from parl_algos.train._config import Config, ConfigError
from parl_algos.train._marl import MULTI_AGENT_SPECS
from parl_algos.train._off_policy import OFF_POLICY_SPECS
from parl_algos.train._offline import OFFLINE_SPECS
from parl_algos.train._on_policy import ON_POLICY_SPECS
from parl_algos.train._recurrent import R2D2_SPEC
from parl_algos.train._spec import AlgorithmSpec, read_config

__all__ = ["SPECS", "get_spec", "load_config"]

SPECS: dict[str, AlgorithmSpec] = {
    spec.name: spec
    for spec in (
        *ON_POLICY_SPECS,
        *ACTOR_SPECS,
        R2D2_SPEC,
        *OFF_POLICY_SPECS,
        *OFFLINE_SPECS,
        *MULTI_AGENT_SPECS,
    )
}
"""Every algorithm `parl-train` runs, by the name a config gives."""


def get_spec(name: Any) -> AlgorithmSpec:
    """The spec of algorithm `name` (case-insensitive).

    Raises:
        ConfigError: no algorithm has that name (the message lists those there are).
    """
    for spec in SPECS.values():
        if isinstance(name, str) and spec.name.lower() == name.lower():
            return spec
    raise ConfigError(f"unknown algorithm={name!r}; allowed: {', '.join(SPECS)}")


def load_config(name: str, *, check: bool = True) -> Config:
    """Read and check the config `name` (a shipped `<algorithm>/<env>` or a TOML file's path).

    `check=False` checks the keys and their types only, not the values against what is
    installed and what the algorithm allows (`check_config`): what `parl-train --list` reads.

    Raises:
        ConfigError: unknown algorithm, section or key, or a value of the wrong type.
    """
    return read_config(name, get_spec, check=check)

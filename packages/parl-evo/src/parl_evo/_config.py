"""`ESConfig`: the settings of an `ESAgent`, from a TOML or YAML file or a plain mapping.

The sections and field names follow EvoKit's configuration (`seed`, `gaussian_sampling`,
`optimizer`, `async_es`), with a `solver` section that picks the strategy:

```toml
seed = 1024

[solver]
type = "BASIC_ES"        # BASIC_ES | CMA_ES | SEP_CMA_ES | BASIC_GA
population_size = 0      # 0: the solver's default
weight_decay = 0.0       # BASIC_ES: L2 coefficient
parents = 0              # BASIC_GA: truncation size (0: a fifth of the population)
elites = 1               # BASIC_GA: best parents carried over unchanged

[gaussian_sampling]
std = 0.5                # perturbation std (CMA-ES: the initial step size)
cached = true            # a shared noise table (true) or noise drawn from seeds (false)
cache_size = 100000      # values in the table; at least the number of parameters
mirrored = true          # BASIC_ES: sample +e/-e pairs

[optimizer]              # BASIC_ES only
type = "Adam"            # SGD | Momentum | Adam (any case)
base_lr = 0.05
momentum = 0.9           # Momentum
beta1 = 0.9              # Adam
beta2 = 0.999            # Adam
epsilon = 1e-8           # Adam

[async_es]               # BASIC_ES only; CMA-ES and GA use current-version samples only
max_staleness = 0        # accept samples up to this many versions old
staleness_decay = 1.0    # weight factor per version of age
```
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from parl_evo._exceptions import ConfigError

__all__ = [
    "AsyncConfig",
    "ESConfig",
    "OptimizerConfig",
    "SamplingConfig",
    "SolverConfig",
]

SOLVER_TYPES = ("BASIC_ES", "CMA_ES", "SEP_CMA_ES", "BASIC_GA")
OPTIMIZER_TYPES = ("SGD", "MOMENTUM", "ADAM")


@dataclass(frozen=True, kw_only=True)
class SolverConfig:
    """The `[solver]` section: which strategy, and its population.

    Attributes:
        type: BASIC_ES (OpenAI-ES), CMA_ES, SEP_CMA_ES (diagonal CMA-ES) or BASIC_GA.
        population_size: candidates per generation; 0 for the solver's default.
        weight_decay: BASIC_ES: L2 coefficient on the parameters.
        parents: BASIC_GA: how many of the best become parents; 0 for a fifth of the population.
        elites: BASIC_GA: how many best parents survive unchanged.
    """

    type: str = "BASIC_ES"
    population_size: int = 0
    weight_decay: float = 0.0
    parents: int = 0
    elites: int = 1

    def __post_init__(self) -> None:
        kind = str(self.type).upper()
        if kind not in SOLVER_TYPES:
            raise ConfigError(f"solver.type={self.type!r} is not one of {list(SOLVER_TYPES)}")
        object.__setattr__(self, "type", kind)


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """The `[gaussian_sampling]` section: how perturbations are drawn.

    Attributes:
        std: standard deviation of the perturbations (CMA-ES: its initial step size).
        cached: draw from a shared noise table (`NoiseTable`) instead of from seeds.
        cache_size: the table's number of float32 values; at least the parameter count.
        mirrored: BASIC_ES: sample mirrored pairs `+e, -e`.
    """

    std: float = 1.0
    cached: bool = False
    cache_size: int = 100_000
    mirrored: bool = True

    def __post_init__(self) -> None:
        if not self.std > 0:
            raise ConfigError(f"gaussian_sampling.std={self.std} must be positive")
        if self.cache_size <= 0:
            raise ConfigError(f"gaussian_sampling.cache_size={self.cache_size} must be positive")


@dataclass(frozen=True, kw_only=True)
class OptimizerConfig:
    """The `[optimizer]` section (BASIC_ES): EvoKit's field names and defaults.

    Attributes:
        type: SGD, Momentum or Adam (any case).
        base_lr: the learning rate.
        momentum: Momentum: the velocity decay.
        beta1: Adam: first-moment decay.
        beta2: Adam: second-moment decay.
        epsilon: Adam: denominator guard.
    """

    type: str = "SGD"
    base_lr: float = 1e-3
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8

    def __post_init__(self) -> None:
        kind = str(self.type).upper()
        if kind not in OPTIMIZER_TYPES:
            raise ConfigError(
                f"optimizer.type={self.type!r} is not one of ['SGD', 'Momentum', 'Adam']"
            )
        object.__setattr__(self, "type", kind)


@dataclass(frozen=True, kw_only=True)
class AsyncConfig:
    """The `[async_es]` section: how samples of older parameter versions count (BASIC_ES).

    Attributes:
        max_staleness: samples up to this many versions old are used, corrected to the
            current parameters; older ones are discarded.
        staleness_decay: each version of age multiplies a sample's weight by this, in (0, 1].
    """

    max_staleness: int = 0
    staleness_decay: float = 1.0

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ConfigError(f"async_es.max_staleness={self.max_staleness} must be >= 0")
        if not 0 < self.staleness_decay <= 1:
            raise ConfigError(f"async_es.staleness_decay={self.staleness_decay} must be in (0, 1]")


@dataclass(frozen=True, kw_only=True)
class ESConfig:
    """Everything an `ESAgent` needs to know; see the module docstring for the file format.

    Attributes:
        seed: seeds the samplers' key streams and the noise table.
        solver: the `[solver]` section.
        gaussian_sampling: the `[gaussian_sampling]` section.
        optimizer: the `[optimizer]` section.
        async_es: the `[async_es]` section.
    """

    seed: int = 18
    solver: SolverConfig = field(default_factory=SolverConfig)
    gaussian_sampling: SamplingConfig = field(default_factory=SamplingConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    async_es: AsyncConfig = field(default_factory=AsyncConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed={self.seed} must be in [0, 2**63)")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> ESConfig:
        """Build a config from nested mappings; unknown or mistyped fields are errors.

        Args:
            data: `{"seed": ..., "solver": {...}, "gaussian_sampling": {...}, ...}`.
            source: named in error messages (the file it came from).
        """
        config: ESConfig = _build(cls, data, source, "")
        return config

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ESConfig:
        """Read a `.toml`, `.yaml` or `.yml` file (YAML needs the PyYAML package)."""
        path = os.fspath(path)
        suffix = os.path.splitext(path)[1].lower()
        if suffix == ".toml":
            with open(path, "rb") as f:
                try:
                    data = tomllib.load(f)
                except tomllib.TOMLDecodeError as exc:
                    raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
        elif suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ModuleNotFoundError:
                raise ConfigError(
                    f"{path}: reading YAML needs PyYAML (`pip install pyyaml`); or write the "
                    "configuration as TOML, which needs nothing"
                ) from None
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f) or {}
        else:
            raise ConfigError(f"{path}: unknown configuration format; use .toml, .yaml or .yml")
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: the top level must be a table of sections")
        return cls.from_dict(data, source=path)

    def to_dict(self) -> dict[str, Any]:
        """The config as nested plain dicts (the inverse of `from_dict`)."""
        return dataclasses.asdict(self)


def _build(cls: type, data: Mapping[str, Any], source: str, prefix: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{source}: unknown field {prefix}{unknown[0]}; the fields of "
            f"{prefix.rstrip('.') or 'the top level'} are {sorted(fields)}"
        )
    kwargs = {}
    for name, value in data.items():
        default = fields[name].default
        if default is dataclasses.MISSING:  # a section: its default comes from a factory
            section_cls = type(fields[name].default_factory())  # type: ignore[operator]
            if isinstance(value, section_cls):
                kwargs[name] = value
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"{source}: {prefix}{name} must be a table of fields")
            kwargs[name] = _build(section_cls, value, source, f"{prefix}{name}.")
        else:
            kwargs[name] = _coerce(value, type(default), f"{source}: {prefix}{name}")
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def _coerce(value: Any, kind: type, where: str) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}={value!r} must be true or false")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}={value!r} must be an integer")
        return value
    if kind is float:
        if isinstance(value, str):  # YAML 1.1 reads `1e-08` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}={value!r} must be a number")
        return float(value)
    if not isinstance(value, str):
        raise ConfigError(f"{where}={value!r} must be a string")
    return value

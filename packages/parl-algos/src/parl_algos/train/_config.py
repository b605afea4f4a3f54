"""The configs of `parl-train`: TOML files with typed sections, dotted overrides, one writer.

A config names its algorithm at the top (`algorithm = "PPO"`) and has three sections: `[env]`
(the environment), `[agent]` (the algorithm's hyperparameters, by their constructor names) and
`[train]` (budget, seed, mode, schedules). Each section is a dataclass of the algorithm's spec
(`parl_algos.train._spec`, which reads a file against its spec): its fields are the only keys
allowed and their annotations the types. A file may leave keys out (they take the dataclass
default); `None` is written as an absent key. An override `--section.key value` is parsed to
the type of the key it replaces (`int` refuses `1.5`, booleans are `true`/`false`, an optional
key also takes `none`).

Shipped configs live in the package (`parl_algos/configs/<algorithm>/<env>.toml`) and are
named `<algorithm>/<env>`; anything else is a path to a user's file.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import importlib.util
import math
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass
from typing import Any

from parl_algos.training import ScheduleArgs

__all__ = [
    "BACKENDS",
    "Config",
    "ConfigError",
    "MODES",
    "SECTIONS",
    "TrainSection",
    "apply_override",
    "check_extra",
    "dump_config",
    "needed_extra",
    "read_table",
    "section_from_table",
    "shipped_configs",
]

SECTIONS = ("env", "agent", "train")
MODES = ("single", "sync", "async")
BACKENDS = ("xparl", "ray")


class ConfigError(ValueError):
    """A config or an override is wrong: the message names the key and what is allowed."""


EXTRAS = {
    "examples": ("ale_py", "mpe2", "pettingzoo"),
    "box2d": ("Box2D",),
    "mujoco": ("mujoco",),
}
"""The extras of parl-algos that configs may need, and the modules each installs."""

_ENTRY_POINT_EXTRAS = {
    "gymnasium.envs.box2d": ("box2d", ("Box2D",)),
    "gymnasium.envs.mujoco": ("mujoco", ("mujoco",)),
}


def needed_extra(config: Config, family: str) -> tuple[str, tuple[str, ...]] | None:
    """The extra of parl-algos that `config` needs, and the modules of it that it imports.

    None when the three base distributions run it. `family` is the algorithm's
    (`AlgorithmSpec.family`): the multi-agent ones play `mpe2`'s environments. Gymnasium's own
    environments that need an extra (Box2D, MuJoCo) are known by their entry point, which
    gymnasium registers with or without the extra.
    """
    if family == "multi_agent":
        return "examples", ("mpe2", "pettingzoo")
    env_id = config.env.id
    if getattr(config.env, "atari", False) or env_id.startswith("ALE/"):
        return "examples", ("ale_py",)
    import gymnasium as gym

    try:
        entry_point = str(gym.spec(env_id).entry_point)
    except gym.error.Error:  # not registered: make_env reports it
        return None
    for prefix, extra in _ENTRY_POINT_EXTRAS.items():
        if entry_point.startswith(prefix):
            return extra
    return None


def check_extra(config: Config, family: str) -> None:
    """Raise ConfigError now, naming the install command, if `config` needs a missing extra."""
    needed = needed_extra(config, family)
    if needed is None:
        return
    extra, modules = needed
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"{config.name or config.algorithm} ({config.algorithm} on {config.env.id}) needs "
            f"{', '.join(missing)}: pip install 'parl-algos[{extra}]'"
        )


@dataclass
class TrainSection(ScheduleArgs):
    """The `[train]` section, the same for every algorithm: `ScheduleArgs` and the run's own."""

    mode: str = "single"
    """'single' (one process), 'sync' (learner + actors in rounds) or 'async'."""
    actors: int = 2
    """Remote actors of the sync and async modes."""
    address: str | None = None
    """HOST:PORT of a running cluster (none: an embedded one of actors + 1 slots)."""
    backend: str = "xparl"
    """Where the actors run: 'xparl' (PARL's cluster) or 'ray' (a Ray cluster; `address` is
    what `ray.init` takes, none: a local Ray of actors + 1 CPUs)."""
    restart_actors: bool = True
    """sync and async modes: replace an actor that dies (its process killed, its machine lost)
    or whose environment raises by a new one, and go on; false: the run stops at the first."""
    max_restarts: int = 3
    """The most replacements of one actor within 10 minutes; one more failure stops the run
    (an environment that keeps raising: its error named as the cause)."""
    weights_every: int = 0
    """Replay-based algorithms (DQN's family, DDPG, TD3, SAC) in sync and async modes: env
    steps between two sends of the learner's weights (and exploration) to the actors (0:
    before every batch; Ape-X's actors fetch them every 400 frames, 100 steps of an Atari
    game)."""
    checkpoint_every: int = 10_000
    """Env steps between two checkpoints (one is always written at the end)."""
    log_every: int = 1000
    """Env steps between two rows of progress.csv."""
    logdir: str | None = None
    """The run directory (none: train_log/<algorithm>-<env>/<timestamp>)."""
    progress: bool = True
    """Show a progress bar."""
    capture_video: bool = False
    """Record the evaluation episodes as videos in the run directory."""
    track: str | None = None
    """Also log the run to 'mlflow' or 'wandb' (none: TensorBoard's events alone)."""
    track_uri: str | None = None
    """MLflow's tracking URI: a server's URL, or a directory for a database of its own
    (none: ./mlruns)."""
    track_experiment: str | None = None
    """The tracked run's experiment (MLflow) or project (W&B) (none: <algorithm>-<env>)."""


@dataclass
class Config:
    """A resolved config: the algorithm's name and its three sections.

    Attributes:
        algorithm: the algorithm's name as the zoo spells it (`"PPO"`).
        env: the `[env]` section (a dataclass of the algorithm's spec).
        agent: the `[agent]` section.
        train: the `[train]` section.
        name: where it came from: a shipped name (`ppo/cartpole`) or a file's path.
    """

    algorithm: str
    env: Any
    agent: Any
    train: TrainSection
    name: str = ""

    def section(self, name: str) -> Any:
        """The section called `name` (`env`, `agent` or `train`)."""
        return getattr(self, name)


def _configs_root():
    return importlib.resources.files("parl_algos") / "configs"


def shipped_configs() -> list[str]:
    """The names of the configs shipped with parl-algos (`ppo/cartpole`, ...), sorted."""
    names = []
    for algorithm in _configs_root().iterdir():
        if algorithm.is_dir():
            names += [
                f"{algorithm.name}/{f.name[:-5]}"
                for f in algorithm.iterdir()
                if f.name.endswith(".toml")
            ]
    return sorted(names)


def read_table(name: str) -> tuple[dict[str, Any], str]:
    """The TOML table of a shipped config name or a file path, and the name to show."""
    if not name.endswith(".toml") and re.fullmatch(r"[\w-]+/[\w-]+", name):
        resource = _configs_root().joinpath(*name.split("/")).with_suffix(".toml")
        if resource.is_file():
            return tomllib.loads(resource.read_text(encoding="utf-8")), name
        if not os.path.exists(name):
            raise ConfigError(
                f"no shipped config {name!r}; shipped: {', '.join(shipped_configs())} "
                "(or give the path of a .toml file)"
            )
    try:
        with open(name, "rb") as f:
            return tomllib.load(f), name
    except FileNotFoundError:
        raise ConfigError(f"config file {name!r} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {name!r} is not valid TOML: {exc}") from None


def section_from_table(section: str, cls: type, values: Any, shown: str) -> Any:
    """The section `section` (a dataclass `cls`) of the config file `shown`, from its table.

    Raises:
        ConfigError: `values` is not a table, or has a key `cls` lacks or a value of another type.
    """
    if not isinstance(values, dict):
        raise ConfigError(f"{shown}: {section!r} must be a table ([{section}])")
    kwargs = {}
    hints = _hints(cls)
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(_unknown_key(section, key, hints))
        kwargs[key] = _check_value(f"{section}.{key}", value, hints[key])
    return cls(**kwargs)


def apply_override(config: Config, dotted: str, text: str) -> None:
    """Set `section.key` of `config` to `text` parsed to the key's type.

    Raises:
        ConfigError: the section or the key does not exist, or `text` is not of its type.
    """
    section, _, key = dotted.partition(".")
    if section not in SECTIONS or not key:
        raise ConfigError(
            f"unknown override --{dotted}; overrides are --section.key with a section among "
            f"{', '.join(SECTIONS)}"
        )
    target = config.section(section)
    hints = _hints(type(target))
    if key not in hints:
        raise ConfigError(_unknown_key(section, key, hints))
    setattr(target, key, _parse_text(f"{section}.{key}", text, hints[key]))


def dump_config(config: Config) -> str:
    """The config as TOML text that `load_config` reads back to an equal config."""
    lines = [f"algorithm = {_toml_value(config.algorithm)}"]
    for section in SECTIONS:
        lines += ["", f"[{section}]"]
        for field in dataclasses.fields(config.section(section)):
            value = getattr(config.section(section), field.name)
            if value is None:
                lines.append(f"# {field.name}: none")
            else:
                lines.append(f"{field.name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


# -- types ---------------------------------------------------------------------------------------


def _hints(cls: type) -> dict[str, Any]:
    return {f.name: typing.get_type_hints(cls)[f.name] for f in dataclasses.fields(cls)}


def _unknown_key(section: str, key: str, hints: dict[str, Any]) -> str:
    return f"unknown key {section}.{key}; allowed in [{section}]: {', '.join(hints)}"


def _split_optional(annotation: Any) -> tuple[type, bool]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(annotation))
    return annotation, False


def _type_name(annotation: Any) -> str:
    base, optional = _split_optional(annotation)
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
    return names[base] + (" or none" if optional else "")


def _check_value(key: str, value: Any, annotation: Any) -> Any:
    """A TOML value checked against (and converted to) the key's type."""
    base, _ = _split_optional(annotation)
    ok = (
        (base is bool and isinstance(value, bool))
        or (base is int and isinstance(value, int) and not isinstance(value, bool))
        or (base is float and isinstance(value, int | float) and not isinstance(value, bool))
        or (base is str and isinstance(value, str))
    )
    if not ok:
        raise ConfigError(f"{key} must be {_type_name(annotation)}, got {value!r}")
    return float(value) if base is float else value


def _parse_text(key: str, text: str, annotation: Any) -> Any:
    """A command-line value parsed to the key's type."""
    base, optional = _split_optional(annotation)
    if optional and text.lower() in ("none", "null"):
        return None
    try:
        if base is bool:
            if text not in ("true", "false"):
                raise ValueError
            return text == "true"
        if base is int:
            if not re.fullmatch(r"[+-]?\d[\d_]*", text):
                raise ValueError
            return int(text)
        if base is float:
            return float(text)
    except ValueError:
        raise ConfigError(f"--{key} must be {_type_name(annotation)}, got {text!r}") from None
    return text


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'

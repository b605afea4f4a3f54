"""The `parl-train` command: one config-driven entry point for every algorithm of the zoo.

    parl-train ppo/cartpole                                  # a config shipped with parl-algos
    parl-train my_config.toml --agent.lr 3e-4 --train.total_steps 50000
    parl-train --resume train_log/ppo-cartpole/2026-11-23_10-00-00
    parl-train --list

Every key of a config can be overridden as `--section.key value` (or `--section.key=value`),
parsed to the type of the key it replaces; `--mode`, `--actors`, `--address` and `--logdir`
are short for their `train.` keys. Bad keys and values are reported before anything starts.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from collections.abc import Sequence

from parl_algos.train._config import (
    Config,
    ConfigError,
    apply_override,
    check_config,
    load_config,
    shipped_configs,
)

__all__ = [
    "main",
    "resolve",
    "split_overrides",
]

_SHORT = {"mode": "train.mode", "actors": "train.actors", "address": "train.address"}
_SHORT["logdir"] = "train.logdir"
_SHORT["backend"] = "train.backend"
_DOTTED = re.compile(r"--([A-Za-z_]\w*\.[A-Za-z_]\w*)(=.*)?", re.DOTALL)
_SHORT_FLAG = re.compile(r"--(mode|actors|address|logdir|backend)(=.*)?", re.DOTALL)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parl-train",
        description="Train any algorithm of the PARL zoo from a TOML config.",
        epilog=(
            "Any config key can be overridden as --section.key VALUE (sections: env, agent, "
            "train), e.g. --agent.lr 3e-4 --train.total_steps 50000. Short forms: --mode "
            "{single,sync,async}, --actors N, --address HOST:PORT, --logdir DIR, --backend "
            "{xparl,ray}."
        ),
        allow_abbrev=False,
    )
    parser.add_argument(
        "config", nargs="?", help="a shipped config (<algorithm>/<env>, see --list) or a .toml file"
    )
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its checkpoint")
    parser.add_argument("--list", action="store_true", help="list the shipped configs and exit")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--capture-video",
        action="store_true",
        help="record the evaluation episodes (needs parl-algos[video])",
    )
    return parser


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Separate `--section.key value` overrides (and the short forms) from the other arguments.

    Returns:
        The remaining arguments, and the overrides as `(dotted key, text)` in command order.

    Raises:
        ConfigError: an override has no value.
    """
    rest: list[str] = []
    overrides: list[tuple[str, str]] = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        match = _DOTTED.fullmatch(token) or _SHORT_FLAG.fullmatch(token)
        if match is None:
            rest.append(token)
            i += 1
            continue
        key = _SHORT.get(match.group(1), match.group(1))
        if match.group(2) is not None:
            text = match.group(2)[1:]
        elif i + 1 < len(tokens):
            i += 1
            text = tokens[i]
        else:
            raise ConfigError(f"{token} needs a value")
        overrides.append((key, text))
        i += 1
    return rest, overrides


def _list_configs() -> None:
    from parl_algos.train._algorithms import get_spec

    lines = []
    for name in shipped_configs():
        config = load_config(name)
        modes = " ".join(get_spec(config.algorithm).modes)
        lines.append((name, f"{config.algorithm} on {config.env.id}", modes))
    width = [max(len(line[i]) for line in lines) for i in (0, 1)]
    for name, what, modes in lines:
        print(f"{name:<{width[0]}}  {what:<{width[1]}}  modes: {modes}")


def resolve(argv: Sequence[str]) -> tuple[Config, bool] | None:
    """The config a command line asks for, checked, and whether it resumes a run.

    Returns None for `--list` (which prints the shipped configs).

    Raises:
        ConfigError: anything wrong in the command line or the config.
    """
    rest, overrides = split_overrides(argv)
    parser = _parser()
    ns = parser.parse_args(rest)
    if ns.list:
        _list_configs()
        return None
    if ns.resume is not None:
        if ns.config is not None:
            raise ConfigError("--resume continues a run with its own config: give no config")
        refused = [key for key, _ in overrides if key != "train.total_steps"]
        if refused or ns.capture_video:
            shown = [f"--{key}" for key in refused] + ["--capture-video"] * ns.capture_video
            raise ConfigError(
                f"--resume accepts only --train.total_steps as an override, got {shown}"
            )
        config = load_config(f"{ns.resume.rstrip('/')}/config.toml")
        config.train.logdir = ns.resume
    else:
        if ns.config is None:
            raise ConfigError(
                "give a config (parl-train --list shows the shipped ones) or --resume RUN_DIR"
            )
        config = load_config(ns.config)
    for key, text in overrides:
        apply_override(config, key, text)
    if ns.no_progress:
        config.train.progress = False
    if ns.capture_video:
        config.train.capture_video = True
    check_config(config)
    if config.train.capture_video:
        _check_video(config.env.id)
    return config, ns.resume is not None


def _check_video(env_id: str) -> None:
    """Raise ConfigError now if videos of `env_id` cannot be recorded (not at the first one)."""
    install = "pip install 'parl-algos[video]'"
    if importlib.util.find_spec("moviepy") is None:
        raise ConfigError(f"--capture-video needs moviepy: {install}")
    import gymnasium as gym

    try:
        env = gym.make(env_id, render_mode="rgb_array")
        try:
            env.reset(seed=0)
            env.render()
        finally:
            env.close()
    except Exception as exc:  # a missing renderer, or an environment without rgb_array
        raise ConfigError(
            f"--capture-video: {env_id} cannot render frames ({exc}); {install}"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run `parl-train` with `argv` (default: the process's arguments); return the exit code."""
    try:
        resolved = resolve(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"parl-train: error: {exc}", file=sys.stderr)
        return 2
    if resolved is None:
        return 0
    config, resume = resolved

    from parl_algos.train._runner import INTERRUPTED_EXIT_CODE, default_logdir, run_single

    if config.train.logdir is None:
        config.train.logdir = default_logdir(config)
    result = run_single(config, config.train.logdir, resume=resume)
    if result.interrupted:
        print(
            f"parl-train: interrupted at env step {result.env_steps}; continue with "
            f"parl-train --resume {result.logdir}",
            file=sys.stderr,
        )
        return INTERRUPTED_EXIT_CODE
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The `parl-train` command: one config-driven entry point for every algorithm of the zoo.

    parl-train ppo/cartpole                                  # a config shipped with parl-algos
    parl-train my_config.toml --agent.lr 3e-4 --train.total_steps 50000
    parl-train --resume train_log/ppo-cartpole/2026-11-23_10-00-00
    parl-train --export onnx train_log/ppo-cartpole/2026-11-23_10-00-00
    parl-train --list
    parl-train ppo/cartpole --sweep space.toml --trials 16 --parallel 2   # see _sweep
    parl-train ppo/cartpole --pbt space.toml --population 4               # see _pbt

Every key of a config can be overridden as `--section.key value` (or `--section.key=value`),
parsed to the type of the key it replaces; `--mode`, `--actors`, `--address` and `--logdir`
are short for their `train.` keys. Bad keys and values are reported before anything starts.

Whatever ends a run early ends the command with one line on stderr that names what went wrong
and what to do (with the `parl-train --resume DIR` that continues it where a checkpoint
exists) and a non-zero exit: 2 for a config that cannot run (a bad key or value, a missing
extra, a bad `PARL_*` environment variable), 1 for a failure during the run (an unreachable
cluster, an actor that failed), 130 after Ctrl-C. The traceback goes to the run directory's
`log.log`, and with `--debug` to the terminal too.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import re
import sys
import traceback
from collections.abc import Sequence

from parl.utils import logger as parl_logger
from parl_algos.samplers import SamplerWorkerError
from parl_algos.train._config import (
    Config,
    ConfigError,
    apply_override,
    needed_extra,
    shipped_configs,
)
from parl_algos.train._export import EXPORT_FORMATS, export
from parl_algos.train._pbt import check_population, default_pbt_dir, pbt, read_pbt_space
from parl_algos.train._registry import get_spec, load_config
from parl_algos.train._run import INTERRUPTED_EXIT_CODE, default_logdir, latest_checkpoint
from parl_algos.train._skeleton import run
from parl_algos.train._spec import check_config
from parl_algos.train._sweep import check_single, default_sweep_dir, read_space, sweep
from parl_remote import (
    ClusterError,
    NotConnectedError,
    RemoteActorDiedError,
    RemoteError,
    SettingError,
    check_env,
)

__all__ = [
    "FAILED_EXIT_CODE",
    "main",
    "resolve",
    "split_overrides",
]

FAILED_EXIT_CODE = 1
"""What `parl-train` exits with when a run fails after it started (2: a config that cannot run)."""

_SHORT = {"mode": "train.mode", "actors": "train.actors", "address": "train.address"}
_SHORT["logdir"] = "train.logdir"
_SHORT["backend"] = "train.backend"
_SHORT |= {"track": "train.track", "track-uri": "train.track_uri"}
_DOTTED = re.compile(r"--([A-Za-z_]\w*\.[A-Za-z_]\w*)(=.*)?", re.DOTALL)
_SHORT_FLAG = re.compile(r"--(mode|actors|address|logdir|backend|track|track-uri)(=.*)?", re.DOTALL)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parl-train",
        description="Train any algorithm of the PARL zoo from a TOML config.",
        epilog=(
            "Any config key can be overridden as --section.key VALUE (sections: env, agent, "
            "train), e.g. --agent.lr 3e-4 --train.total_steps 50000. Short forms: --mode "
            "{single,sync,async}, --actors N, --address HOST:PORT, --logdir DIR, --backend "
            "{xparl,ray}, --track {mlflow,wandb}, --track-uri URI."
        ),
        allow_abbrev=False,
    )
    parser.add_argument(
        "config", nargs="?", help="a shipped config (<algorithm>/<env>, see --list) or a .toml file"
    )
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its checkpoint")
    parser.add_argument("--list", action="store_true", help="list the shipped configs and exit")
    parser.add_argument(
        "--export",
        metavar="FORMAT",
        help=(
            f"--export {{{','.join(EXPORT_FORMATS)}}} RUN_DIR writes the greedy policy of the "
            "run's last checkpoint into RUN_DIR (onnx needs parl-algos[export])"
        ),
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--capture-video",
        action="store_true",
        help="record the evaluation episodes (needs parl-algos[video])",
    )
    sweep = parser.add_argument_group(
        "sweeps", "search a space of hyperparameters with Optuna (needs parl-algos[sweep])"
    )
    sweep.add_argument("--sweep", metavar="SPACE.toml", help="the space to search")
    sweep.add_argument("--trials", type=int, metavar="N", help="completed and pruned trials")
    sweep.add_argument("--parallel", type=int, default=1, metavar="K", help="trials at a time")
    sweep.add_argument("--seeds", type=int, default=1, metavar="S", help="runs a trial")
    sweep.add_argument("--storage", metavar="URL", help="Optuna's storage (default: DIR/study.db)")
    population = parser.add_argument_group(
        "population-based training",
        "members train side by side; at each interval the bottom quarter copies the top's "
        "checkpoints and explores their hyperparameters",
    )
    population.add_argument("--pbt", metavar="SPACE.toml", help="the hyperparameters to explore")
    population.add_argument("--population", type=int, metavar="P", help="members")
    population.add_argument(
        "--pbt-interval",
        type=int,
        metavar="STEPS",
        help="env steps between two exploits (default: a tenth of train.total_steps)",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help=(
            "print the traceback of a failure here too (it is always in the run's log.log), "
            "and log the library's debug lines (e.g. each phase of an actor's replacement)"
        ),
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
    """Print every shipped config, its modes and the extra it needs (none are imported)."""
    lines = []
    for name in shipped_configs():
        config = load_config(name, check=False)
        spec = get_spec(config.algorithm)
        needed = needed_extra(config, spec.family)
        extra = "" if needed is None else f"needs parl-algos[{needed[0]}]"
        lines.append((name, f"{config.algorithm} on {config.env.id}", extra, " ".join(spec.modes)))
    width = [max(len(line[i]) for line in lines) for i in range(3)]
    for name, what, extra, modes in lines:
        print(f"{name:<{width[0]}}  {what:<{width[1]}}  {extra:<{width[2]}}  modes: {modes}")


def resolve(argv: Sequence[str]) -> tuple[Config, bool] | None:
    """The config a command line asks for, checked, and whether it resumes a run.

    Returns None for `--list` (which prints the shipped configs) and `--export` (which writes
    the policy's files and names each on a line).

    Raises:
        ConfigError: anything wrong in the command line or the config.
    """
    rest, overrides = split_overrides(argv)
    parser = _parser()
    ns = parser.parse_args(rest)
    if ns.list:
        _list_configs()
        return None
    if ns.export is not None:
        _export_run(ns.export, ns.config, overrides)
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
    check_config(config, get_spec(config.algorithm))
    if config.train.capture_video:
        _check_video(config.env.id)
    return config, ns.resume is not None


def _export_run(fmt: str, logdir: str | None, overrides: list[tuple[str, str]]) -> None:
    """`--export FORMAT RUN_DIR`: write the run's policy and name the file in one line."""
    if logdir is None or overrides:
        raise ConfigError("--export FORMAT RUN_DIR takes a run directory and nothing else")
    path = f"{logdir.rstrip('/')}/config.toml"
    if not os.path.isfile(path):
        raise ConfigError(f"--export: {logdir} is not a run directory of parl-train (no {path})")
    config = load_config(path)
    for written in export(config, get_spec(config.algorithm), logdir, fmt):
        print(f"wrote {written}")


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _failure(exc: Exception, logdir: str) -> str:
    """The one line that tells what ended a run and what to do about it."""
    if isinstance(exc, ConfigError):
        return _first_line(exc)
    if isinstance(exc, NotConnectedError):
        # parl-remote's advice speaks to a script (parl.connect); a parl-train user has flags
        cause = _first_line(exc).split("; ")[0]
        what = (
            f"cannot reach the cluster: {cause}; start one with `xparl start`, "
            "or leave out --address for a local cluster"
        )
    elif isinstance(exc, ClusterError):
        what = f"cannot reach the cluster: {_first_line(exc)}"
    elif isinstance(exc, SamplerWorkerError) and exc.__cause__ is not None:
        cause = exc.__cause__  # the environment's own error, after its retries
        what = (
            f"an actor failed: {type(cause).__name__}: {_first_line(cause)}, {exc.failures} "
            f"times within {exc.window_s:g} s (train.max_restarts = {exc.max_restarts})"
        )
    elif isinstance(exc, RemoteActorDiedError):
        what = f"an actor died: {_first_line(exc)}"
    elif isinstance(exc, RemoteError) or getattr(exc, "__notes__", None):
        what = f"an actor failed: {type(exc).__name__}: {_first_line(exc)}"
    else:
        what = f"the run failed: {type(exc).__name__}: {_first_line(exc)}"
    log = os.path.join(logdir, "log.log")
    todo = f"the traceback is in {log}"
    if latest_checkpoint(logdir) is not None:
        todo += f"; once fixed, continue with parl-train --resume {logdir}"
    return f"{what} ({todo})"


def _failed(exc: Exception, logdir: str, debug: bool) -> int:
    """Say why the command failed in one line; return its exit code.

    The traceback goes to `logdir`'s log.log, and to the terminal with `--debug`.
    """
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, "log.log"), "a", encoding="utf-8") as f:
        f.write("".join(traceback.format_exception(exc)))
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"parl-train: error: {_failure(exc, logdir)}", file=sys.stderr)
    return 2 if isinstance(exc, ConfigError) else FAILED_EXIT_CODE


class _ToParlLogger(logging.Handler):
    """Hands parl_algos' log records (a sampler's replaced worker) to the `parl` logger.

    That one writes the terminal's lines and the run's log.log.
    """

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger("parl").handle(record)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `parl-train` with `argv` (default: the process's arguments); return the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    library = logging.getLogger("parl_algos")
    if not any(isinstance(handler, _ToParlLogger) for handler in library.handlers):
        library.addHandler(_ToParlLogger())
        library.propagate = False
    debug = "--debug" in argv
    if debug:
        library.setLevel(logging.DEBUG)
        parl_logger.set_level(logging.DEBUG)
    try:
        resolved = resolve(argv)
        if resolved is not None:
            check_env()
    except (ConfigError, SettingError) as exc:
        print(f"parl-train: error: {exc}", file=sys.stderr)
        return 2
    if resolved is None:
        return 0
    config, resume = resolved
    ns = _parser().parse_args(split_overrides(argv)[0])
    if ns.pbt is not None or ns.population is not None or ns.pbt_interval is not None:
        return _pbt(config, ns, resume, debug=debug)
    if ns.sweep is not None or ns.trials is not None:
        return _sweep(config, ns, resume, debug=debug)
    if config.train.logdir is None:
        config.train.logdir = default_logdir(config)
    logdir = config.train.logdir
    try:
        result = run(config, get_spec(config.algorithm), logdir, resume=resume)
    except Exception as exc:
        return _failed(exc, logdir, debug)
    if result.interrupted:
        print(
            f"parl-train: interrupted at env step {result.env_steps}; continue with "
            f"parl-train --resume {result.logdir}",
            file=sys.stderr,
        )
        return INTERRUPTED_EXIT_CODE
    return 0


def _sweep(config: Config, ns: argparse.Namespace, resume: bool, *, debug: bool) -> int:
    """`parl-train CONFIG --sweep SPACE.toml --trials N ...`: see `_sweep`."""
    try:
        if resume or ns.sweep is None or ns.trials is None:
            raise ConfigError("a sweep needs CONFIG --sweep SPACE.toml --trials N (no --resume)")
        for flag in ("trials", "parallel", "seeds"):
            if getattr(ns, flag) < 1:
                raise ConfigError(f"--{flag}={getattr(ns, flag)} must be at least 1")
        check_single(config, "a sweep")
        space = read_space(ns.sweep, config)
        sweep_dir = config.train.logdir or default_sweep_dir(config, ns.sweep)
    except ConfigError as exc:
        print(f"parl-train: error: {exc}", file=sys.stderr)
        return 2
    try:
        result = sweep(
            config,
            get_spec(config.algorithm),
            space,
            trials=ns.trials,
            parallel=ns.parallel,
            seeds=ns.seeds,
            sweep_dir=sweep_dir,
            storage=ns.storage,
        )
    except Exception as exc:
        return _failed(exc, sweep_dir, debug)
    return INTERRUPTED_EXIT_CODE if result.interrupted else 0


def _pbt(config: Config, ns: argparse.Namespace, resume: bool, *, debug: bool) -> int:
    """`parl-train CONFIG --pbt SPACE.toml --population P ...`: see `_pbt`."""
    budget = config.train.total_steps
    interval = ns.pbt_interval if ns.pbt_interval is not None else max(budget // 10, 1)
    try:
        if resume or ns.pbt is None or ns.population is None:
            raise ConfigError(
                "population-based training needs CONFIG --pbt SPACE.toml --population P "
                "(no --resume)"
            )
        if ns.sweep is not None or ns.trials is not None:
            raise ConfigError("give --pbt or --sweep, not both")
        pbt_dir = config.train.logdir or default_pbt_dir(config, ns.pbt)
        check_population(config, ns.population, interval, pbt_dir)
        space = read_pbt_space(ns.pbt, config)
    except ConfigError as exc:
        print(f"parl-train: error: {exc}", file=sys.stderr)
        return 2
    try:
        pbt(
            config,
            get_spec(config.algorithm),
            space,
            population=ns.population,
            interval=interval,
            pbt_dir=pbt_dir,
        )
    except Exception as exc:
        return _failed(exc, pbt_dir, debug)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

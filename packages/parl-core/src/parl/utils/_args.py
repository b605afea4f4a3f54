"""`parl.utils.parse_args`: a command line from a `@dataclass`, help text from field docstrings.

Examples declare their settings once, as a dataclass whose fields carry a docstring each
(CleanRL's style), and get `--flag value` parsing with those docstrings as `--help`:

    @dataclass
    class Args:
        seed: int = 1
        \"\"\"Seed of everything.\"\"\"
        variant: Literal["clip", "kl"] = "clip"
        \"\"\"Which PPO objective.\"\"\"

    args = parse_args(Args)

The command line is built by tyro, so a field may be any type tyro understands: `Literal`
choices (checked, the allowed values in the error), tuples (`--hidden 64 64`), nested
dataclasses (`--optim.lr 0.01`), `X | None` (`--target none`). `--config FILE` reads settings
from a TOML file first; flags on the same command line override it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import tomllib
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

__all__ = ["parse_args"]

T = TypeVar("T")

_CONFIG_HELP = (
    "Settings can also come from a TOML file: --config FILE (keys are the field names, tables "
    "the nested settings); flags on the same command line override the file."
)


def _field_types(cls: type) -> dict[str, Any]:
    """Map each field of the dataclass `cls` to its resolved type annotation."""
    hints = typing.get_type_hints(cls)
    return {field.name: hints[field.name] for field in dataclasses.fields(cls)}


def _is_optional(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    return origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(annotation)


def _optional_flags(cls: type, prefix: str = "--") -> set[str]:
    """The flags of `cls`'s fields typed `X | None`, nested dataclasses included."""
    flags: set[str] = set()
    for name, annotation in _field_types(cls).items():
        flag = prefix + name.replace("_", "-")
        if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
            flags |= _optional_flags(annotation, flag + ".")
        elif _is_optional(annotation):
            flags.add(flag)
    return flags


def _lowercase_none(argv: Sequence[str], optional: set[str]) -> list[str]:
    """Accept `none` (as well as tyro's `None`) as the value of an `X | None` flag."""
    out: list[str] = []
    for token in argv:
        flag, eq, value = token.partition("=")
        if eq and flag in optional and value.lower() == "none":
            token = f"{flag}=None"
        elif out and out[-1] in optional and token.lower() == "none":
            token = "None"
        out.append(token)
    return out


def _split_config(argv: Sequence[str]) -> tuple[list[str], str | None]:
    """Take `--config FILE` (or `--config=FILE`) out of `argv`."""
    rest: list[str] = []
    path: str | None = None
    tokens = iter(argv)
    for token in tokens:
        if token == "--config":
            path = next(tokens, None)
            if path is None:
                raise SystemExit("error: --config needs a FILE (a TOML file of settings)")
        elif token.startswith("--config="):
            path = token.removeprefix("--config=")
        else:
            rest.append(token)
    return rest, path


def _config_flags(
    cls: type, table: Mapping[str, Any], source: str, prefix: str = "--"
) -> list[str]:
    """Turn a TOML table of settings into the flags that say the same, checking every key."""
    types_by_name = _field_types(cls)
    flags: list[str] = []
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in types_by_name:
            raise SystemExit(
                f"error: {source}: unknown setting {key!r} for {cls.__name__}; "
                f"known settings: {', '.join(sorted(types_by_name))}"
            )
        flag = prefix + name.replace("_", "-")
        annotation = types_by_name[name]
        if isinstance(value, dict):
            if not (dataclasses.is_dataclass(annotation) and isinstance(annotation, type)):
                raise SystemExit(f"error: {source}: {key!r} is a table, but not nested settings")
            flags += _config_flags(annotation, value, source, flag + ".")
        elif isinstance(value, bool):
            flags.append(flag if value else prefix + "no-" + flag.removeprefix(prefix))
        elif isinstance(value, list):
            flags += [flag, *(str(item) for item in value)]
        else:
            flags += [flag, str(value)]
    return flags


@contextlib.contextmanager
def _importable(cls: type) -> Iterator[None]:
    """Make `cls`'s module importable while parsing, where it was run with `runpy.run_path`.

    Type hints (`Literal[...]` in a script with `from __future__ import annotations`) and field
    docstrings are found through `sys.modules[cls.__module__]`, which `runpy.run_path` removes
    once the script has run; the dataclass's generated `__init__` still holds the script's
    namespace, which stands in for the module meanwhile.
    """
    name = cls.__module__
    if getattr(sys.modules.get(name), cls.__name__, None) is cls:
        yield
        return
    namespace = getattr(vars(cls).get("__init__"), "__globals__", {})
    if namespace.get(cls.__name__) is not cls:
        yield
        return
    module = types.ModuleType(name)
    module.__dict__.update(namespace)
    previous = sys.modules.get(name)
    sys.modules[name] = module
    try:
        yield
    finally:
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous


def parse_args(
    cls: type[T], argv: Sequence[str] | None = None, description: str | None = None
) -> T:
    """Build `cls` (a dataclass) from command-line flags: field `lr` is set with `--lr 0.01`.

    Booleans take `--flag` / `--no-flag`; fields typed `X | None` also accept `none`;
    `Literal` fields accept only their values; tuples take several values (`--hidden 64 64`);
    a nested dataclass field `optim` gives flags `--optim.lr`. Each field's docstring and
    default are its `--help` text (fields inherited from a dataclass base keep the docstrings
    written there). `--config FILE` reads a TOML file of settings (keys are field names,
    tables the nested dataclasses) before the other flags, which override it.

    Args:
        cls: The dataclass of settings.
        argv: The arguments to parse (default: `sys.argv[1:]`).
        description: The text at the top of `--help` (default: the running script's
            docstring).

    Returns:
        An instance of `cls`.

    Raises:
        TypeError: `cls` is not a dataclass.
        SystemExit: After `--help`, or a usage error, printed with what was wrong.
    """
    if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
        raise TypeError(f"parse_args expects a dataclass, got {cls!r}")

    if argv is None:
        argv = sys.argv[1:]
    if description is None:
        description = getattr(sys.modules.get("__main__"), "__doc__", None)
    description = f"{description.rstrip()}\n\n{_CONFIG_HELP}" if description else _CONFIG_HELP
    with _importable(cls):
        return _parse(cls, argv, description)


def _parse(cls: type[T], argv: Sequence[str], description: str) -> T:
    import tyro  # here, not at the top: `import parl.utils` stays cheap

    optional = _optional_flags(cls)
    rest, config_path = _split_config(argv)
    prepend: list[str] = []
    if config_path is not None:
        try:
            with open(config_path, "rb") as f:
                table = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SystemExit(f"error: --config {config_path}: {exc}") from exc
        prepend = _config_flags(cls, table, config_path)
        try:  # the file's settings alone first, so that an error in them names the file
            tyro.cli(cls, args=_lowercase_none(prepend, optional), description=description)
        except SystemExit as exc:
            if exc.code:
                print(f"error: in --config {config_path}", file=sys.stderr)
            raise
    args = _lowercase_none([*prepend, *rest], optional)
    return tyro.cli(cls, args=args, description=description)

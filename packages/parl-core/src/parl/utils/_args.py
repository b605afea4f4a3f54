"""`parl.utils.parse_args`: a command line from a `@dataclass`, help text from field docstrings.

Examples declare their settings once, as a dataclass whose fields carry a docstring each
(CleanRL's style), and get `--flag value` parsing with those docstrings as `--help`:

    @dataclass
    class Args:
        seed: int = 1
        \"\"\"Seed of everything.\"\"\"

    args = parse_args(Args)
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import sys
import textwrap
import types
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

__all__ = ["parse_args"]

T = TypeVar("T")


def _field_docs(cls: type) -> dict[str, str]:
    """Map each field to the string literal that follows its definition in the class body."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _converter(annotation: Any) -> tuple[Any, bool]:
    """Return (callable that parses one value, whether None is allowed)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _converter(args[0])[0], True
    if annotation in (int, float, str, bool):
        return annotation, False
    raise TypeError(
        f"parse_args: unsupported field type {annotation!r}; use int, float, str or bool"
    )


def parse_args(
    cls: type[T], argv: Sequence[str] | None = None, description: str | None = None
) -> T:
    """Build `cls` (a dataclass) from command-line flags: field `lr` is set with `--lr 0.01`.

    Booleans take `--flag` / `--no-flag`; fields typed `X | None` also accept `none`. The
    field's docstring and default are its `--help` text; fields inherited from a dataclass base
    keep the docstrings written there. `description` defaults to the running
    script's docstring.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"parse_args expects a dataclass, got {cls!r}")
    if description is None:
        description = getattr(sys.modules.get("__main__"), "__doc__", None)
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    hints = typing.get_type_hints(cls)
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # a subclass's docstring for a field wins
        if dataclasses.is_dataclass(klass):
            docs.update(_field_docs(klass))
    for field in dataclasses.fields(cls):
        flag = "--" + field.name.replace("_", "-")
        default = field.default
        if default is dataclasses.MISSING and field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        help_text = f"{docs.get(field.name, '')} (default: {default})".strip()
        convert, optional = _converter(hints[field.name])
        if convert is bool:
            parser.add_argument(
                flag,
                action=argparse.BooleanOptionalAction,
                default=default,
                dest=field.name,
                help=help_text,
            )
            continue

        def parse(text: str, convert=convert, optional=optional) -> Any:
            if optional and text.lower() == "none":
                return None
            return convert(text)

        parser.add_argument(
            flag,
            type=parse,
            default=default,
            dest=field.name,
            help=help_text,
            metavar=getattr(convert, "__name__", "VALUE").upper(),
        )
    return cls(**vars(parser.parse_args(argv)))

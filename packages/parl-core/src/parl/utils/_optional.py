"""Optional dependencies: fail early with the command that installs them, or degrade once.

A script that needs a package only for one of its outputs (a learning-curve plot, a video, a
cluster engine) checks for it with `require` before the work starts, so a missing package costs
seconds, not a finished training run:

    require("matplotlib", "pip install matplotlib", purpose="the learning curve")

Where the script can do without it, `optional_import` returns None and logs one warning that
says what is off and how to turn it on; `progress_bar` is the progress bar built that way (tqdm
when it is installed, otherwise the bare iterable).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any, Generic, TypeVar

__all__ = ["ProgressBar", "optional_import", "progress_bar", "require"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_warned: set[str] = set()


def _missing(module: str, exc: ModuleNotFoundError) -> bool:
    """Whether `exc` says that `module` itself (or its package) is absent, not a dependency."""
    if exc.name is None:
        return False
    return module == exc.name or module.startswith(exc.name + ".")


def require(module: str, install: str, *, purpose: str | None = None) -> ModuleType:
    """Import `module`, or fail now with the command that installs it.

    Args:
        module: The module to import, e.g. `"matplotlib.pyplot"`.
        install: The command that installs it, e.g. `"pip install matplotlib"`.
        purpose: What needs it, for the message (default: the module's name).

    Returns:
        The imported module.

    Raises:
        ModuleNotFoundError: `module` is not installed; the message names `install`.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if not _missing(module, exc):
            raise
        raise ModuleNotFoundError(
            f"{purpose or module} needs {exc.name!r}, which is not installed; "
            f"install it with `{install}`",
            name=exc.name,
        ) from exc


def optional_import(module: str, install: str, *, purpose: str) -> ModuleType | None:
    """Import `module`, or log one warning (once per module) and return None.

    Args:
        module: The module to import.
        install: The command that installs it.
        purpose: What is switched off without it, e.g. `"the progress bar"`.

    Returns:
        The module, or None when it is not installed.
    """
    try:
        return require(module, install, purpose=purpose)
    except ModuleNotFoundError:
        if module not in _warned:
            _warned.add(module)
            logger.warning(
                "%s is off: %r is not installed (install it with `%s`)", purpose, module, install
            )
        return None


class ProgressBar(Generic[T]):
    """The bare stand-in for a tqdm bar: iterates, and ignores what would be displayed."""

    def __init__(self, iterable: Iterable[T]) -> None:
        self._iterable = iterable

    def __iter__(self) -> Iterator[T]:
        return iter(self._iterable)

    def set_postfix(self, **values: Any) -> None:
        """Accept tqdm's postfix values; nothing is shown."""

    def update(self, n: int = 1) -> None:
        """Accept tqdm's progress updates; nothing is shown."""

    def close(self) -> None:
        """Nothing to close."""


def progress_bar(
    iterable: Iterable[T], *, desc: str | None = None, unit: str = "it", total: int | None = None
) -> ProgressBar[T]:
    """A tqdm progress bar over `iterable`, or the bare iterable (one warning) without tqdm.

    Args:
        iterable: What to iterate over.
        desc: The bar's title.
        unit: The unit of one item.
        total: The number of items, when `len(iterable)` does not say.

    Returns:
        An iterable with tqdm's `set_postfix`, `update` and `close` (a `tqdm.tqdm` when tqdm is
        installed).
    """
    tqdm = optional_import("tqdm", "pip install tqdm", purpose="the progress bar")
    if tqdm is None:
        return ProgressBar(iterable)
    bar: ProgressBar[T] = tqdm.tqdm(iterable, desc=desc, unit=unit, total=total)
    return bar

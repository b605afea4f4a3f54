"""`parl.utils.logger`: the logger of user scripts, examples and command-line tools.

It prints readable, timestamped lines (`[11-22 10:56:12 train.py:42] message`) to standard
output, coloured on a terminal, and with `logger.set_dir(dir)` also appends them to
`dir/log.log`. It is built on the standard `logging` module (logger name `parl`), so its level
and handlers can be changed the usual way. Library code does not use it: libraries log through
`logging.getLogger(__name__)` and leave configuration to the program.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
from typing import Any, TextIO

__all__ = ["default_log_dir", "logger"]

_DATEFMT = "%m-%d %H:%M:%S"
_FORMAT = "[%(asctime)s %(filename)s:%(lineno)d]%(levelprefix)s %(message)s"
_COLOURS = {logging.WARNING: "\x1b[33m", logging.ERROR: "\x1b[31m", logging.CRITICAL: "\x1b[31m"}
_PREFIX = {
    logging.DEBUG: " DBG",
    logging.WARNING: " WRN",
    logging.ERROR: " ERR",
    logging.CRITICAL: " CRT",
}


class _Formatter(logging.Formatter):
    def __init__(self, colour: bool) -> None:
        super().__init__(_FORMAT, _DATEFMT)
        self._colour = colour

    def format(self, record: logging.LogRecord) -> str:
        prefix = _PREFIX.get(record.levelno, "")
        if self._colour:
            colour = _COLOURS.get(record.levelno, "")
            prefix = f"{colour}{prefix}\x1b[0m" if prefix else ""
        record.levelprefix = prefix
        line = super().format(record)
        if self._colour:
            head, _, rest = line.partition("]")
            line = f"\x1b[32m{head}]\x1b[0m{rest}"
        return line


class _StdoutHandler(logging.StreamHandler[TextIO]):
    """Writes to whatever `sys.stdout` is at the time of each line (it may be replaced)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> TextIO:
        return sys.stdout

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class _Logger:
    """A `logging.Logger` named "parl" with PARL's extras: `set_dir`, `get_dir`, `auto_set_dir`."""

    def __init__(self) -> None:
        self._logger = logging.getLogger("parl")
        self._lock = threading.Lock()
        self._configured = False
        self._dir: str | None = None
        self._file_handler: logging.FileHandler | None = None

    def _ensure_configured(self) -> logging.Logger:
        if not self._configured:
            with self._lock:
                if not self._configured:
                    stream = _StdoutHandler()
                    colour = hasattr(sys.stdout, "isatty") and sys.stdout.isatty()
                    stream.setFormatter(_Formatter(colour and "NO_COLOR" not in os.environ))
                    self._logger.addHandler(stream)
                    if self._logger.level == logging.NOTSET:
                        self._logger.setLevel(logging.INFO)
                    self._logger.propagate = False
                    self._configured = True
        return self._logger

    # -- logging -------------------------------------------------------------------------------
    def debug(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log at DEBUG level (hidden unless `set_level("DEBUG")`)."""
        self._ensure_configured().debug(msg, *args, stacklevel=2, **kwargs)

    def info(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log at INFO level."""
        self._ensure_configured().info(msg, *args, stacklevel=2, **kwargs)

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log at WARNING level."""
        self._ensure_configured().warning(msg, *args, stacklevel=2, **kwargs)

    warn = warning

    def error(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log at ERROR level."""
        self._ensure_configured().error(msg, *args, stacklevel=2, **kwargs)

    def exception(self, msg: object, *args: Any, **kwargs: Any) -> None:
        """Log at ERROR level with the current exception's traceback."""
        self._ensure_configured().exception(msg, *args, stacklevel=2, **kwargs)

    def set_level(self, level: int | str) -> None:
        """Set the lowest level that is printed, e.g. `"DEBUG"` or `logging.WARNING`."""
        self._ensure_configured().setLevel(level)

    # -- log directory -------------------------------------------------------------------------
    def set_dir(self, dirname: str | os.PathLike[str]) -> None:
        """Also write every line to `dirname/log.log` (the directory is created if needed).

        The directory also becomes the default one of `parl.utils.summary`.
        """
        log = self._ensure_configured()
        dirname = os.fspath(dirname)
        os.makedirs(dirname, exist_ok=True)
        with self._lock:
            if self._file_handler is not None:
                log.removeHandler(self._file_handler)
                self._file_handler.close()
            handler = logging.FileHandler(os.path.join(dirname, "log.log"), encoding="utf-8")
            handler.setFormatter(_Formatter(colour=False))
            log.addHandler(handler)
            self._file_handler = handler
            self._dir = dirname

    def get_dir(self) -> str | None:
        """Return the directory given to `set_dir`, or None."""
        return self._dir

    def auto_set_dir(self, action: str = "k") -> str:
        """Set the directory to `./train_log/<script name>`.

        Args:
            action: what to do when it already exists: "k" keep it, "d" delete it first.
        """
        if action not in ("k", "d"):
            raise ValueError(f"auto_set_dir: {action=} must be 'k' (keep) or 'd' (delete)")
        dirname = default_log_dir()
        if action == "d" and os.path.isdir(dirname):
            shutil.rmtree(dirname)
        self.set_dir(dirname)
        return dirname


def default_log_dir() -> str:
    """Return `train_log/<name of the running script>` (`interactive` without a script)."""
    script = getattr(sys.modules.get("__main__"), "__file__", None) or "interactive"
    return os.path.join("train_log", os.path.splitext(os.path.basename(script))[0])


logger = _Logger()

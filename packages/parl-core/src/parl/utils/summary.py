"""`parl.utils.summary`: TensorBoard scalars and histograms, PARL's module-level API.

    from parl.utils import summary
    summary.add_scalar("train/loss", loss, step)
    summary.add_histogram("train/actions", actions, step)

Calls go to one default `SummaryWriter` whose directory is, in order: the one given to
`summary.set_dir`, `logger.set_dir`'s, or `./train_log/<script name>`. `SummaryWriter` can also
be used directly for several runs in one process. Files are real TensorBoard event files
(`events.out.tfevents.*`), readable by TensorBoard with no TensorFlow installed, written without
a protobuf dependency. Buffered lines are flushed every `flush_secs` seconds, by `flush()`, and
at exit.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import time
from typing import Any

import numpy as np

from parl.utils import _event_file as ev

__all__ = [
    "SummaryWriter",
    "add_histogram",
    "add_scalar",
    "close",
    "flush",
    "get_dir",
    "set_dir",
]


class SummaryWriter:
    """Writes one TensorBoard event file into `logdir`.

    Args:
        logdir: the run's directory (created if needed); point TensorBoard at it or its parent.
        flush_secs: flush buffered events to disk at least this often while writing.
        filename_suffix: appended to the event file's name.
    """

    _counter = 0
    _counter_lock = threading.Lock()

    def __init__(
        self, logdir: str | os.PathLike[str], flush_secs: float = 10.0, filename_suffix: str = ""
    ) -> None:
        self.logdir = os.fspath(logdir)
        os.makedirs(self.logdir, exist_ok=True)
        with SummaryWriter._counter_lock:
            SummaryWriter._counter += 1
            counter = SummaryWriter._counter
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.{counter}{filename_suffix}"
        )
        self.path = os.path.join(self.logdir, name)
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed by close()/atexit
        self._lock = threading.Lock()
        self._flush_secs = flush_secs
        self._last_flush = time.monotonic()
        self._write(ev.encode_event(time.time(), file_version="brain.Event:2"))
        self.flush()
        atexit.register(self.close)

    def add_scalar(self, tag: str, value: float, step: int, walltime: float | None = None) -> None:
        """Record `value` (any real number, a numpy or torch scalar) under `tag` at `step`."""
        scalar = float(value.item() if hasattr(value, "item") else value)
        record = ev.encode_value(_check_tag(tag), simple_value=scalar)
        self._write(ev.encode_event(walltime or time.time(), int(step), values=[record]))

    def add_histogram(
        self,
        tag: str,
        values: Any,
        step: int,
        bins: int | str = "auto",
        walltime: float | None = None,
    ) -> None:
        """Record the distribution of `values` (an array, list or tensor) under `tag` at `step`.

        Args:
            tag: the name TensorBoard shows, e.g. "train/q_values".
            values: the sample whose distribution is recorded; NaN and infinities are refused.
            step: the x coordinate (env steps, by convention).
            bins: as for `numpy.histogram` (a count, or a rule such as "auto").
            walltime: seconds since the epoch to record (default: now).
        """
        if hasattr(values, "detach"):
            values = values.detach().cpu().numpy()
        array = np.asarray(values, dtype=np.float64).ravel()
        if array.size == 0:
            raise ValueError(f"add_histogram: {tag!r} got no values")
        if not np.isfinite(array).all():
            raise ValueError(f"add_histogram: {tag!r} has NaN or infinite values")
        counts, edges = np.histogram(array, bins=bins)
        histo = ev.encode_histogram(
            float(array.min()),
            float(array.max()),
            float(array.size),
            float(array.sum()),
            float(np.dot(array, array)),
            edges[1:].tolist(),
            counts.astype(np.float64).tolist(),
        )
        record = ev.encode_value(_check_tag(tag), histo=histo)
        self._write(ev.encode_event(walltime or time.time(), int(step), values=[record]))

    def flush(self) -> None:
        """Write buffered events to disk."""
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                self._last_flush = time.monotonic()

    def close(self) -> None:
        """Flush and close the file; later writes raise ValueError."""
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                self._file.close()
        atexit.unregister(self.close)

    def _write(self, event: bytes) -> None:
        record = ev.frame_record(event)
        with self._lock:
            if self._file.closed:
                raise ValueError(f"SummaryWriter({self.logdir!r}) is closed")
            self._file.write(record)
            if time.monotonic() - self._last_flush >= self._flush_secs:
                self._file.flush()
                self._last_flush = time.monotonic()

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_tag(tag: str) -> str:
    if not isinstance(tag, str) or not tag:
        raise ValueError(f"summary tag must be a non-empty string, got {tag!r}")
    return tag


# -- the module-level default writer (PARL's API) ----------------------------------------------
_writer: SummaryWriter | None = None
_dir: str | None = None
_lock = threading.Lock()


def set_dir(logdir: str | os.PathLike[str]) -> None:
    """Send later `add_*` calls to a new event file in `logdir`."""
    global _writer, _dir
    with _lock:
        if _writer is not None:
            _writer.close()
            _writer = None
        _dir = os.fspath(logdir)


def get_dir() -> str:
    """Return the directory the module-level functions write to."""
    if _dir is not None:
        return _dir
    from parl.utils._logger import default_log_dir, logger

    return logger.get_dir() or default_log_dir()


def _default_writer() -> SummaryWriter:
    global _writer
    if _writer is None:
        with _lock:
            if _writer is None:
                _writer = SummaryWriter(get_dir())
    return _writer


def add_scalar(tag: str, value: float, step: int) -> None:
    """Record a scalar under `tag` at `step` (see `SummaryWriter.add_scalar`)."""
    _default_writer().add_scalar(tag, value, step)


def add_histogram(tag: str, values: Any, step: int, bins: int | str = "auto") -> None:
    """Record a histogram of `values` under `tag` at `step` (see `SummaryWriter.add_histogram`)."""
    _default_writer().add_histogram(tag, values, step, bins=bins)


def flush() -> None:
    """Write the default writer's buffered events to disk."""
    if _writer is not None:
        _writer.flush()


def close() -> None:
    """Close the default writer; the next `add_*` call opens a new event file."""
    global _writer
    with _lock:
        if _writer is not None:
            _writer.close()
            _writer = None

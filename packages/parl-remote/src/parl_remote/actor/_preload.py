"""Warm processes that arrive with the imports their actors need.

Once an actor's constructor has returned, its process reports to its worker the modules it
imported since it was assigned (`imported_since`): names only, of installed and standard-library
modules, never the user's shipped code (the bundle unpacked into the actor's directory). The
worker keeps them, validated (`check_report`) and bounded, as its preload set, and has its warm
processes import it, one process at a time, each in the background on a thread of its own
(`Preloader`): the next actor of the same class finds numpy or torch already imported. Only
modules an earlier actor of the cluster imported are preloaded, and those named ahead of any
actor (`xparl start --preload torch,numpy`, `parl.connect(preload=["torch"])`, read by
`preload_names`), so no user code runs unasked;
a module that fails or is missing is logged and skipped; the process stops preloading once its
memory passes `PARL_PRELOAD_MAX_MB`. Preloading yields to actors: the worker lowers the
importing process's session to a low CPU share and gives it back before the process takes an
actor (`worker._priority`), or, where it cannot, holds the import at the next module
(`Preloader.pause`) while its actors keep the CPUs busy. The preloading thread keeps its
process's priority: a niced thread holding the GIL (as the import of a compiled module does
for seconds) would stall the process's event loop whenever the CPUs are busy, past the worker's
wait for it to take its actor. When the process is assigned an actor it starts no further
import and the actor's code does not wait for the one in flight: Python's module locks
make the actor wait only if it imports that very module. A shipped module always wins over a
preloaded one of the same name (`drop_shadowed`). `PARL_PRELOAD=0` turns all of it off.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import sys
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from parl_remote._config import settings

__all__ = [
    "MAX_NAME_CHARS",
    "Preloader",
    "check_report",
    "drop_shadowed",
    "imported_since",
    "is_module_name",
    "learn",
    "preload_names",
]

logger = logging.getLogger(__name__)

MAX_NAME_CHARS = 200
"""The longest module name a report may carry."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_NEVER = frozenset({"__main__", "__mp_main__", "__parents_main__"})


def is_module_name(name: object) -> bool:
    """Whether `name` is a dotted identifier (`numpy`, `torch.nn`) of a sane length."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_NAME_CHARS
        and _NAME.fullmatch(name) is not None
        and name.partition(".")[0] not in _NEVER
    )


def check_report(names: Sequence[object], *, limit: int) -> list[str]:
    """Validate the module names an actor process reported; raise ValueError on any bad one.

    A process only reports names it checked itself, so one bad entry means the report is not
    to be trusted at all: the whole of it is rejected.
    """
    if len(names) > limit:
        raise ValueError(f"a report of {len(names)} modules is over the limit of {limit}")
    for name in names:
        if not is_module_name(name):
            raise ValueError(
                f"{name!r:.80} is not a module name (dotted identifiers of at most "
                f"{MAX_NAME_CHARS} characters)"
            )
    return [str(name) for name in names]


def preload_names(modules: str | Iterable[object]) -> list[str]:
    """The modules to preload ahead of any actor, checked: "torch,numpy" or a list of names.

    Raises:
        ValueError: one is not a module name, saying which.
    """
    names = modules.split(",") if isinstance(modules, str) else list(modules)
    names = [n.strip() if isinstance(n, str) else n for n in names]
    for name in names:
        if not is_module_name(name):
            raise ValueError(
                f"preload: {name!r:.80} is not a module name: give installed modules by their "
                'dotted names, e.g. "torch,numpy" or ["torch", "numpy"]'
            )
    return [str(n) for n in names if n]


def learn(known: dict[str, None], imports: Sequence[object], who: str) -> list[str]:
    """Add an actor's reported imports to a worker's preload set `known` (bounded, in order).

    Returns the names new to it; a report that fails `check_report` is logged and ignored.
    """
    limit = settings.preload_max_modules
    try:
        names = check_report(imports, limit=limit)
    except ValueError as exc:
        logger.warning("ignored the imports reported by actor %s: %s", who, exc)
        return []
    news = [n for n in names if n not in known][: max(0, limit - len(known))]
    known.update(dict.fromkeys(news))
    return news


def _origin(module: object) -> str | None:
    spec = getattr(module, "__spec__", None)
    if spec is None:
        return None  # made at run time (no finder can import it again)
    return getattr(spec, "origin", None) or ""


def imported_since(baseline: Iterable[str], shipped_dir: str, *, limit: int) -> list[str]:
    """Modules imported since `baseline` that a warm process could import again by name.

    Left out: modules of the shipped code (found under `shipped_dir`), modules made at run
    time (no spec), `__main__`, and names that are not plain dotted identifiers. In the order
    they were first imported (a package before its submodules), at most `limit`.
    """
    if limit <= 0:
        return []
    before = set(baseline)
    shipped = os.path.join(os.path.realpath(shipped_dir), "")
    names = []
    for name, module in list(sys.modules.items()):
        if name in before or not is_module_name(name):
            continue
        origin = _origin(module)
        if origin is None or os.path.realpath(origin).startswith(shipped):
            continue
        names.append(name)
        if len(names) >= limit:
            break
    return names


def drop_shadowed(paths: Iterable[str], shipped_dir: str) -> list[str]:
    """Forget imported modules named like shipped ones, so that the shipped code is imported.

    `paths` are the shipped files, relative to `shipped_dir`. Return the names dropped.
    """
    shipped = os.path.join(os.path.realpath(shipped_dir), "")
    tops = {p.split("/")[0].removesuffix(".py") for p in paths if p.endswith(".py")}
    dropped = []
    # One pass over a copy taken at once (in C, under the GIL): the preloading thread may be
    # importing, and a process with torch imported holds thousands of modules.
    for name in [n for n in tuple(sys.modules) if n.partition(".")[0] in tops]:
        module = sys.modules.get(name)  # a failed import meanwhile removes its module
        if module is None:
            continue
        origin = _origin(module) or ""
        if not os.path.realpath(origin).startswith(shipped):
            sys.modules.pop(name, None)
            dropped.append(name)
    return dropped


def _rss_mb() -> float:
    """This process's resident memory, MB (its peak where the current figure is unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return float(peak) / (1e6 if sys.platform == "darwin" else 1e3)


class _Gate:
    """A finder that finds nothing: it holds the preloading thread at each module while paused.

    First on `sys.meta_path` while a preloader runs; any other thread passes straight through.
    """

    def __init__(self, go: threading.Event) -> None:
        self.go = go
        self.thread = threading.get_ident()

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if threading.get_ident() == self.thread:
            self.go.wait()


class Preloader:
    """Imports module names in the background of a warm process, until it is told to stop.

    Args:
        max_mb: the memory past which it imports nothing more (`PARL_PRELOAD_MAX_MB`).
        on_idle: called on its thread, with how many names it has taken in all, each time it
            has gone through every name it was given (or stopped): the process tells its
            worker, which then prefers it to a process still importing.
    """

    def __init__(
        self, *, max_mb: float | None = None, on_idle: Callable[[int], None] | None = None
    ) -> None:
        self.max_mb = settings.preload_max_mb if max_mb is None else max_mb
        self.on_idle = on_idle
        self.imported: list[str] = []
        """Names this process imported ahead of its actor, in order."""
        self.failed: list[str] = []
        """Names whose import raised (each logged once)."""
        self._queue: deque[str] = deque()
        self._seen: set[str] = set()
        self._failed_tops: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._running = False  # a thread takes names (set and cleared under the lock)
        self._stopped = False
        self._go = threading.Event()  # cleared: the thread holds at the next module
        self._go.set()

    def add(self, names: Iterable[str]) -> None:
        """Queue names not seen before; start the background thread if it is not running."""
        with self._lock:
            if self._stopped:  # over its memory bound, or assigned: it has gone through them
                self._seen.update(names)
                if self.on_idle is not None:
                    self.on_idle(len(self._seen))
                return
            for name in names:
                if name not in self._seen and is_module_name(name):
                    self._seen.add(name)
                    self._queue.append(name)
            if self._queue and not self._running:
                self._running = True
                self._thread = threading.Thread(target=self._run, name="parl-preload", daemon=True)
                self._thread.start()

    @property
    def busy(self) -> bool:
        """Whether its thread is importing (or about to)."""
        return self._thread is not None and self._thread.is_alive()

    def pause(self, paused: bool) -> None:
        """Hold the import in flight at its next module (`paused`), or let it go on."""
        with self._lock:
            if paused and not self._stopped:
                self._go.clear()
            else:
                self._go.set()

    @property
    def paused(self) -> bool:
        """Whether it is told to hold."""
        return not self._go.is_set()

    def stop(self) -> None:
        """Start no further import; the one in flight, if any, goes on, unpaused."""
        with self._lock:
            self._stopped = True
            self._queue.clear()
            self._go.set()

    def finish(self, timeout: float) -> bool:
        """Stop, and wait up to `timeout` s for the import in flight; return whether it ended."""
        self.stop()
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        if thread.is_alive():
            logger.warning("a preloaded import still runs after %.0f s; going on", timeout)
            return False
        return True

    def _next(self) -> str | None:
        self._go.wait()  # held here while paused; `stop` lets it go, to find nothing more
        with self._lock:
            while self._queue and not self._stopped:
                name = self._queue.popleft()
                if name not in sys.modules and name.partition(".")[0] not in self._failed_tops:
                    return name
            self._running = False  # a name added from now on starts a thread of its own
            return None

    def _run(self) -> None:
        gate = _Gate(self._go)
        sys.meta_path.insert(0, gate)
        try:
            self._take_names()
        finally:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(gate)
        if self.on_idle is not None:
            self.on_idle(len(self._seen))

    def _take_names(self) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a deprecated alias warns; nobody asked for it yet
            while (name := self._next()) is not None:
                if _rss_mb() > self.max_mb:
                    logger.info("preloading stopped at %.0f MB (PARL_PRELOAD_MAX_MB)", self.max_mb)
                    self.stop()
                    with self._lock:
                        self._running = False
                    break
                try:
                    importlib.import_module(name)
                except BaseException as exc:
                    self.failed.append(name)
                    self._failed_tops.add(name.partition(".")[0])  # and its submodules
                    level = (
                        logging.INFO if isinstance(exc, ModuleNotFoundError) else logging.WARNING
                    )
                    logger.log(
                        level, "preloading %s skipped: %s: %s", name, type(exc).__name__, exc
                    )
                else:
                    self.imported.append(name)

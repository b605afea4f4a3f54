"""Event loops: uvloop wherever it is installed, the standard loop otherwise."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["new_event_loop", "run"]

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
    uvloop = None  # type: ignore[assignment]  # the module or None, tested before use


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new uvloop loop (or a standard one where uvloop is unavailable)."""
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, Any]) -> Any:
    """Run `main` to completion on a new loop from `new_event_loop`."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)

"""Short garbage-collector pauses for a master of many peers.

Left alone, CPython's cyclic collector now and then scans every object the process tracks: on
a master of 10,000 workers some 250,000 (each connection's protocol, buffers, future, its
worker's record), a pause long enough to hold up the heartbeats, placements and dashboard
requests that arrive meanwhile, since they all wait for the master's one loop. Yet most of
those objects live as long as their peer; what churns is small (actors placed and ended,
requests, messages). So `Collector.step()`, which the master runs every second, collects what
is not frozen -- what was made since the last step, a short pause -- and freezes the
survivors (`gc.freeze`): the automatic collections between two steps then scan only the
young objects. A frozen object that dies by reference counting is freed as usual; one that
dies in a reference cycle waits for the next full collection, which comes once the frozen
objects have grown by a quarter since the last one (CPython's own rule for its oldest
generation), as counted every `check_every` steps.
"""

from __future__ import annotations

import gc

__all__ = ["Collector"]


class Collector:
    """Collects the young objects and freezes the survivors, step by step.

    For a process that is only a master: it freezes every object of the process.

    Args:
        growth: the share by which the frozen objects may grow before a full collection.
        check_every: how many steps apart the frozen objects are counted (a pass over them).
    """

    def __init__(self, *, growth: float = 0.25, check_every: int = 10) -> None:
        self.growth = growth
        self.check_every = check_every
        self.full_collections = 0
        self._steps = 0
        self._base: int | None = None  # frozen objects after the last full collection

    def step(self) -> None:
        """Collect what is not frozen, then freeze what survived; in full if the frozen grew."""
        gc.collect()
        gc.freeze()
        self._steps += 1
        if self._base is not None and self._steps % self.check_every:
            return
        frozen = gc.get_freeze_count()
        if self._base is None:
            self._base = frozen
        elif frozen > self._base * (1 + self.growth):
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self._base = gc.get_freeze_count()
            self.full_collections += 1

    def close(self) -> None:
        """Hand every object back to the automatic collector."""
        gc.unfreeze()

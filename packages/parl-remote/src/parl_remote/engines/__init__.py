"""Engines: where the actors of a process's handles are placed and run.

`xparl` is PARL's own cluster (a master, workers and actor processes); `ray` places the same
actors on a Ray cluster. The handles of `client/` reach either through `parl.connect`.
"""

from __future__ import annotations

__all__: list[str] = []

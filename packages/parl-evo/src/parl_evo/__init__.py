"""parl_evo: evolution strategies with seeded noise (EvoKit), exposed as `parl.evo`."""

from __future__ import annotations

__all__: list[str] = []

"""parl_dashboard: the cluster's resources, actors and logs in the browser."""

from __future__ import annotations

__all__: list[str] = []

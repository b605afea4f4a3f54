"""parl_remote: the cluster runtime behind `parl.remote_class`, `parl.connect` and `xparl`."""

from __future__ import annotations

__all__: list[str] = []

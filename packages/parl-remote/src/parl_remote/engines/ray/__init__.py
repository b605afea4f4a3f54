"""The Ray engine: `parl.connect(backend="ray")` places the same actors on a Ray cluster.

`_client` is the `RayClient` that stands where the xparl `Client` stands (an `Engine`, found
through the entry point parl-remote declares); `_refs` is the handles'
side of one Ray-hosted actor; `_host` is the Ray actor that hosts one parl actor inside a Ray
worker. Ray is imported only here, and only when this engine is used.
"""

from __future__ import annotations

from parl_remote.engines.ray._client import RayClient

__all__ = ["RayClient"]

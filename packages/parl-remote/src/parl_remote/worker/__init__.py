"""The worker: one a machine, the parent of every actor process there.

`_worker` registers the machine's CPU (and GPU) slots with the master, keeps one warm actor
process ready per vacant slot and reports their fates; `_actor_process` is its view of one
such process (how it is started, described and measured); `_logs` carries what the actor
processes print to the master.
"""

from __future__ import annotations

__all__: list[str] = []

"""Which worker takes an actor: the rule, and the registry's index that applies it without a scan.

`choose_worker` defines the choice over a list of workers: the most vacant slots wins; among
equals, an actor without GPUs goes where the fewest GPUs are free; among those, the first in
the list (the registry lists workers in the order they registered). Scanning every worker for
every placement makes a placement's cost grow with the cluster, so the registry keeps this
index instead, told of each worker whose slots or GPUs change (`update`) and of each that
leaves (`remove`).

An actor without GPUs (nearly every actor) is placed from a heap keyed by that order, with lazy
invalidation: a change pushes the worker's new key and leaves its old entries in place; an
entry whose key is no longer its worker's is dropped when it reaches the top, and the heap is
rebuilt from the live workers once stale entries outnumber them. A placement is O(log n)
amortized. An actor asking for GPUs is placed by `choose_worker` over the workers that offer
GPUs only, which are few.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from itertools import count
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Slots", "VacancyIndex", "choose_worker"]


class Slots(Protocol):
    """What the choice reads of a worker (the registry's `WorkerInfo`)."""

    worker_id: str
    gpus: list[str]
    free_gpus: list[str]
    conn: Any

    @property
    def vacant(self) -> int:
        """CPU slots without an actor."""


W = TypeVar("W", bound=Slots)

# (-vacant, free GPUs, registration order, push order, worker): the push order keeps two
# entries of one worker from ever comparing the workers themselves
_Entry = tuple[int, int, int, int, W]


def choose_worker(workers: Iterable[W], n_gpu: int) -> W | None:
    """The worker for an actor asking `n_gpu` GPUs, or None if no connected worker can take it.

    The one with the most vacant slots wins, spreading actors over the cluster; among equals, an
    actor without GPUs goes where the fewest GPUs are free, keeping them for actors that ask;
    among those, the first of `workers`.
    """
    candidates = [
        w for w in workers if w.vacant > 0 and len(w.free_gpus) >= n_gpu and w.conn is not None
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda w: (w.vacant, -len(w.free_gpus) if not n_gpu else 0))


class VacancyIndex(Generic[W]):
    """Registered workers, ordered as `choose_worker` would choose among them."""

    def __init__(self) -> None:
        self._order: dict[str, int] = {}  # worker id -> its registration order
        self._workers: dict[str, W] = {}
        self._gpu_workers: dict[str, W] = {}  # in registration order
        self._heap: list[_Entry[W]] = []
        self._next = count()
        self._pushes = count()

    def update(self, worker: W) -> None:
        """`worker` registered, or its vacant slots or free GPUs changed."""
        worker_id = worker.worker_id
        if worker_id not in self._order:
            self._order[worker_id] = next(self._next)
        self._workers[worker_id] = worker
        if worker.gpus:
            self._gpu_workers[worker_id] = worker
        else:
            self._gpu_workers.pop(worker_id, None)
        if worker.vacant > 0:
            order, vacant, free = self._order[worker_id], worker.vacant, len(worker.free_gpus)
            heapq.heappush(self._heap, (-vacant, free, order, next(self._pushes), worker))
            if len(self._heap) > 2 * len(self._workers) + 64:
                self._rebuild()

    def remove(self, worker: W) -> None:
        """`worker` left the registry (its heap entries go as they surface)."""
        worker_id = worker.worker_id
        if self._workers.get(worker_id) is worker:
            del self._workers[worker_id], self._order[worker_id]
            self._gpu_workers.pop(worker_id, None)

    def choose(self, n_gpu: int) -> W | None:
        """The worker `choose_worker` would pick for an actor asking `n_gpu` GPUs, or None."""
        if n_gpu:
            return choose_worker(self._gpu_workers.values(), n_gpu)
        heap, unreachable = self._heap, []
        chosen: W | None = None
        while heap:
            entry = heap[0]
            if not self._current(entry):
                heapq.heappop(heap)
            elif entry[4].conn is None:  # never chosen while it has no connection
                unreachable.append(heapq.heappop(heap))
            else:
                chosen = entry[4]
                break
        for entry in unreachable:
            heapq.heappush(heap, entry)
        return chosen

    def _current(self, entry: _Entry[W]) -> bool:
        worker = entry[4]
        return (
            self._workers.get(worker.worker_id) is worker
            and self._order[worker.worker_id] == entry[2]
            and entry[0] == -worker.vacant
            and entry[1] == len(worker.free_gpus)
        )

    def _rebuild(self) -> None:
        self._heap = [
            (-w.vacant, len(w.free_gpus), self._order[w.worker_id], next(self._pushes), w)
            for w in self._workers.values()
            if w.vacant > 0
        ]
        heapq.heapify(self._heap)

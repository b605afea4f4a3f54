"""Numpy arrays on parl-remote's shared-memory segments: the samplers' same-host data plane.

`SharedArrays.create(layout)` makes a `parl_remote.shm.Segment` sized for the layout's arrays
(each 64-byte aligned), owned by this process; `SharedArrays.attach(ref, layout)` maps it in a
worker of the same host, checking that it is that segment and of that size. Both give `arrays`,
numpy views laid out as `layout` says. `ArrayPool` is a `parl_remote.shm.SegmentPool` of one
layout whose loans are arrays: a segment is lent again only once every array of its last loan
(and every view of them) is gone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import DTypeLike

from parl_remote.shm import FLAG_WORDS, Segment, SegmentPool, SegmentRef

__all__ = ["ArrayPool", "Layout", "PREFIX", "SharedArrays", "layout_size", "with_flags"]

PREFIX = "parl-sampler"
"""The name prefix of the samplers' segments."""
_ALIGN = 64

Layout = Sequence[tuple[str, tuple[int, ...], DTypeLike]]
"""What a segment holds: `(name, shape, dtype)` of each array, in order."""


def with_flags(layout: Layout) -> list[tuple[str, tuple[int, ...], DTypeLike]]:
    """A segment's layout: `layout` and a flag block (`flags`, `FlagSignal`'s words) after it."""
    return [*layout, ("flags", (FLAG_WORDS,), np.dtype(np.uint32))]


def _spans(layout: Layout) -> tuple[list[tuple[str, int, int, np.dtype]], int]:
    spans, size = [], 0
    for key, shape, dtype in layout:
        size = -(-size // _ALIGN) * _ALIGN
        dt = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        spans.append((key, size, nbytes, dt))
        size += nbytes
    return spans, max(size, 1)


def layout_size(layout: Layout) -> int:
    """The bytes of a segment laid out as `layout`."""
    return _spans(layout)[1]


class SharedArrays:
    """Arrays on one shared-memory segment; make one with `create` or `attach`.

    Attributes:
        segment: the `parl_remote.shm.Segment` under them.
        arrays: name -> numpy view on the segment, shaped as the layout says.
    """

    def __init__(self, segment: Segment, layout: Layout) -> None:
        self.segment = segment
        self._spans, _ = _spans(layout)
        self._shapes = {key: tuple(shape) for key, shape, _ in layout}
        self.arrays = self.new_views()[1]

    @property
    def name(self) -> str:
        """The segment's name."""
        return self.segment.name

    @property
    def ref(self) -> SegmentRef:
        """The segment's reference, for a worker to `attach`."""
        return self.segment.ref

    @classmethod
    def create(cls, layout: Layout) -> SharedArrays:
        """A new segment of this layout; this process owns it."""
        return cls(Segment.create(layout_size(layout), PREFIX), layout)

    @classmethod
    def attach(cls, ref: SegmentRef | tuple, layout: Layout) -> SharedArrays:
        """Map the segment `ref` made by `create` with the same layout (same host, same user).

        Raises:
            ValueError: a bad reference, or a segment that is not that one or not of this size.
            OSError: it cannot be opened (another host, or its owner is gone).
        """
        segment, size = Segment.attach(ref), layout_size(layout)
        if segment.size != size:
            segment.close()
            raise ValueError(
                f"shared-memory segment {segment.name!r} has {segment.size} bytes, not {size}"
            )
        return cls(segment, layout)

    def new_views(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Fresh views of the segment's arrays, all on one new byte array over the whole segment.

        Returns that byte array and the views by name. Every view of the views refers to the
        byte array (numpy keeps an array's base, not a chain of views), so a weak reference to
        it says when none of them is left. The mapping stays valid while any of them lives.
        """
        whole = np.frombuffer(self.segment.buffer, np.uint8)
        views = {
            key: whole[offset : offset + nbytes].view(dtype).reshape(self._shapes[key])
            for key, offset, nbytes, dtype in self._spans
        }
        return whole, views

    def close(self) -> None:
        """Unmap the segment here (views handed out elsewhere keep it mapped until they go)."""
        self.arrays = {}
        self.segment.close()


class ArrayPool:
    """Segments of one layout, lent out as arrays and taken back once those arrays are gone.

    `acquire()` takes a free segment, or makes one while the pool has fewer than `limit`; None
    where neither can be (the caller then keeps to memory of its own). `lend(segment)` turns an
    acquired segment into fresh arrays (`SharedArrays.new_views`), lent until none of them, and
    no view of them, is left. `release(segment)` frees an acquired segment that was not lent;
    `close()` closes every segment (a lent one stays mapped until its arrays are gone).

    Args:
        layout: the arrays of every segment.
        limit: the most segments the pool makes.
    """

    def __init__(self, layout: Layout, limit: int) -> None:
        self.layout = list(layout)
        self._pool = SegmentPool(layout_size(self.layout), limit, PREFIX)
        self._arrays: dict[str, SharedArrays] = {}

    @property
    def segments(self) -> list[SharedArrays]:
        """Every segment made (free, acquired or lent), until `close()`."""
        return [self._arrays[s.name] for s in self._pool.segments]

    def acquire(self) -> SharedArrays | None:
        """A segment that no array refers to any more: a free one, or a new one; None: no more."""
        segment = self._pool.acquire()
        if segment is None:
            return None
        arrays = self._arrays.get(segment.name)
        if arrays is None:
            arrays = self._arrays[segment.name] = SharedArrays(segment, self.layout)
        return arrays

    def lend(self, arrays: SharedArrays) -> dict[str, np.ndarray]:
        """Arrays on an acquired segment; it is released once they (and their views) are gone."""
        whole, views = arrays.new_views()
        self._pool.lend(arrays.segment, whole)
        return views

    def release(self, arrays: SharedArrays) -> None:
        """Put an acquired segment back."""
        self._pool.release(arrays.segment)

    def close(self) -> None:
        """Close every segment; a lent one stays mapped until its arrays are gone."""
        for arrays in self._arrays.values():
            arrays.arrays = {}
        self._arrays = {}
        self._pool.close()

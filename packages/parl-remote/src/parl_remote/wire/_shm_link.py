"""The shared memory of one connection: the segments it lends the peer and those it maps.

The part of `_shm.py` that holds state for a connection (see that module for the whole
picture): `SharedLink` writes outgoing buffers into a pool of segments it owns, lent to the
peer until handed back, and gives incoming ones as views of the peer's segments.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import struct
import threading
import weakref
from collections import deque
from typing import Any

from parl_remote._exceptions import ProtocolError
from parl_remote._util import loaded_module
from parl_remote.wire._segment import create_memfd, open_memfd
from parl_remote.wire._shm import (
    SegmentStore,
    decode_ref,
    encode_ref,
    encode_returns,
    layout,
    segment_name,
    size_class,
)

__all__ = ["SharedLink"]

_FREE_MAX = 4  # idle segments a connection keeps for its next messages
_MAPS_MAX = 8  # segments of the peer a connection keeps mapped
_RETURN_MAX = 64  # names handed back in one frame (well within MAX_REF)
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_FRAME_HEAD = struct.Struct("<II")  # as in protocol.connection


class _Segment:
    """One segment this process owns: its name, its descriptor and a shared, writable mapping."""

    __slots__ = ("fd", "map", "name", "size")

    def __init__(self, name: str, fd: int, size: int, mapping: mmap.mmap) -> None:
        self.name, self.fd, self.size, self.map = name, fd, size, mapping


class SharedLink:
    """The shared memory of one connection, both ways.

    Sending, it lends the peer segments from a pool of its own: `place` writes the buffers
    into a free segment (or a new one) and the peer hands the name back (`returned`) once it
    is done with them, so that steady traffic reuses the same already-mapped pages.
    Receiving, `take` gives the buffers as views of the peer's segment (mapped once, kept
    mapped while used) and hands the segment back (`returns`) once nothing of them is left:
    the arrays unpickled from them keep the views, so they stay valid, and writable, for as
    long as the user holds them. A segment it removes while the connection lives (beyond the
    few it keeps free, or to make room under the cap) is named to the peer the same way, so
    that the peer's mapping does not keep its pages. `close` removes every segment of its
    own and forgets the peer's.

    Args:
        store: this process's store.
    """

    def __init__(self, store: SegmentStore) -> None:
        self.store = store
        self.threshold = store.threshold
        self._lock = threading.Lock()
        self._free: list[_Segment] = []  # lent and handed back, oldest first
        self._lent: dict[str, _Segment] = {}
        self._maps: dict[str, mmap.mmap] = {}  # the peer's, least recently used first
        self.owed: deque[str] = deque()
        """The peer's segments this end is done with, to hand back (finalizers append: no lock)."""
        self._staged: dict[int, tuple[str, int]] = {}  # a staged mapping's id: its name, fd
        self._own = segment_name(store.tag, os.getpid(), 0).rpartition("-")[0] + "-"  # ours
        self.closed = False

    # -- sending -----------------------------------------------------------------------------
    def place(self, raws: list[Any], lengths: list[int]) -> bytes | None:
        """Write the buffers into a segment lent to the peer; its reference, or None (the socket).

        Buffers that `stage` returned are in their segment already: its reference, no copy.
        """
        if self._staged and (ref := self._staged.pop(id(raws[0].obj), None)) is not None:
            return encode_ref(ref[0], ref[1], lengths)
        offsets, size = layout(lengths)
        segment = self._borrow(size)
        if segment is None:
            return None
        mapping = segment.map
        for raw, offset, n in zip(raws, offsets, lengths, strict=True):
            mapping[offset : offset + n] = raw
        return encode_ref(segment.name, segment.fd, lengths)

    def took(self, buffers: list[Any] | tuple[Any, ...]) -> bool:
        """Whether a message with these buffers, sent on this link, holds no view of them.

        It wrote them into a segment, or copied them when none was free (`Connection.send`).
        """
        return sum(memoryview(b).nbytes for b in buffers) >= self.threshold

    def stage(self, buffers: list[Any]) -> list[memoryview] | None:
        """Write out-of-band buffers now into a segment for a message sent later (or None).

        Returns views of the segment to send in their place: `place` then copies nothing, so
        the caller may change its arrays at once and they are copied once in all.
        """
        raws = [b.raw() if isinstance(b, pickle.PickleBuffer) else memoryview(b) for b in buffers]
        lengths = [r.nbytes for r in raws]
        offsets, size = layout(lengths)
        segment = self._borrow(size)
        if segment is None:
            return None
        view = memoryview(segment.map)
        for raw, offset, n in zip(raws, offsets, lengths, strict=True):
            view[offset : offset + n] = raw.cast("B")
        with self._lock:
            self._staged[id(segment.map)] = (segment.name, segment.fd)
        return [view[o : o + n] for o, n in zip(offsets, lengths, strict=True)]

    def unstage(self, views: list[Any]) -> None:
        """Free the segment `stage` wrote these views into: their message is not sent here.

        Nothing happens for views that `stage` did not return (or that went out already).
        """
        if not self._staged:
            return
        with self._lock:
            staged = self._staged.pop(id(views[0].obj), None)
        if staged is not None:
            self.returned([staged[0]])

    def _borrow(self, size: int) -> _Segment | None:
        with self._lock:
            if self.closed:
                return None
            fits = [s for s in self._free if s.size >= size]
            if fits:
                best = min(fits, key=lambda s: s.size)
                self._free.remove(best)
                self._lent[best.name] = best
                return best
        full = size_class(size)
        if not self.store.reserve(full):
            self._drop_free()  # this connection's idle segments make room, if they can
            if not self.store.reserve(full):
                return None
        segment = _create(self.store.next_name(), full)
        with self._lock:
            if segment is None or self.closed:
                self.store.unreserve(full)
                if segment is not None:
                    os.close(segment.fd)
                return None
            self._lent[segment.name] = segment
        return segment

    def returned(self, names: list[str]) -> None:
        """Take the names the peer hands back.

        Segments of ours it is done with are free for the next messages; segments of its own
        that it removed are unmapped here (the mapping would keep their pages).
        """
        drop: list[_Segment] = []
        with self._lock:
            for name in names:
                segment = self._lent.pop(name, None)
                if segment is not None:
                    self._free.append(segment)
                elif self._maps.pop(name, None) is None and name.startswith(self._own):
                    raise ProtocolError(f"the peer handed back {name[:80]!r}, not lent to it")
            while len(self._free) > _FREE_MAX:
                drop.append(self._free.pop(0))
        self._remove(drop)

    def _drop_free(self) -> None:
        with self._lock:
            drop, self._free = self._free, []
        self._remove(drop)

    def _remove(self, segments: list[_Segment], *, tell: bool = True) -> None:
        for segment in segments:
            os.close(segment.fd)  # the pages go once no mapping holds them either
            self.store.unreserve(segment.size)
            if tell:  # the peer's mapping would keep its pages: it forgets it when told
                self.owed.append(segment.name)

    # -- receiving ---------------------------------------------------------------------------
    def take(self, ref: Any, max_total: int, max_buffers: int) -> tuple[Any, ...]:
        """The buffers a reference names: writable views of the peer's segment, no copy.

        The reference is checked first (`decode_ref`, with these limits). The segment goes
        back to the peer when the last view (or array made from one) is gone. Views need
        numpy, which unpickling the arrays imports; until it is, the buffers are copied out.
        """
        name, fd, lengths = decode_ref(ref, self.store.pattern, max_total, max_buffers)
        offsets, size = layout(lengths)
        mapping = self._maps.pop(name, None)
        if mapping is None:
            mapping = _map(name, fd, size)
            if len(self._maps) >= _MAPS_MAX:
                del self._maps[next(iter(self._maps))]
        self._maps[name] = mapping  # the most recently used last
        if len(mapping) < size:
            raise ProtocolError(
                f"the shared-memory segment {name} holds {len(mapping)} bytes, "
                f"the reference says {size}"
            )
        self.store.received += 1
        np = loaded_module("numpy")  # not one a preload is still importing
        if np is None or size == 0:
            view = memoryview(mapping)
            out = tuple(bytearray(view[o : o + n]) for o, n in zip(offsets, lengths, strict=True))
            del view
            self.owed.append(name)
            return out
        lease = np.frombuffer(mapping, dtype=np.uint8, count=size)
        weakref.finalize(lease, self.owed.append, name).atexit = False
        return tuple(memoryview(lease[o : o + n]) for o, n in zip(offsets, lengths, strict=True))

    def returns(self, flag: int) -> bytes:
        """The frame (header `flag`) handing back peer segments this end is done with (64 at most).

        Empty when there are none.
        """
        returns = self.owed
        if not returns:
            return b""
        names: list[str] = []
        with contextlib.suppress(IndexError):  # finalizers may append meanwhile, never take
            while len(names) < _RETURN_MAX:
                names.append(returns.popleft())
        body = encode_returns(names)
        return _FRAME_HEAD.pack(len(body), flag) + body

    def close(self) -> None:
        """Remove this end's segments (lent or free) and forget the peer's."""
        with self._lock:
            self.closed = True
            drop = self._free + list(self._lent.values())
            self._free, self._lent = [], {}
            self._maps, self._staged = {}, {}
            self.owed.clear()
        self._remove(drop, tell=False)


def _create(name: str, size: int) -> _Segment | None:
    """A new segment of `size` bytes, its pages allocated and mapped; None if memory is short."""
    try:
        fd = create_memfd(name, size)
    except OSError:
        return None
    try:
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE)
    except OSError:
        os.close(fd)
        return None
    return _Segment(name, fd, size, mapping)


def _map(name: str, fd: int, size: int) -> mmap.mmap:
    """Map the peer's segment `name`, through its owner's descriptor `fd`, once it checks."""
    owner = int(name.rsplit("-", 2)[1])  # the name matched the store's pattern
    try:
        mine, total = open_memfd(name, owner, fd, size)
    except OSError as exc:
        raise ProtocolError(f"the shared-memory segment {name} cannot be opened: {exc}") from None
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None
    try:
        return mmap.mmap(mine, total, flags=mmap.MAP_SHARED | _POPULATE)
    finally:
        os.close(mine)

"""Numpy arrays in a named shared-memory segment: the samplers' same-host data plane.

One small interface, so that the samplers can move to another transport without change:
`SharedArrays.create(layout)` makes a segment under `/dev/shm` (mode 0600, a fresh random name,
owned by the creating process, which alone removes it with `unlink()`), and
`SharedArrays.attach(name, layout)` maps it in another process of the same host, checking that
it is ours and of the expected size. Both give `arrays`, numpy views laid out as `layout` says.
Which host a process is on is parl-remote's `host_id()` (`PARL_HOST_ID`, else the host name and
the kernel's boot id), as for the actors' connections: processes of different hosts cannot
share a segment and fall back to the ordinary call path.
`SegmentPool` lends segments of one layout out as arrays that the caller keeps as long as it
likes: a segment is lent again only once every array of its last loan is gone.

No `multiprocessing.shared_memory`: its resource tracker (Python < 3.13) also adopts segments
that a process only attached to, and removes them when that process exits.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets
import weakref
from collections.abc import Sequence

import numpy as np
from numpy.typing import DTypeLike

__all__ = [
    "SHM_DIR",
    "SegmentPool",
    "SharedArrays",
    "shm_available",
    "sweep_dead_owners",
]

SHM_DIR = "/dev/shm"
_ALIGN = 64
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")

Layout = Sequence[tuple[str, tuple[int, ...], DTypeLike]]
"""What a segment holds: `(name, shape, dtype)` of each array, in order."""


def shm_available() -> bool:
    """Whether named segments can be made here (a writable `/dev/shm`)."""
    return os.path.isdir(SHM_DIR) and os.access(SHM_DIR, os.W_OK)


def _offsets(layout: Layout) -> tuple[list[int], int]:
    offsets, size = [], 0
    for _, shape, dtype in layout:
        size = -(-size // _ALIGN) * _ALIGN
        offsets.append(size)
        size += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return offsets, max(size, 1)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def sweep_dead_owners(prefix: str = "parl-sampler") -> list[str]:
    """Remove this user's segments whose owning process is gone (killed before it could).

    A segment is named `<prefix>-<owner pid>-<random>`; one whose pid no longer runs is left
    from an owner that was killed (SIGKILL leaves no chance to unlink). Returns the names removed.
    """
    pattern = re.compile(rf"^{re.escape(prefix)}-(\d+)-[0-9a-f]+$")
    removed = []
    with contextlib.suppress(OSError):
        for name in os.listdir(SHM_DIR):
            match = pattern.match(name)
            if match is None or _alive(int(match[1])):
                continue
            path = os.path.join(SHM_DIR, name)
            with contextlib.suppress(OSError):
                if os.lstat(path).st_uid == os.getuid():
                    os.unlink(path)
                    removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


class SharedArrays:
    """Arrays in one named segment; make one with `create` or `attach`.

    Attributes:
        name: the segment's name (a file of `/dev/shm`).
        arrays: name -> numpy view on the segment, shaped as the layout says.
    """

    def __init__(self, name: str, mm: mmap.mmap, layout: Layout, owner: bool) -> None:
        self.name = name
        self._mm = mm
        offsets, _ = _offsets(layout)
        self._spans = [
            (key, offset, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
            for (key, shape, dtype), offset in zip(layout, offsets, strict=True)
        ]
        self.arrays = {
            key: np.frombuffer(mm, dtype, int(np.prod(shape, dtype=np.int64)), offset).reshape(
                shape
            )
            for (key, shape, dtype), offset in zip(layout, offsets, strict=True)
        }
        path = os.path.join(SHM_DIR, name)
        # The owner's segment goes when the owner does, even if nobody called unlink().
        self._finalizer = weakref.finalize(self, _unlink, path) if owner else None

    @classmethod
    def create(cls, layout: Layout, prefix: str = "parl-sampler") -> SharedArrays:
        """Make a new segment of this layout, mode 0600; this process owns (and removes) it."""
        _, size = _offsets(layout)
        name = f"{prefix}-{os.getpid()}-{secrets.token_hex(8)}"
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            _unlink(path)
            raise
        finally:
            os.close(fd)
        return cls(name, mm, layout, owner=True)

    @classmethod
    def attach(cls, name: str, layout: Layout) -> SharedArrays:
        """Map the segment `name` made by `create` with the same layout (same host, same user).

        Raises:
            ValueError: a bad name, or a segment that is not this user's or not of this size.
            FileNotFoundError: no such segment (another host, or already removed).
        """
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"not a shared-memory segment name: {name!r}")
        _, size = _offsets(layout)
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                raise ValueError(f"shared-memory segment {name!r} is not private to this user")
            if st.st_size != size:
                raise ValueError(
                    f"shared-memory segment {name!r} has {st.st_size} bytes, not {size}"
                )
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        return cls(name, mm, layout, owner=False)

    def new_views(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Fresh views of the segment's arrays, all on one new byte array over the whole mapping.

        Returns that byte array and the views by name. Every view of the views refers to the
        byte array (numpy keeps an array's base, not a chain of views), so a weak reference to
        it says when none of them is left. The mapping stays valid while any of them lives.
        """
        whole = np.frombuffer(self._mm, np.uint8)
        views = {}
        for key, offset, nbytes in self._spans:
            array = self.arrays[key]
            views[key] = whole[offset : offset + nbytes].view(array.dtype).reshape(array.shape)
        return whole, views

    def close(self) -> None:
        """Unmap the segment here (views handed out elsewhere keep it mapped until they go)."""
        self.arrays = {}
        # Where someone still holds a view, the mapping goes with the last one.
        with contextlib.suppress(BufferError):
            self._mm.close()

    def unlink(self) -> None:
        """Remove the segment's name (the owner only); mappings stay valid until closed."""
        if self._finalizer is not None:
            self._finalizer()


def _room_for(size: int) -> bool:
    """Whether `SHM_DIR` has `size` bytes free (a full tmpfs fails a write with SIGBUS)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= size


class SegmentPool:
    """Segments of one layout, lent out as arrays and taken back once those arrays are gone.

    `acquire()` takes a free segment, or makes one while the pool has fewer than `limit` and
    `/dev/shm` has room for it; it returns None where neither can be (the caller then keeps to
    memory of its own). `lend(segment)` turns an acquired segment into fresh arrays
    (`SharedArrays.new_views`): the segment is free again once none of them, and no view of
    them, is left, whoever holds them (`weakref.finalize` on their common base).
    `release(segment)` frees an acquired segment that was not lent. `close()` removes every
    segment's name at once; a segment still lent stays mapped until its arrays are gone.
    Loans may end in any thread (a garbage collection): the free list is changed only by
    single list operations, which need no lock.

    Args:
        layout: the arrays of every segment.
        limit: the most segments the pool makes.
    """

    def __init__(self, layout: Layout, limit: int) -> None:
        self.layout = list(layout)
        self.limit = limit
        self.segments: list[SharedArrays] = []
        """Every segment made (free, acquired or lent), until `close()`."""
        self._free: list[SharedArrays] = []
        self._closed = False

    def acquire(self) -> SharedArrays | None:
        """A segment that no array refers to any more: a free one, or a new one; None: no more."""
        if self._closed:
            return None
        try:
            return self._free.pop()
        except IndexError:
            pass
        if len(self.segments) >= self.limit or not _room_for(_offsets(self.layout)[1]):
            return None
        segment = SharedArrays.create(self.layout)
        self.segments.append(segment)
        return segment

    def lend(self, segment: SharedArrays) -> dict[str, np.ndarray]:
        """Arrays on an acquired `segment`; it is released once they (and their views) are gone."""
        whole, views = segment.new_views()
        weakref.finalize(whole, self.release, segment)
        return views

    def release(self, segment: SharedArrays) -> None:
        """Put an acquired segment back (after `close()`: unmap it once nothing refers to it)."""
        if self._closed:
            segment.close()
        else:
            self._free.append(segment)

    def close(self) -> None:
        """Remove every segment's name; unmap the free ones (lent ones: once their arrays go)."""
        self._closed = True
        segments, self.segments = self.segments, []
        for segment in segments:
            segment.unlink()
        while self._free:
            self._free.pop().close()

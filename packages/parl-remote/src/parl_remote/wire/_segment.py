"""Shared-memory segments of one host: anonymous files (memfds) that processes map by reference.

A `Segment` is made by one process, its owner, as an anonymous file (`memfd_create`): it has no
name in any file system, lives while its owner holds its descriptor or any process maps it, and
the kernel frees it when the last of them lets go, however they end (SIGKILL included): nothing
is left in `/dev/shm`, and nothing needs removing. Another process of the same host and user
maps it from its `SegmentRef` (its name, the owner's pid and descriptor, its size) through
`/proc/<pid>/fd/<fd>`, which the kernel opens for a process of the same user only; the opened
file is checked on the opener's own descriptor to be the memfd of that name and of at least
that size before it is mapped. The actors' connections (`_shm_link`) and the samplers both make
their segments so (`create_memfd`, `open_memfd`).

`SegmentPool` lends segments of one size out and takes each back once an object its borrower
names (the arrays made on it) is gone. `sweep_dead_owners` removes what named segments in
`/dev/shm` (files that earlier versions of the runtime and the samplers made there) were left by
owners that no longer run. No numpy here: a segment's memory is a `memoryview` (`buffer`), and
its users lay out what they like on it.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import mmap
import os
import re
import secrets
import stat
import weakref
from typing import Any, NamedTuple

__all__ = [
    "SHM_DIR",
    "Segment",
    "SegmentPool",
    "SegmentRef",
    "create_memfd",
    "memfd_available",
    "open_memfd",
    "sweep_dead_owners",
]

SHM_DIR = "/dev/shm"
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")
_MAX_FD = 1 << 31
_MAX_PID = 1 << 31
_MAP_FAILED = ctypes.c_void_p(-1).value
# Named segments that owners of earlier versions left in /dev/shm: the samplers' (`parl-sampler-
# <pid>-<hex>`) and the actors' connections' (`parl-<cluster>-<pid>-<n>`).
_NAMED = re.compile(r"parl-(?:sampler|[0-9a-f]{12})-([0-9]{1,10})-[0-9a-f]{1,20}")


def memfd_available() -> bool:
    """Whether this system has what segments need: `memfd_create` and `/proc/<pid>/fd`."""
    return hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd")


def create_memfd(name: str, size: int) -> int:
    """A new memfd `name` of `size` bytes (at least 1), mode 0600, its pages allocated.

    Raises:
        OSError: memory is short (ENOSPC now, rather than SIGBUS when written), or no memfds.
    """
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        os.fchmod(fd, 0o600)
        os.posix_fallocate(fd, 0, max(size, 1))
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_memfd(name: str, pid: int, fd: int, size: int) -> tuple[int, int]:
    """Open memfd `name` of process `pid` through its descriptor `fd`, once it checks.

    Returns this process's own descriptor of it (the caller closes it) and the file's size.

    Raises:
        OSError: the file cannot be opened (another host or user, or the owner is gone).
        ValueError: what was opened is not the memfd `name`, not private to this user, or
            smaller than `size`.
    """
    mine = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    try:
        # What was opened, checked on this end's own descriptor: the owner's may have changed.
        if os.readlink(f"/proc/self/fd/{mine}") != f"/memfd:{name} (deleted)":
            raise ValueError(f"descriptor {fd} of process {pid} is not the segment {name}")
        info = os.fstat(mine)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise ValueError(f"the shared-memory segment {name} is not a file of ours")
        if info.st_mode & 0o077:
            raise ValueError(f"the shared-memory segment {name} is not private to this user")
        if info.st_size < max(size, 1):
            raise ValueError(
                f"the shared-memory segment {name} holds {info.st_size} bytes, "
                f"the reference says {size}"
            )
    except BaseException:
        os.close(mine)
        raise
    return mine, info.st_size


@functools.cache
def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    )
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    return libc


def _map_shared(fd: int, size: int) -> memoryview:
    """`size` bytes of file `fd` mapped shared and writable, as a `memoryview`.

    The mapping holds no descriptor of its own (Python's `mmap` keeps a duplicate) and needs no
    closing: it is unmapped when the last view of it (and every array made on one) is gone.
    """
    length = max(size, 1)
    libc = _libc()
    addr = libc.mmap(
        None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | _POPULATE, fd, 0
    )
    if addr is None or addr == _MAP_FAILED:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mmap of {length} bytes: {os.strerror(errno)}")
    area = (ctypes.c_char * length).from_address(addr)
    weakref.finalize(area, libc.munmap, addr, length).atexit = False
    return memoryview(area).cast("B")[:size]


class SegmentRef(NamedTuple):
    """What another process of this host needs to map a segment: plain values, to send anyhow."""

    name: str
    """The memfd's name (`<prefix>-<pid>-<n>-<random>`)."""
    pid: int
    """The owner's process id."""
    fd: int
    """The owner's descriptor of the memfd."""
    size: int
    """The segment's bytes."""


_counter = itertools.count()


class Segment:
    """Shared memory of one host: a memfd that its owner made and other processes map.

    Make one with `Segment.create(size)` (this process owns it) or `Segment.attach(ref)` (a
    segment another process of this host made; `ref` is its `ref`). Both map it shared and
    writable: `buffer` is the whole of it. The owner's descriptor is what lets others attach:
    `close()` (or the segment's garbage collection) closes it, and drops this object's view;
    the mapping goes with the last view of it (an array made on `buffer` keeps it valid), and
    the memory once no process maps it any more.

    Attributes:
        ref: the reference to give the processes that attach.
        buffer: a writable `memoryview` of the segment's bytes (`ref.size` of them); None once
            closed.
        owner: whether this process made it.
    """

    def __init__(self, ref: SegmentRef, buffer: memoryview, fd: int | None) -> None:
        self.ref = ref
        self.owner = fd is not None
        self.buffer: memoryview | None = buffer
        self._finalizer = weakref.finalize(self, _close_fd, fd) if fd is not None else None

    @property
    def name(self) -> str:
        """The segment's name (unique on this host while its owner runs)."""
        return self.ref.name

    @property
    def size(self) -> int:
        """The segment's bytes."""
        return self.ref.size

    @classmethod
    def create(cls, size: int, prefix: str = "parl-shm") -> Segment:
        """A new segment of `size` bytes, its pages allocated; this process owns it.

        Raises:
            ValueError: a negative size or a bad prefix (letters, digits, `-`, `_`, `.`).
            OSError: memory is short, or this system has no memfds (`shm_available`).
        """
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"a segment's size is a non-negative int, got {size!r}")
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            raise ValueError(
                f"a segment prefix is a letter, then letters, digits, '-', '_' or '.': {prefix!r}"
            )
        pid = os.getpid()
        name = f"{prefix}-{pid}-{next(_counter)}-{secrets.token_hex(4)}"
        fd = create_memfd(name, size)
        try:
            buffer = _map_shared(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return cls(SegmentRef(name, pid, fd, size), buffer, fd)

    @classmethod
    def attach(cls, ref: SegmentRef | tuple[Any, ...]) -> Segment:
        """Map the segment `ref` names (made by `create` in a process of this host and user).

        Raises:
            ValueError: `ref` is not a segment reference, or names something that is not
                that segment (another file, another user's, a smaller one).
            OSError: it cannot be opened (another host, or its owner closed it or is gone).
        """
        ref = _checked_ref(ref)
        mine, _ = open_memfd(ref.name, ref.pid, ref.fd, ref.size)
        try:
            buffer = _map_shared(mine, ref.size)
        finally:
            os.close(mine)
        return cls(ref, buffer, None)

    def close(self) -> None:
        """Let others attach no more (the owner) and drop this object's view of the segment.

        Views of `buffer` still held (arrays made on it) keep the mapping until they go.
        Calling it again does nothing.
        """
        if self._finalizer is not None:
            self._finalizer()
        self.buffer = None

    def __repr__(self) -> str:
        owner = ", owner" if self.owner else ""
        return f"Segment({self.ref.name!r}, {self.ref.size} bytes{owner})"


def _close_fd(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _checked_ref(ref: Any) -> SegmentRef:
    try:
        name, pid, fd, size = ref
    except (TypeError, ValueError):
        raise ValueError(f"not a segment reference: {ref!r:.80}") from None
    if not (
        isinstance(name, str)
        and _NAME.fullmatch(name)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in (pid, fd, size))
        and 0 < pid < _MAX_PID
        and 0 <= fd < _MAX_FD
        and size >= 0
    ):
        raise ValueError(f"not a segment reference: {ref!r:.80}")
    return SegmentRef(name, pid, fd, size)


class SegmentPool:
    """Segments of one size, lent out and taken back once what was made on them is gone.

    `acquire()` takes a free segment, or makes one while the pool has fewer than `limit`; it
    returns None where neither can be (the caller then keeps to memory of its own).
    `lend(segment, holder)` lends an acquired segment until `holder` (any object that takes
    weak references: the arrays made on the segment, whose views all refer to it) is gone,
    whoever holds it; `release(segment)` frees an acquired segment that was not lent.
    `close()` closes every segment; a segment still lent stays mapped until its holder goes.
    Loans may end in any thread (a garbage collection): the free list is changed only by
    single list operations, which need no lock.

    Args:
        size: the bytes of every segment.
        limit: the most segments the pool makes.
        prefix: the segments' name prefix (`Segment.create`).
    """

    def __init__(self, size: int, limit: int, prefix: str = "parl-shm") -> None:
        self.size = size
        self.limit = limit
        self.prefix = prefix
        self.segments: list[Segment] = []
        """Every segment made (free, acquired or lent), until `close()`."""
        self._free: list[Segment] = []
        self._closed = False

    def acquire(self) -> Segment | None:
        """A segment nothing was lent on any more: a free one, or a new one; None: no more."""
        if self._closed:
            return None
        try:
            return self._free.pop()
        except IndexError:
            pass
        if len(self.segments) >= self.limit:
            return None
        try:
            segment = Segment.create(self.size, self.prefix)
        except OSError:  # memory is short: the caller's own memory instead
            return None
        self.segments.append(segment)
        return segment

    def lend(self, segment: Segment, holder: object) -> None:
        """Lend an acquired `segment` until `holder` is gone; then it is free again."""
        weakref.finalize(holder, self.release, segment)

    def release(self, segment: Segment) -> None:
        """Put an acquired segment back (after `close()`: close it)."""
        if self._closed:
            segment.close()
        else:
            self._free.append(segment)

    def close(self) -> None:
        """Close every segment (a lent one keeps its mapping until its holder is gone)."""
        self._closed = True
        segments, self.segments = self.segments, []
        self._free = []
        for segment in segments:
            segment.close()


def sweep_dead_owners() -> list[str]:
    """Remove this user's named segments in `/dev/shm` whose owning process is gone.

    Segments are memfds, which leave nothing behind; earlier versions of the runtime and the
    samplers made named files there (`parl-<cluster>-<pid>-<n>`, `parl-sampler-<pid>-<hex>`),
    and an owner killed with SIGKILL could not remove its own. Returns the names removed.
    """
    removed = []
    with contextlib.suppress(OSError):
        for name in os.listdir(SHM_DIR):
            match = _NAMED.fullmatch(name)
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

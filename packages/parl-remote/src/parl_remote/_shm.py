"""Shared-memory transfer of large out-of-band buffers between processes of one host.

When both ends of an authenticated data connection (a client and an actor) run on the same
host, a message whose out-of-band buffers (numpy arrays, torch CPU tensors) total at least
`PARL_SHM_MIN_BYTES` does not send them through the socket: the sender writes them once into a
segment it owns, a file under `/dev/shm` of mode 0600 named `parl-<cluster>-<pid>-<n>` (the
cluster is a digest of its token, the pid the owner's), and the frame carries only a reference
(the name and the buffers' lengths). The receiver validates the reference, copies the buffers
out of its mapping of the segment into memory of its own (the arrays the user gets: ordinary,
writable, independent of later calls), and hands the segment back to its owner with its next
frame. Segments are pooled per connection: they stay mapped on both ends, so that steady
traffic writes and reads pages that are already there -- no file is created, sized, mapped,
faulted in or removed per message.

Two parts, as in the rest of the protocol:

- pure functions that decide and check (`wants_segment`, `encode_ref`, `decode_ref`,
  `encode_returns`, `decode_returns`, `segment_name`, `layout`, `size_class`), driven by the
  tests with plain values;
- `SegmentStore` (per process: names, the cap) and `SharedLink` (per connection: the pool
  lent to the peer, the peer's segments mapped here), the thin part that touches files.

A connection's segments are removed when it closes; those of a process killed before it could
are removed by the worker when an actor process dies, by the master when a client on its host
dies, and by `xparl stop` (`sweep`). A process whose segments reach `PARL_SHM_MAX_BYTES` in
all sends through the socket instead: a call never fails for want of shared memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import mmap
import os
import re
import socket
import stat
import struct
import sys
import threading
import weakref
from collections import deque
from typing import Any

import msgspec

from parl_remote._exceptions import ProtocolError

__all__ = [
    "MAX_REF",
    "SHM_DIR",
    "SegmentStore",
    "SharedLink",
    "cluster_tag",
    "decode_ref",
    "decode_returns",
    "encode_ref",
    "encode_returns",
    "host_id",
    "layout",
    "max_bytes",
    "min_bytes",
    "name_pattern",
    "received",
    "segment_name",
    "size_class",
    "store",
    "sweep",
    "wants_segment",
]

SHM_DIR = "/dev/shm"
_ALIGN = 64
MAX_REF = 4096
_MIN_SEGMENT = 64 << 10
_FREE_MAX = 4  # idle segments a connection keeps for its next messages
_MAPS_MAX = 8  # segments of the peer a connection keeps mapped
_RETURN_MAX = 64  # names handed back in one frame (well within MAX_REF)
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)
_ref_decoder = msgspec.msgpack.Decoder(tuple[str, list[int]])
_ref_encoder = msgspec.msgpack.Encoder()
_FRAME_HEAD = struct.Struct("<II")  # as in protocol.connection
_returns_decoder = msgspec.msgpack.Decoder(list[str])


# -- settings ----------------------------------------------------------------------------------
def min_bytes() -> int:
    """`PARL_SHM_MIN_BYTES`: the smallest total of buffers sent through a segment; 0 is off."""
    return _env_int("PARL_SHM_MIN_BYTES", 65536)


def max_bytes() -> int:
    """`PARL_SHM_MAX_BYTES`: the segments a process may hold in all; default a quarter of RAM."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - every Linux has both
        ram = 4 << 30
    return _env_int("PARL_SHM_MAX_BYTES", ram // 4)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a valid int") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r} must not be negative")
    return value


def host_id() -> str:
    """This host's identity: `PARL_HOST_ID`, or the host name and the kernel's boot id."""
    override = os.environ.get("PARL_HOST_ID")
    if override:
        return override[:128]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"[:128]


def cluster_tag(token: bytes) -> str:
    """The cluster part of segment names: a digest of the token (never the token itself)."""
    return hashlib.sha256(b"parl-shm|" + token).hexdigest()[:12]


# -- pure decisions ------------------------------------------------------------------------------
def wants_segment(lengths: list[int], threshold: int) -> bool:
    """Whether buffers of these lengths go through a segment (`threshold` 0: never)."""
    return threshold > 0 and sum(lengths) >= threshold


def layout(lengths: list[int]) -> tuple[list[int], int]:
    """The offset of each buffer in a segment (64-byte aligned) and the segment's size."""
    offsets, pos = [], 0
    for n in lengths:
        offsets.append(pos)
        pos += -(-n // _ALIGN) * _ALIGN
    return offsets, pos


def segment_name(tag: str, pid: int, n: int) -> str:
    """The file name of the `n`th segment process `pid` of cluster `tag` creates."""
    return f"parl-{tag}-{pid}-{n}"


def name_pattern(tag: str) -> re.Pattern[str]:
    """The pattern every segment name of cluster `tag` matches, and nothing else."""
    return re.compile(rf"parl-{re.escape(tag)}-[0-9]{{1,10}}-[0-9]{{1,20}}")


def encode_ref(name: str, lengths: list[int]) -> bytes:
    """The reference a frame carries instead of its buffers."""
    return _ref_encoder.encode((name, lengths))


def decode_ref(
    data: bytes | memoryview, pattern: re.Pattern[str], max_total: int, max_buffers: int
) -> tuple[str, list[int]]:
    """Read and check a reference; anything hostile or truncated raises `ProtocolError`."""
    if len(data) > MAX_REF:
        raise ProtocolError(f"a shared-memory reference of {len(data)} bytes (at most {MAX_REF})")
    try:
        name, lengths = _ref_decoder.decode(data)
    except Exception as exc:
        raise ProtocolError(f"an undecodable shared-memory reference: {exc}") from None
    if not pattern.fullmatch(name):
        raise ProtocolError(f"a shared-memory reference to {name[:80]!r}, not a segment of ours")
    if not lengths or len(lengths) > max_buffers or min(lengths) < 0:
        raise ProtocolError(f"a shared-memory reference with {len(lengths)} bad buffer lengths")
    if sum(lengths) > max_total:
        raise ProtocolError(
            f"a shared-memory reference of {sum(lengths)} bytes; the limit is {max_total}"
        )
    return name, lengths


def encode_returns(names: list[str]) -> bytes:
    """The frame body that hands the peer's segments back."""
    return _ref_encoder.encode(names)


def decode_returns(data: bytes | bytearray | memoryview, pattern: re.Pattern[str]) -> list[str]:
    """Read and check the names a peer hands back; anything hostile raises `ProtocolError`."""
    if len(data) > MAX_REF:
        raise ProtocolError(f"a hand-back of {len(data)} bytes (at most {MAX_REF})")
    try:
        names = _returns_decoder.decode(data)
    except Exception as exc:
        raise ProtocolError(f"an undecodable hand-back of segments: {exc}") from None
    for name in names:
        if not pattern.fullmatch(name):
            raise ProtocolError(f"a hand-back of {name[:80]!r}, not a segment of ours")
    return names


# -- files ---------------------------------------------------------------------------------------
class SegmentStore:
    """What the segments of one process share: names, settings and the cap on their bytes.

    Each connection that shares memory gets its own `SharedLink` from `link()`; the store
    counts the bytes all of them hold, so that together they stay within `cap`.

    Args:
        tag: the cluster part of the names (`cluster_tag`).
        threshold: `PARL_SHM_MIN_BYTES`.
        cap: `PARL_SHM_MAX_BYTES`.
    """

    def __init__(self, tag: str, threshold: int, cap: int) -> None:
        self.tag = tag
        self.threshold = threshold
        self.cap = cap
        self.pattern = name_pattern(tag)
        self._pid = os.getpid()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.held = 0
        self.received = 0  # messages whose buffers arrived through a segment

    def link(self) -> SharedLink:
        """The shared memory of one new connection to a peer of this host."""
        return SharedLink(self)

    def reserve(self, size: int) -> bool:
        """Count `size` more bytes held, unless that would pass the cap."""
        with self._lock:
            if self.held + size > self.cap:
                return False
            self.held += size
            return True

    def unreserve(self, size: int) -> None:
        """Count `size` bytes fewer held."""
        with self._lock:
            self.held -= size

    def next_name(self) -> str:
        """A segment name this process has not used before."""
        return segment_name(self.tag, self._pid, next(self._ids))


class _Segment:
    """One segment this process owns: its file's name and a shared, writable mapping."""

    __slots__ = ("map", "name", "size")

    def __init__(self, name: str, size: int, mapping: mmap.mmap) -> None:
        self.name, self.size, self.map = name, size, mapping


class SharedLink:
    """The shared memory of one connection, both ways.

    Sending, it lends the peer segments from a pool of its own: `place` writes the buffers
    into a free segment (or a new one) and the peer hands the name back (`returned`) once it
    is done with them, so that steady traffic reuses the same already-mapped pages.
    Receiving, `take` gives the buffers as views of the peer's segment (mapped once, kept
    mapped while used) and hands the segment back (`returns`) once nothing of them is left:
    the arrays unpickled from them keep the views, so they stay valid, and writable, for as
    long as the user holds them. `close` removes every segment of its own and forgets the
    peer's.

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
        self._returns: deque[str] = deque()  # appended to by finalizers, so no lock
        self.closed = False

    # -- sending -----------------------------------------------------------------------------
    def place(self, raws: list[Any], lengths: list[int]) -> str | None:
        """Write the buffers into a segment lent to the peer; its name, or None (the socket)."""
        offsets, size = layout(lengths)
        segment = self._borrow(size)
        if segment is None:
            return None
        mapping = segment.map
        for raw, offset, n in zip(raws, offsets, lengths, strict=True):
            mapping[offset : offset + n] = raw
        return segment.name

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
                    _unlink(os.path.join(SHM_DIR, segment.name))
                return None
            self._lent[segment.name] = segment
        return segment

    def returned(self, names: list[str]) -> None:
        """The peer copied these segments out: free for the next message."""
        drop: list[_Segment] = []
        with self._lock:
            for name in names:
                segment = self._lent.pop(name, None)
                if segment is None:
                    raise ProtocolError(f"the peer handed back {name[:80]!r}, not lent to it")
                self._free.append(segment)
            while len(self._free) > _FREE_MAX:
                drop.append(self._free.pop(0))
        self._remove(drop)

    def _drop_free(self) -> None:
        with self._lock:
            drop, self._free = self._free, []
        self._remove(drop)

    def _remove(self, segments: list[_Segment]) -> None:
        for segment in segments:
            _unlink(os.path.join(SHM_DIR, segment.name))
            self.store.unreserve(segment.size)

    # -- receiving ---------------------------------------------------------------------------
    def take(self, ref: Any, max_total: int, max_buffers: int) -> tuple[Any, ...]:
        """The buffers a reference names: writable views of the peer's segment, no copy.

        The reference is checked first (`decode_ref`, with these limits). The segment goes
        back to the peer when the last view (or array made from one) is gone. Views need
        numpy, which unpickling the arrays imports; until it is, the buffers are copied out.
        """
        name, lengths = decode_ref(ref, self.store.pattern, max_total, max_buffers)
        offsets, size = layout(lengths)
        mapping = self._maps.pop(name, None)
        if mapping is None:
            mapping = _map(name, size)
            if len(self._maps) >= _MAPS_MAX:
                del self._maps[next(iter(self._maps))]
        self._maps[name] = mapping  # the most recently used last
        if len(mapping) < size:
            raise ProtocolError(
                f"the shared-memory segment {name} holds {len(mapping)} bytes, "
                f"the reference says {size}"
            )
        self.store.received += 1
        np = sys.modules.get("numpy")
        if np is None or size == 0:
            view = memoryview(mapping)
            out = tuple(bytearray(view[o : o + n]) for o, n in zip(offsets, lengths, strict=True))
            del view
            self._returns.append(name)
            return out
        lease = np.frombuffer(mapping, dtype=np.uint8, count=size)
        weakref.finalize(lease, self._returns.append, name).atexit = False
        return tuple(lease[o : o + n] for o, n in zip(offsets, lengths, strict=True))

    def returns(self, flag: int) -> bytes:
        """The frame (header `flag`) handing back the peer's segments copied out (at most 64).

        Empty when there are none.
        """
        returns = self._returns
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
            self._maps = {}
            self._returns.clear()
        self._remove(drop)


def size_class(size: int) -> int:
    """The size of a new segment for `size` bytes: within an eighth above, at least 64 KiB."""
    if size <= _MIN_SEGMENT:
        return _MIN_SEGMENT
    step = 1 << (size.bit_length() - 4)
    return -(-size // step) * step


def _create(name: str, size: int) -> _Segment | None:
    """A new segment of `size` bytes, its pages allocated and mapped; None if /dev/shm is full."""
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError:
        return None
    try:
        os.posix_fallocate(fd, 0, size)  # ENOSPC now, rather than SIGBUS when written
        mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE)
    except OSError:
        _unlink(path)
        return None
    finally:
        os.close(fd)
    return _Segment(name, size, mapping)


def _map(name: str, size: int) -> mmap.mmap:
    """Map the peer's segment `name` after checking it is a file of ours."""
    path = os.path.join(SHM_DIR, name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError as exc:
        raise ProtocolError(f"the shared-memory segment {name} cannot be opened: {exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise ProtocolError(f"the shared-memory segment {name} is not a file of ours")
        if info.st_mode & 0o077:
            raise ProtocolError(f"the shared-memory segment {name} is open to other users")
        if info.st_size < max(size, 1):
            raise ProtocolError(
                f"the shared-memory segment {name} holds {info.st_size} bytes, "
                f"the reference says {size}"
            )
        return mmap.mmap(fd, info.st_size, flags=mmap.MAP_SHARED | _POPULATE)
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def sweep(tag: str, pid: int | None = None) -> int:
    """Remove the segments of cluster `tag` (only those of process `pid` if given); how many."""
    prefix = f"parl-{tag}-" + ("" if pid is None else f"{pid}-")
    pattern = name_pattern(tag)
    removed = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for name in names:
        if name.startswith(prefix) and pattern.fullmatch(name):
            _unlink(os.path.join(SHM_DIR, name))
            removed += 1
    return removed


def received() -> int:
    """How many messages this process has received through segments (any cluster)."""
    return sum(s.received for s in _STORE)


_STORE: list[SegmentStore] = []
_STORE_LOCK = threading.Lock()


def store(token: bytes | None) -> SegmentStore | None:
    """This process's store for the cluster of `token`, or None when sharing is off."""
    if token is None or not os.path.isdir(SHM_DIR):
        return None
    threshold = min_bytes()
    if threshold == 0:
        return None
    tag, cap = cluster_tag(token), max_bytes()
    with _STORE_LOCK:
        for s in _STORE:
            if (s.tag, s._pid, s.threshold, s.cap) == (tag, os.getpid(), threshold, cap):
                return s
        s = SegmentStore(tag, threshold, cap)
        _STORE.append(s)
        return s

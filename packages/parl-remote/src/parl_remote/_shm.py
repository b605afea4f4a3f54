"""Shared-memory transfer of large out-of-band buffers between processes of one host.

When both ends of an authenticated data connection (a client and an actor) run on the same
host, a message whose out-of-band buffers (numpy arrays, torch CPU tensors) total at least
`PARL_SHM_MIN_BYTES` does not send them through the socket: the sender writes them once into a
new segment, a file under `/dev/shm` of mode 0600 named `parl-<cluster>-<pid>-<n>` (the cluster
is a digest of its token, the pid the sender's), and the frame carries only a reference (the
name and the buffers' lengths). The receiver validates the reference, maps the file privately
(copy-on-write: writable arrays, no copy), and unlinks it at once: the mapping keeps the memory
for as long as the arrays live, and nothing is left in `/dev/shm`.

Two parts, as in the rest of the protocol:

- pure functions that decide and check (`wants_segment`, `encode_ref`, `decode_ref`,
  `segment_name`, `layout`), driven by the tests with plain values;
- `SegmentStore`, the thin part that creates, maps, unlinks and sweeps files.

A segment the receiver never mapped is removed by its sender when the connection closes, by
the worker when an actor process dies, by the master when a client on its host dies, and by
`xparl stop` (`sweep`). A sender that holds `PARL_SHM_MAX_BYTES` in segments not yet mapped
sends through the socket instead: a call never fails for want of shared memory.
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
import threading
from typing import Any

import msgspec

from parl_remote._exceptions import ProtocolError

__all__ = [
    "MAX_REF",
    "SHM_DIR",
    "SegmentStore",
    "cluster_tag",
    "decode_ref",
    "encode_ref",
    "host_id",
    "layout",
    "max_bytes",
    "min_bytes",
    "name_pattern",
    "segment_name",
    "store",
    "sweep",
    "wants_segment",
]

SHM_DIR = "/dev/shm"
_ALIGN = 64
MAX_REF = 4096
_PRUNE_AT = 64
_ref_decoder = msgspec.msgpack.Decoder(tuple[str, list[int]])
_ref_encoder = msgspec.msgpack.Encoder()


# -- settings ----------------------------------------------------------------------------------
def min_bytes() -> int:
    """`PARL_SHM_MIN_BYTES`: the smallest total of buffers sent through a segment; 0 is off."""
    return _env_int("PARL_SHM_MIN_BYTES", 65536)


def max_bytes() -> int:
    """`PARL_SHM_MAX_BYTES`: segments a process may hold unmapped; default a quarter of RAM."""
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


# -- files ---------------------------------------------------------------------------------------
class SegmentStore:
    """The segments of one process: creates and maps them, and removes the ones left over.

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
        self._live: dict[str, int] = {}  # written, maybe not yet mapped by the receiver: size
        self._held = 0

    def place(self, raws: list[Any], lengths: list[int]) -> str | None:
        """Write the buffers into a new segment; its name, or None to use the socket instead."""
        offsets, size = layout(lengths)
        if not self._reserve(size):
            return None
        name = segment_name(self.tag, self._pid, next(self._ids))
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except OSError:
            self._release(size)
            return None
        try:
            os.ftruncate(fd, size)
            for raw, offset in zip(raws, offsets, strict=True):
                view, pos = raw, offset
                while len(view):
                    n = os.pwrite(fd, view, pos)
                    view, pos = view[n:], pos + n
        except OSError:  # e.g. /dev/shm is full: the socket carries it
            _unlink(path)
            self._release(size)
            return None
        finally:
            os.close(fd)
        with self._lock:
            self._live[name] = size
        return name

    def _reserve(self, size: int) -> bool:
        with self._lock:
            if self._held + size > self.cap or len(self._live) >= _PRUNE_AT:
                self._prune()
            if self._held + size > self.cap:
                return False
            self._held += size
            return True

    def _prune(self) -> None:
        """Forget segments their receivers have mapped (and so unlinked); lock held."""
        for name, size in list(self._live.items()):
            if not os.path.exists(os.path.join(SHM_DIR, name)):
                del self._live[name]
                self._held -= size

    def _release(self, size: int) -> None:
        with self._lock:
            self._held -= size

    def discard(self, names: list[str]) -> None:
        """Remove these segments if their receiver never mapped them (its connection closed)."""
        for name in names:
            with self._lock:
                size = self._live.pop(name, None)
                if size is not None:
                    self._held -= size
            if size is not None:
                _unlink(os.path.join(SHM_DIR, name))

    def open(self, name: str, lengths: list[int]) -> tuple[Any, ...]:
        """Map a checked reference's segment and unlink it; its buffers, writable, no copy."""
        offsets, size = layout(lengths)
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise ProtocolError(
                f"the shared-memory segment {name} cannot be opened: {exc}"
            ) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
                raise ProtocolError(f"the shared-memory segment {name} is not a file of ours")
            if info.st_mode & 0o077:
                raise ProtocolError(f"the shared-memory segment {name} is open to other users")
            if info.st_size < size:
                raise ProtocolError(
                    f"the shared-memory segment {name} holds {info.st_size} bytes, "
                    f"the reference says {size}"
                )
            if size == 0:
                mapped: Any = bytearray()
            else:
                # Faulted in as read (MAP_POPULATE measured slower on this machine class).
                mapped = mmap.mmap(
                    fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
                )
        finally:
            os.close(fd)
            _unlink(path)
        view = memoryview(mapped)
        return tuple(view[o : o + n] for o, n in zip(offsets, lengths, strict=True))


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

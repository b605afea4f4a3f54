"""Shared-memory transfer of large out-of-band buffers between processes of one host.

When both ends of an authenticated data connection (a client and an actor) run on the same
host, a message whose out-of-band buffers (numpy arrays, torch CPU tensors) total at least
`PARL_SHM_MIN_BYTES` does not send them through the socket: the sender writes them once into a
segment it owns, an anonymous file (`memfd_create`) named `parl-<cluster>-<pid>-<n>` (the
cluster is a digest of its token, the pid the owner's), and the frame carries only a reference
(the name, the owner's descriptor of the file, and the buffers' lengths). The receiver
validates the reference, opens the file through the owner's descriptor
(`/proc/<pid>/fd/<fd>`, which the kernel grants to a process of the same user only), checks
that it is the memfd of that name, maps it and closes its own descriptor, and unpickles the
arrays straight from its mapping: no copy on receipt. They are ordinary, writable numpy
arrays, valid for as long as the user holds them, whatever calls come later: the segment is
lent to the receiver until nothing of it is left there, and only then handed back to its
owner, with the receiver's next frame on that connection. Segments are pooled per connection
and stay mapped on both ends, so that steady traffic writes and reads pages that are already
there: no file is created, sized, mapped, faulted in or removed per message.

Two parts, as in the rest of the protocol:

- pure functions that decide and check (`wants_segment`, `encode_ref`, `decode_ref`,
  `encode_returns`, `decode_returns`, `segment_name`, `layout`, `size_class`), driven by the
  tests with plain values;
- `SegmentStore` (per process: names, the cap) and `_shm_link.SharedLink` (per connection:
  the pool lent to the peer, the peer's segments mapped here), the thin part that touches
  files.

A segment has no name in any file system: it lives while its owner holds its descriptor or a
process maps it, and the kernel frees it when the last of them lets go, however they end. A
connection's segments go when it closes; a process killed, or a cluster killed whole (every
process at once, with SIGKILL), leaves nothing behind in `/dev/shm` or anywhere else, and
nothing is there to sweep. A process whose segments reach `PARL_SHM_MAX_BYTES` in all sends
through the socket instead: a call never fails for want of shared memory.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import socket
import threading

import msgspec

from parl_remote._config import shm_max_bytes, shm_min_bytes
from parl_remote._exceptions import ProtocolError
from parl_remote.wire._segment import memfd_available

__all__ = [
    "MAX_REF",
    "SegmentStore",
    "available",
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
    "wants_segment",
]

_ALIGN = 64
MAX_REF = 4096
_MIN_SEGMENT = 64 << 10
_MAX_FD = 1 << 31
_ref_decoder = msgspec.msgpack.Decoder(tuple[str, int, list[int]])
_ref_encoder = msgspec.msgpack.Encoder()
_returns_decoder = msgspec.msgpack.Decoder(list[str])


# -- settings ----------------------------------------------------------------------------------
min_bytes = shm_min_bytes
max_bytes = shm_max_bytes


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


def encode_ref(name: str, fd: int, lengths: list[int]) -> bytes:
    """The reference a frame carries instead of its buffers: the segment, its owner's fd."""
    return _ref_encoder.encode((name, fd, lengths))


def decode_ref(
    data: bytes | memoryview, pattern: re.Pattern[str], max_total: int, max_buffers: int
) -> tuple[str, int, list[int]]:
    """Read and check a reference; anything hostile or truncated raises `ProtocolError`."""
    if len(data) > MAX_REF:
        raise ProtocolError(f"a shared-memory reference of {len(data)} bytes (at most {MAX_REF})")
    try:
        name, fd, lengths = _ref_decoder.decode(data)
    except Exception as exc:
        raise ProtocolError(f"an undecodable shared-memory reference: {exc}") from None
    if not pattern.fullmatch(name):
        raise ProtocolError(f"a shared-memory reference to {name[:80]!r}, not a segment of ours")
    if not 0 <= fd < _MAX_FD:
        raise ProtocolError(f"a shared-memory reference to descriptor {fd}")
    if not lengths or len(lengths) > max_buffers or min(lengths) < 0:
        raise ProtocolError(f"a shared-memory reference with {len(lengths)} bad buffer lengths")
    if sum(lengths) > max_total:
        raise ProtocolError(
            f"a shared-memory reference of {sum(lengths)} bytes; the limit is {max_total}"
        )
    return name, fd, lengths


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

    Each connection that shares memory makes its own `_shm_link.SharedLink` on it; the store
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


def size_class(size: int) -> int:
    """The size of a new segment for `size` bytes: within an eighth above, at least 64 KiB."""
    if size <= _MIN_SEGMENT:
        return _MIN_SEGMENT
    step = 1 << (size.bit_length() - 4)
    return -(-size // step) * step


def received() -> int:
    """How many messages this process has received through segments (any cluster)."""
    return sum(s.received for s in _STORE)


_STORE: list[SegmentStore] = []
_STORE_LOCK = threading.Lock()


def available() -> bool:
    """Whether this system has what segments need: `memfd_create` and `/proc/<pid>/fd`."""
    return memfd_available()


def store(token: bytes | None) -> SegmentStore | None:
    """This process's store for the cluster of `token`, or None when sharing is off."""
    if token is None or not available():
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

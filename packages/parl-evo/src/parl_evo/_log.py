"""The sample log: a binary file of `(reward, SamplingInfo)` records for offline updates.

Samplers append records as they evaluate (online sampling); a learner in another process reads
them back and updates (offline update). Layout, all little-endian:

```
header   b"PARLEVOL"  u32 format  u32 n  n bytes of JSON metadata  u32 crc32(JSON)
record   u32 length (= 25)  u32 crc32(payload)  payload: f64 reward, u64 key, i8 sign, u64 version
```

Many processes may append to one log: each record goes out in one `write` on a file opened with
`O_APPEND`, under an exclusive `flock` where the platform has one, so records never interleave.
The first writer writes the header; later writers check that theirs matches (the same noise
source and parameter count), so a log never mixes samples that cannot be replayed together.
A reader checks every length and checksum, and names the file, record and byte of any damage.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from parl_evo._exceptions import SampleLogCorruptError, SampleLogError, SampleLogTruncatedError
from parl_evo._noise import SamplingInfo

try:  # POSIX; elsewhere O_APPEND alone keeps small records whole
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["SampleBatch", "SampleLogWriter", "read_sample_log"]

_MAGIC = b"PARLEVOL"
_FORMAT = 1
_PREFIX = struct.Struct("<8sII")  # magic, format, metadata length
_CRC = struct.Struct("<I")
_RECORD_HEAD = struct.Struct("<II")  # payload length, crc32(payload)
_PAYLOAD = struct.Struct("<dQbQ")  # reward, key, sign, version
_RECORD_SIZE = _RECORD_HEAD.size + _PAYLOAD.size


@dataclass(frozen=True)
class SampleBatch:
    """Records read from a sample log.

    Attributes:
        infos: the sampling infos, in file order.
        rewards: their rewards (float64), in the same order.
        meta: the log's metadata (what the writer described: noise source, parameter count).
        end: the byte offset after the last record read; pass it as `start` to read only what
            was appended since.
    """

    infos: list[SamplingInfo]
    rewards: np.ndarray
    meta: dict[str, Any]
    end: int


@contextlib.contextmanager
def _locked(fd: int) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _encode_header(meta: dict[str, Any]) -> bytes:
    body = json.dumps(meta, sort_keys=True).encode()
    return _PREFIX.pack(_MAGIC, _FORMAT, len(body)) + body + _CRC.pack(zlib.crc32(body))


def _encode_record(info: SamplingInfo, reward: float) -> bytes:
    payload = _PAYLOAD.pack(float(reward), info.key, info.sign, info.version)
    return _RECORD_HEAD.pack(len(payload), zlib.crc32(payload)) + payload


class SampleLogWriter:
    """Appends `(reward, info)` records to a sample log; safe to use from many processes at once.

    Args:
        path: the log file (created with its header if it does not exist).
        meta: JSON-able metadata that every writer of this log must agree on (`ESAgent` puts its
            noise source and parameter count here).

    Raises:
        SampleLogError: the file exists with different metadata, or is not a sample log.
    """

    def __init__(self, path: str | os.PathLike[str], *, meta: dict[str, Any]) -> None:
        self.path = os.fspath(path)
        self.meta = dict(meta)
        header = _encode_header(self.meta)
        self._fd: int | None = None
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            with _locked(self._fd):
                if os.fstat(self._fd).st_size == 0:
                    _write_all(self._fd, header)
                else:
                    existing = _read_header(self.path)[0]
                    if existing != json.loads(json.dumps(self.meta, sort_keys=True)):
                        raise SampleLogError(
                            f"{self.path}: this log holds samples with metadata {existing}, not "
                            f"{self.meta}; write to a new log file for a different model or "
                            "noise source"
                        )
        except BaseException:
            self.close()
            raise

    def append(self, info: SamplingInfo, reward: float) -> None:
        """Append one record (one `write` call)."""
        self.extend([info], [reward])

    def extend(self, infos: Sequence[SamplingInfo], rewards: ArrayLike) -> None:
        """Append records for `infos` and `rewards` (same length) in one `write` call."""
        rewards = list(np.asarray(rewards, dtype=np.float64).ravel())
        if len(infos) != len(rewards):
            raise ValueError(f"{len(infos)} infos but {len(rewards)} rewards; pass one per info")
        data = b"".join(_encode_record(i, r) for i, r in zip(infos, rewards, strict=True))
        if self._fd is None:
            raise ValueError(f"sample log writer for {self.path!r} is closed")
        with _locked(self._fd):
            _write_all(self._fd, data)

    def close(self) -> None:
        """Close the file (records already appended stay)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> SampleLogWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_header(path: str) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as f:
        prefix = f.read(_PREFIX.size)
        if len(prefix) < _PREFIX.size:
            raise SampleLogTruncatedError(
                f"{path}: ends inside the header ({len(prefix)} bytes); it is not a complete "
                "sample log (its first writer was cut off): delete it and sample again"
            )
        magic, fmt, size = _PREFIX.unpack(prefix)
        if magic != _MAGIC:
            raise SampleLogCorruptError(f"{path}: not a sample log (bad magic {magic!r})")
        if fmt != _FORMAT:
            raise SampleLogCorruptError(
                f"{path}: sample log format {fmt}; this version of parl-evo reads format {_FORMAT}"
            )
        body = f.read(size)
        crc = f.read(_CRC.size)
        if len(body) < size or len(crc) < _CRC.size:
            raise SampleLogTruncatedError(f"{path}: ends inside the header; delete it")
        if _CRC.unpack(crc)[0] != zlib.crc32(body):
            raise SampleLogCorruptError(f"{path}: the header fails its checksum; delete it")
        return json.loads(body), _PREFIX.size + size + _CRC.size


def read_sample_log(
    path: str | os.PathLike[str], *, start: int = 0, allow_partial_tail: bool = False
) -> SampleBatch:
    """Read the records of a sample log.

    Args:
        path: the log file.
        start: byte offset to start at (a previous batch's `end`); 0 for the first record.
        allow_partial_tail: stop quietly before an incomplete last record, as when reading a
            log that samplers are still appending to; `end` then points at that record.

    Raises:
        SampleLogTruncatedError: the file ends inside a record (unless `allow_partial_tail`).
        SampleLogCorruptError: a record's length or checksum is wrong.
    """
    path = os.fspath(path)
    meta, first = _read_header(path)
    offset = max(start, first)
    if (offset - first) % _RECORD_SIZE:
        raise ValueError(f"{path}: start={start} is not a record boundary (a batch's `end`)")
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    infos: list[SamplingInfo] = []
    rewards: list[float] = []
    pos = 0
    while pos < len(data):
        at = offset + pos
        index = (at - first) // _RECORD_SIZE
        where = f"{path}: record {index} (byte {at})"
        intact = f"the {index} records before it are intact; truncate the file to {at} bytes"
        if len(data) - pos < _RECORD_SIZE:
            if allow_partial_tail:
                break
            raise SampleLogTruncatedError(
                f"{where}: the file ends {len(data) - pos} bytes into this {_RECORD_SIZE}-byte "
                f"record (a writer was cut off); {intact} to keep them, or read with "
                "allow_partial_tail=True"
            )
        length, crc = _RECORD_HEAD.unpack_from(data, pos)
        if length != _PAYLOAD.size:
            raise SampleLogCorruptError(
                f"{where}: length field is {length}, every record holds {_PAYLOAD.size}; the "
                f"file is damaged here: {intact} to keep them"
            )
        payload = data[pos + _RECORD_HEAD.size : pos + _RECORD_SIZE]
        if zlib.crc32(payload) != crc:
            raise SampleLogCorruptError(
                f"{where}: checksum mismatch; the file is damaged here: {intact} to keep them "
                "(later records may be intact too)"
            )
        reward, key, sign, version = _PAYLOAD.unpack(payload)
        try:
            infos.append(SamplingInfo(key, sign, version))
        except ValueError as exc:
            raise SampleLogCorruptError(f"{where}: {exc}") from None
        rewards.append(reward)
        pos += _RECORD_SIZE
    return SampleBatch(
        infos=infos, rewards=np.array(rewards, dtype=np.float64), meta=meta, end=offset + pos
    )

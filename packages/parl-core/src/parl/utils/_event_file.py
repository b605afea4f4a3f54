"""TensorBoard event files, written without TensorFlow, TensorBoard or protobuf.

An event file is a sequence of TFRecords (length, masked CRC-32C of the length, payload, masked
CRC-32C of the payload), each payload an `Event` protocol buffer. The few messages needed for
scalars and histograms are encoded by hand here; the field numbers are those of TensorBoard's
`event.proto`, `summary.proto` and `histogram.proto`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

__all__ = ["crc32c", "encode_event", "encode_histogram", "encode_value", "frame_record"]

_CRC_TABLE: list[int] = []


def _crc_table() -> list[int]:
    if not _CRC_TABLE:
        for byte in range(256):
            crc = byte
            for _ in range(8):
                crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
            _CRC_TABLE.append(crc)
    return _CRC_TABLE


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of TFRecords."""
    table = _crc_table()
    crc = 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_record(payload: bytes) -> bytes:
    """Wrap one payload as a TFRecord."""
    length = struct.pack("<Q", len(payload))
    return b"".join(
        (
            length,
            struct.pack("<I", _masked_crc(length)),
            payload,
            struct.pack("<I", _masked_crc(payload)),
        )
    )


# -- protocol-buffer wire format ---------------------------------------------------------------
def _varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # int64 two's complement, as protobuf encodes negatives
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint((field << 3) | wire_type)


def _bytes_field(field: int, data: bytes) -> bytes:
    return _key(field, 2) + _varint(len(data)) + data


def _double_field(field: int, value: float) -> bytes:
    return _key(field, 1) + struct.pack("<d", value)


def _float_field(field: int, value: float) -> bytes:
    return _key(field, 5) + struct.pack("<f", value)


def _packed_doubles(field: int, values: Sequence[float]) -> bytes:
    return _bytes_field(field, struct.pack(f"<{len(values)}d", *values))


def encode_histogram(
    vmin: float,
    vmax: float,
    num: float,
    vsum: float,
    sum_squares: float,
    limits: Sequence[float],
    counts: Sequence[float],
) -> bytes:
    """Encode a `HistogramProto` (bucket `i` counts values in (limits[i-1], limits[i]])."""
    return b"".join(
        (
            _double_field(1, vmin),
            _double_field(2, vmax),
            _double_field(3, num),
            _double_field(4, vsum),
            _double_field(5, sum_squares),
            _packed_doubles(6, limits),
            _packed_doubles(7, counts),
        )
    )


def encode_value(
    tag: str, *, simple_value: float | None = None, histo: bytes | None = None
) -> bytes:
    """Encode one `Summary.Value`: a scalar or an encoded histogram under `tag`."""
    out = _bytes_field(1, tag.encode("utf-8"))
    if simple_value is not None:
        out += _float_field(2, simple_value)
    if histo is not None:
        out += _bytes_field(5, histo)
    return out


def encode_event(
    wall_time: float,
    step: int = 0,
    *,
    file_version: str | None = None,
    values: list[bytes] | tuple[bytes, ...] = (),
) -> bytes:
    """Encode an `Event`: a file-version header, or a `Summary` of encoded values at `step`."""
    out = _double_field(1, wall_time)
    if step:
        out += _key(2, 0) + _varint(step)
    if file_version is not None:
        out += _bytes_field(3, file_version.encode("utf-8"))
    if values:
        summary = b"".join(_bytes_field(1, value) for value in values)
        out += _bytes_field(5, summary)
    return out

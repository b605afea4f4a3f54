"""Seeded noise: a perturbation named by a small `SamplingInfo`, regenerated bit for bit anywhere.

A sampler perturbs the parameters with a noise vector and reports only the vector's *name*: a
`SamplingInfo` (a key, a sign, the parameter version). Whoever holds the same noise source turns
the name back into the same float32 vector, in another process or on another machine, so only
names and rewards ever cross the wire.

Two sources, one interface (`NoiseSource`):

- `SeedNoise`: the key is a seed; the vector is drawn fresh from numpy's `PCG64` bit generator
  seeded with it. Costs a draw per regeneration, needs no memory.
- `NoiseTable`: the key is an offset into one large table of standard normals, built from a seed
  with `PCG64` and kept in a memory-mapped file that every local process maps read-only (the
  operating system shares the pages: one copy per machine, not per process). Regeneration is a
  slice: no arithmetic at all.

Both name the bit generator (`PCG64`, whose output stream numpy guarantees across platforms and
versions) and draw with `Generator.standard_normal(dtype=float32)`. The tests pin the first
values of both sources, so a numpy release that changed the normal transform would fail loudly
instead of silently desynchronizing samplers and learner.
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from parl_evo._exceptions import ConfigError, NoiseTableError

__all__ = ["NoiseSource", "NoiseTable", "SamplingInfo", "SeedNoise", "default_table_directory"]

_KEY_LIMIT = 2**63  # keys, and so log records, are unsigned 64-bit; seeds stay below 2**63
_TABLE_MAGIC = b"PARLEVON"
_TABLE_FORMAT = 1
# magic, format, seed, size, crc32 of the data; padded to 64 bytes so the data is aligned
_TABLE_HEADER = struct.Struct("<8sIQQI")
_TABLE_DATA_OFFSET = 64
_TABLE_BUILD_CHUNK = 1 << 20  # normals generated (and written) at a time while building a table


@dataclass(frozen=True, slots=True)
class SamplingInfo:
    """The name of one perturbation: enough for anyone to regenerate it exactly.

    Attributes:
        key: a seed (`SeedNoise`) or an offset into the shared table (`NoiseTable`).
        sign: +1, or -1 for the mirrored twin of the same noise vector.
        version: the version of the parameters the perturbation was drawn around (the solver's
            update count), so that a late sample can be corrected or discarded.
    """

    key: int
    sign: int = 1
    version: int = 0

    def __post_init__(self) -> None:
        # Accept numpy integers, store plain ints: infos pickle small and compare by value.
        for name in ("key", "sign", "version"):
            value = getattr(self, name)
            if not isinstance(value, int | np.integer) or isinstance(value, bool):
                raise TypeError(f"SamplingInfo.{name} must be an int, got {value!r}")
            object.__setattr__(self, name, int(value))
        if not 0 <= self.key < 2**64:
            raise ValueError(f"SamplingInfo: key={self.key} must be in [0, 2**64)")
        if self.sign not in (1, -1):
            raise ValueError(f"SamplingInfo: sign={self.sign} must be 1 or -1")
        if not 0 <= self.version < 2**63:
            raise ValueError(f"SamplingInfo: version={self.version} must be in [0, 2**63)")

    def mirrored(self) -> SamplingInfo:
        """The same noise vector with the opposite sign (the other half of a mirrored pair)."""
        return SamplingInfo(self.key, -self.sign, self.version)


class NoiseSource(ABC):
    """Where noise vectors come from: keys are drawn here, and turned back into vectors here."""

    @abstractmethod
    def draw_key(self, rng: np.random.Generator, dim: int) -> int:
        """Draw the key of a fresh noise vector of length `dim` with the sampler's `rng`."""

    @abstractmethod
    def noise(self, key: int, dim: int) -> np.ndarray:
        """Return the float32 standard-normal vector of length `dim` named by `key`.

        The same `(key, dim)` gives the same bits in every process. The array may be a
        read-only view: copy it before writing to it.
        """

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """A small JSON-able description; two sources with equal descriptions give equal noise."""


class SeedNoise(NoiseSource):
    """Noise drawn fresh from `PCG64(key)`: the key is the seed of its own generator."""

    def draw_key(self, rng: np.random.Generator, dim: int) -> int:
        """Draw a random 63-bit seed."""
        return int(rng.integers(0, _KEY_LIMIT, dtype=np.int64))

    def noise(self, key: int, dim: int) -> np.ndarray:
        """Draw `dim` standard normals (float32) from a `PCG64` generator seeded with `key`."""
        return np.random.Generator(np.random.PCG64(key)).standard_normal(dim, dtype=np.float32)

    def describe(self) -> dict[str, Any]:
        """`{"kind": "seed", "generator": "PCG64"}`."""
        return {"kind": "seed", "generator": "PCG64"}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SeedNoise)

    def __hash__(self) -> int:
        return hash(SeedNoise)

    def __repr__(self) -> str:
        return "SeedNoise()"


def default_table_directory() -> str:
    """Where noise tables live by default: `/dev/shm` (memory) if it exists, else the temp dir."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


class NoiseTable(NoiseSource):
    """A table of `size` float32 standard normals drawn from `PCG64(seed)`, shared through a file.

    The first process that asks for a `(seed, size)` table builds it into a temporary file and
    renames it into place (atomically: nobody ever maps a half-written table); every later one,
    in any process, maps the finished file read-only. The file name carries the seed, the size
    and the format, so a table is never mistaken for another, and a process that crashed before
    cleaning up leaves one file that the next run reuses rather than a new one per run.

    A key is an offset: noise `(key, dim)` is `table[key : key + dim]`.

    Clean-up: `close()` unmaps (every process does it, or uses `with`); `unlink()` removes the
    file, which processes that still map it keep reading until they close. Construct the owner
    with `cleanup=True` (the learner, say) and its `close()` also unlinks.

    Args:
        seed: seed of the generator the table is drawn from.
        size: number of float32 values (4 bytes each).
        directory: where the file lives; default `default_table_directory()`.
        cleanup: whether `close()` also removes the file.
        verify: check the data against the checksum in the header when mapping an existing
            file (reads the whole table once).
    """

    def __init__(
        self,
        *,
        seed: int,
        size: int,
        directory: str | os.PathLike[str] | None = None,
        cleanup: bool = False,
        verify: bool = False,
    ) -> None:
        if not 0 <= int(seed) < _KEY_LIMIT:
            raise ConfigError(f"NoiseTable: seed={seed} must be in [0, 2**63)")
        if int(size) <= 0:
            raise ConfigError(f"NoiseTable: size={size} must be positive")
        self.seed = int(seed)
        self.size = int(size)
        self.directory = os.fspath(directory) if directory is not None else None
        self.cleanup = bool(cleanup)
        base = self.directory if self.directory is not None else default_table_directory()
        self.path = os.path.join(
            base, f"parl-evo-noise-pcg64-s{self.seed}-n{self.size}-f{_TABLE_FORMAT}.f32"
        )
        if not os.path.exists(self.path):
            self._build()
        self._table: np.ndarray | None = self._map(verify=verify)

    # -- NoiseSource ---------------------------------------------------------------------------
    def draw_key(self, rng: np.random.Generator, dim: int) -> int:
        """Draw an offset in `[0, size - dim]`."""
        self._check_dim(dim)
        return int(rng.integers(0, self.size - dim + 1, dtype=np.int64))

    def noise(self, key: int, dim: int) -> np.ndarray:
        """Return the read-only view `table[key : key + dim]`."""
        self._check_dim(dim)
        if not 0 <= key <= self.size - dim:
            raise ValueError(
                f"NoiseTable: key={key} is not an offset of a {dim}-vector in a table of "
                f"{self.size} values; was the info drawn from another table (another seed or "
                "cache_size)?"
            )
        return self.table[key : key + dim]

    def describe(self) -> dict[str, Any]:
        """`{"kind": "table", "generator": "PCG64", "seed": ..., "size": ...}`."""
        return {"kind": "table", "generator": "PCG64", "seed": self.seed, "size": self.size}

    # -- the shared file -----------------------------------------------------------------------
    @property
    def table(self) -> np.ndarray:
        """The whole table, a read-only float32 memory map."""
        if self._table is None:
            raise ValueError(f"NoiseTable {self.path!r} is closed")
        return self._table

    def verify(self) -> None:
        """Check the table's data against the checksum its builder stored in the header.

        Raises:
            NoiseTableError: the data does not match (delete the file; it is rebuilt).
        """
        expected = self._read_header()
        actual = zlib.crc32(self.table.data)
        if actual != expected:
            raise NoiseTableError(
                f"noise table {self.path!r} fails its checksum (stored {expected:#010x}, data "
                f"{actual:#010x}); delete the file and it is rebuilt on next use"
            )

    def close(self) -> None:
        """Unmap the table (and remove the file if this table was made with `cleanup=True`)."""
        self._table = None
        if self.cleanup:
            self.unlink()

    def unlink(self) -> None:
        """Remove the table's file; processes that still map it keep their mapping until closed."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def __enter__(self) -> NoiseTable:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # Another process attaches to (or rebuilds) the table by name; the data never travels.
        return _attach_table, (self.seed, self.size, self.directory)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NoiseTable) and (other.seed, other.size) == (self.seed, self.size)

    def __hash__(self) -> int:
        return hash((NoiseTable, self.seed, self.size))

    def __repr__(self) -> str:
        return f"NoiseTable(seed={self.seed}, size={self.size}, path={self.path!r})"

    def _check_dim(self, dim: int) -> None:
        if dim > self.size:
            raise ConfigError(
                f"a noise table of {self.size} values cannot hold a {dim}-parameter perturbation; "
                f"set gaussian_sampling.cache_size to at least {dim} (ten times that or more keeps "
                "perturbations nearly independent), or set cached = false to draw from seeds"
            )

    def _build(self) -> None:
        directory = os.path.dirname(self.path)
        tmp = None
        try:
            os.makedirs(directory, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".parl-evo-noise-", suffix=".tmp", dir=directory)
            with os.fdopen(fd, "wb") as f:
                f.write(bytes(_TABLE_DATA_OFFSET))
                rng = np.random.Generator(np.random.PCG64(self.seed))
                crc = 0
                for start in range(0, self.size, _TABLE_BUILD_CHUNK):
                    count = min(_TABLE_BUILD_CHUNK, self.size - start)
                    chunk = rng.standard_normal(count, dtype=np.float32).astype("<f4", copy=False)
                    crc = zlib.crc32(chunk.data, crc)
                    f.write(chunk.data)
                f.seek(0)
                f.write(_TABLE_HEADER.pack(_TABLE_MAGIC, _TABLE_FORMAT, self.seed, self.size, crc))
            os.chmod(tmp, 0o644)
            # Two processes racing here write identical bytes; whichever rename lands last wins.
            os.replace(tmp, self.path)
        except BaseException as exc:
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise NoiseTableError(
                    f"could not build the noise table {self.path!r} ({4 * self.size} bytes): "
                    f"{exc}; free space there, or put tables elsewhere (NoiseTable(directory=...), "
                    "ESAgent(noise_directory=...)), or make gaussian_sampling.cache_size smaller"
                ) from exc
            raise

    def _read_header(self) -> int:
        with open(self.path, "rb") as f:
            raw = f.read(_TABLE_HEADER.size)
            file_size = os.fstat(f.fileno()).st_size
        fix = "; delete it and it is rebuilt on next use"
        if len(raw) < _TABLE_HEADER.size:
            raise NoiseTableError(f"noise table {self.path!r} is too short for its header{fix}")
        magic, fmt, seed, size, crc = _TABLE_HEADER.unpack(raw)
        if magic != _TABLE_MAGIC or fmt != _TABLE_FORMAT:
            raise NoiseTableError(f"{self.path!r} is not a format-{_TABLE_FORMAT} noise table{fix}")
        if (seed, size) != (self.seed, self.size):
            raise NoiseTableError(
                f"noise table {self.path!r} holds seed={seed} size={size}, not the "
                f"seed={self.seed} size={self.size} its name promises{fix}"
            )
        expected_size = _TABLE_DATA_OFFSET + 4 * self.size
        if file_size != expected_size:
            raise NoiseTableError(
                f"noise table {self.path!r} has {file_size} bytes, {expected_size} expected{fix}"
            )
        return int(crc)

    def _map(self, *, verify: bool) -> np.ndarray:
        self._read_header()
        mapped = np.memmap(
            self.path, dtype="<f4", mode="r", offset=_TABLE_DATA_OFFSET, shape=(self.size,)
        )
        table = np.asarray(mapped)  # a plain ndarray view: slices of it are plain arrays too
        self._table = table
        if verify:
            self.verify()
        return table


def _attach_table(seed: int, size: int, directory: str | None) -> NoiseTable:
    return NoiseTable(seed=seed, size=size, directory=directory)

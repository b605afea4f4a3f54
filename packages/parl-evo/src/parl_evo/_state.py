"""Solver files: nested state dicts of arrays and scalars, in one `.npz` without pickle.

Arrays are stored as arrays; everything else (ints of any size, floats, strings, bools, None,
lists) as one JSON document inside the archive. Python writes floats in JSON with their shortest
exact representation, so every value reads back bit for bit. Files are written atomically.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from typing import Any

import numpy as np

from parl_evo._exceptions import SolverStateError

__all__ = ["load_state", "save_state"]

_META = "__meta__"


def save_state(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write `state` to `path` atomically (a crash leaves the old file or the new, never half)."""
    arrays: dict[str, np.ndarray] = {}

    def encode(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            name = f"a{len(arrays)}"
            arrays[name] = value
            return {"__array__": name}
        if isinstance(value, dict):
            return {str(k): encode(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [encode(v) for v in value]
        if isinstance(value, np.generic):
            return value.item()
        return value

    meta = json.dumps(encode(state)).encode()
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".parl-evo-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            members: dict[str, Any] = {**arrays, _META: np.frombuffer(meta, dtype=np.uint8)}
            np.savez(f, **members)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a file written by `save_state`.

    Raises:
        SolverStateError: the file is not such a file.
    """
    path = os.fspath(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise SolverStateError(
            f"{path!r} is not a solver file written by save_solver: {exc}"
        ) from exc
    if _META not in arrays:
        raise SolverStateError(f"{path!r} is not a solver file written by save_solver")
    meta = json.loads(arrays.pop(_META).tobytes())

    def decode(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {"__array__"}:
                return arrays[value["__array__"]]
            return {k: decode(v) for k, v in value.items()}
        if isinstance(value, list):
            return [decode(v) for v in value]
        return value

    state: dict[str, Any] = decode(meta)
    return state

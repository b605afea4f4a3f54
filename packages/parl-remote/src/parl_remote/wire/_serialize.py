"""Pickling of arguments, results, classes and exceptions for the wire.

Pickle protocol 5 with out-of-band buffers: a contiguous numpy array (or any object exporting a
`PickleBuffer`) of at least `OUT_OF_BAND_MIN` bytes travels as its own raw frame, never copied
into the pickle stream. The fast C pickler is tried first; objects it cannot pickle, and
objects that refer to the user's script (`__main__`, which the actor process does not share),
go through cloudpickle, which pickles such classes and functions by value.

Torch CPU tensors (once the user's code imported torch; this module never imports it) travel
as the numpy arrays that share their memory, so they too go out of band -- and through shared
memory on one host -- and come back as tensors.
"""

from __future__ import annotations

import builtins
import copyreg
import io
import marshal
import os
import pickle
import sys
import threading
import traceback
import types
from collections import ChainMap
from typing import Any, ClassVar

import cloudpickle

from parl_remote._exceptions import RemoteError, RemoteMethodError
from parl_remote._util import loaded_module

__all__ = [
    "OUT_OF_BAND_MIN",
    "describe",
    "dumps",
    "dumps_exception",
    "find_culprit",
    "format_remote_traceback",
    "loads",
    "loads_exception",
    "plain",
    "plain_args",
]

OUT_OF_BAND_MIN = 16 << 10
_MAIN = b"__main__"


def dumps(obj: Any) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """Pickle `obj`; return the stream and its out-of-band buffers (views, not copies)."""
    kind = type(obj)
    if kind in _PLAIN or (kind is tuple and _plain_call(obj)):
        return pickle.dumps(obj, protocol=5), []  # no buffers, no classes: the fast path
    buffers: list[pickle.PickleBuffer] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        # True keeps a small buffer in-band; large ones go out of band, in order.
        if buf.raw().nbytes < OUT_OF_BAND_MIN:
            return True
        buffers.append(buf)
        return False

    try:
        if loaded_module("torch") is not None:
            data = _dumps_with_tensors(obj, keep)
        else:
            data = pickle.dumps(obj, protocol=5, buffer_callback=keep)
        if _MAIN not in data:
            return data, buffers
    except Exception:
        pass
    buffers.clear()
    return _cloudpickle(obj, keep), buffers


def _reduce_code(code: types.CodeType) -> tuple[Any, tuple[bytes]]:
    # Code travels whole, file name included, so the receiver's tracebacks show the source
    # lines (linecache finds the file on one host); cloudpickle >= 3.1.3 would blank the name.
    return _load_code, (marshal.dumps(code),)


def _load_code(data: bytes) -> types.CodeType:
    code: types.CodeType = marshal.loads(data)
    return code


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle ships no types
    dispatch_table: ClassVar[ChainMap[Any, Any]] = ChainMap(
        {types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table
    )


def _cloudpickle(obj: Any, keep: Any = None) -> bytes:
    """`cloudpickle.dumps`, with code objects that keep their file names."""
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=keep).dump(obj)
    return out.getvalue()


_PLAIN = frozenset((int, float, bool, str, bytes, type(None)))
_PLAIN_OTHER = frozenset((float, bool, type(None)))
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1  # what msgpack holds
_PLAIN_MAX = 64 << 10  # longer strings are pickled


def _plain_call(obj: tuple[Any, ...]) -> bool:
    """Whether `obj` is a call's `(args, {})` of plain values only, like `add(1, 2)`'s."""
    if len(obj) != 2:
        return False
    args, kwargs = obj
    return type(args) is tuple and type(kwargs) is dict and _plain_args(args, kwargs)


def _plain_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if kwargs:
        return False
    for value in args:  # noqa: SIM110 - a loop costs less than all() over a generator
        if type(value) not in _PLAIN:
            return False
    return True


def plain(value: Any) -> bool:
    """Whether `value` travels as itself (a `messages.Plain`), not pickled."""
    kind = type(value)
    if kind is int:
        return bool(_INT_MIN <= value <= _INT_MAX)
    if kind is str:
        return value.isascii() and len(value) <= _PLAIN_MAX  # never an unencodable surrogate
    return kind in _PLAIN_OTHER


def plain_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call's arguments travel as themselves: all `plain`, and no keywords."""
    if kwargs:
        return False
    for value in args:  # `plain`, inlined: this runs for every small call
        kind = type(value)
        if kind is int:
            if not _INT_MIN <= value <= _INT_MAX:
                return False
        elif kind is str:
            if not (value.isascii() and len(value) <= _PLAIN_MAX):
                return False
        elif kind not in _PLAIN_OTHER:
            return False
    return True


def _dumps_with_tensors(obj: Any, keep: Any) -> bytes:
    """Pickle with torch CPU tensors reduced to numpy arrays.

    One pickler per thread, reused: as fast as `pickle.dumps`, where making a pickler per call
    cost several times more.
    """
    local = _TENSOR_PICKLERS
    if getattr(local, "busy", False):  # pickling from within pickling: a pickler of its own
        out = io.BytesIO()
        nested = pickle.Pickler(out, protocol=5, buffer_callback=keep)
        nested.dispatch_table = _tensor_table()
        nested.dump(obj)
        return out.getvalue()
    pickler = getattr(local, "pickler", None)
    if pickler is None:
        local.out = io.BytesIO()
        local.keep = [keep]
        pickler = pickle.Pickler(local.out, protocol=5, buffer_callback=lambda b: local.keep[0](b))
        pickler.dispatch_table = _tensor_table()
        local.pickler = pickler
    out = local.out
    out.seek(0)
    out.truncate()
    local.keep[0] = keep
    local.busy = True
    try:
        pickler.dump(obj)
    finally:
        pickler.clear_memo()
        local.keep[0] = None
        local.busy = False
    data: bytes = out.getvalue()
    if len(data) > _KEEP_PICKLER_BYTES:  # do not hold a large stream's memory per thread
        local.pickler = None
    return data


def _tensor_table() -> dict[type, Any]:
    import torch

    if not _TENSOR_TABLE:
        _TENSOR_TABLE.update(copyreg.dispatch_table)
        _TENSOR_TABLE[torch.Tensor] = _reduce_tensor
    return _TENSOR_TABLE


_TENSOR_TABLE: dict[type, Any] = {}
_TENSOR_PICKLERS = threading.local()
_KEEP_PICKLER_BYTES = 1 << 20


def _reduce_tensor(tensor: Any) -> Any:
    """A plain CPU tensor as its numpy array (sharing memory); any other tensor as torch says."""
    if (
        tensor.device.type == "cpu"
        and tensor.layout is sys.modules["torch"].strided
        and not tensor.requires_grad
        and not tensor.is_conj()
        and not tensor.is_neg()
    ):
        try:
            array = tensor.numpy()
        except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16, ...)
            pass
        else:
            return _tensor_from_numpy, (array,)
    return tensor.__reduce_ex__(5)


def _tensor_from_numpy(array: Any) -> Any:
    import torch

    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


def loads(data: bytes, buffers: tuple[Any, ...] | list[Any] = ()) -> Any:
    """Unpickle what `dumps` produced (buffers in the same order)."""
    return pickle.loads(data, buffers=buffers)


def describe(obj: Any) -> str:
    """A short, safe description of an object for error messages."""
    kind = type(obj)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    try:
        text = repr(obj)
    except Exception:
        text = "<unrepresentable>"
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} (a {name})"


def find_culprit(named: dict[str, Any]) -> str:
    """Return which of the named objects cannot be pickled, and why (for error messages)."""
    for label, value in named.items():
        try:
            _cloudpickle(value)
        except Exception as exc:
            return f"{label}, {describe(value)}: {type(exc).__name__}: {exc}"
    return "one of the values"


# -- exceptions --------------------------------------------------------------------------------
def dumps_exception(exc: BaseException) -> bytes:
    """Pickle an exception raised by user code, or return b"" when that is impossible."""
    try:
        data = _cloudpickle(exc)
        pickle.loads(data)  # an exception whose __init__ cannot be replayed fails here
    except Exception:
        return b""
    return data


def format_remote_traceback(exc: BaseException) -> str:
    """The traceback of `exc` as text, for the caller, from the user's code down.

    The actor process's own frames (the runtime that called the method) are left out.
    """
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _RUNTIME_FILES:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


_RUNTIME_FILES = frozenset(  # the actor process's modules that call a method
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "actor", name)
    for name in ("_host.py", "_calls.py")
)
_REMOTE_TYPES: dict[type, type] = {}


def _remote_type(kind: type[BaseException]) -> type[BaseException]:
    """A subclass of both `kind` and `RemoteError`, so either `except` clause catches it."""
    if issubclass(kind, RemoteError) or not issubclass(kind, Exception):
        return kind
    cached = _REMOTE_TYPES.get(kind)
    if cached is None:
        try:
            cached = type(kind.__name__, (kind, RemoteError), {"__module__": kind.__module__})
            cached.__qualname__ = kind.__qualname__
        except TypeError:  # a layout that refuses multiple inheritance
            cached = kind
        _REMOTE_TYPES[kind] = cached
    return cached


def loads_exception(
    payload: bytes, type_name: str, message: str, remote_tb: str, where: str
) -> BaseException:
    """Rebuild a remote exception as its own type (and a RemoteError), with its traceback."""
    exc: BaseException | None = None
    if payload:
        try:
            original = pickle.loads(payload)
        except Exception:
            original = None
        if isinstance(original, BaseException):
            kind = _remote_type(type(original))
            if kind is type(original):
                exc = original
            else:
                exc = kind.__new__(kind, *original.args)
                exc.__dict__.update(getattr(original, "__dict__", {}))
    if exc is None:
        builtin = getattr(builtins, type_name, None)
        if isinstance(builtin, type) and issubclass(builtin, Exception):
            exc = _remote_type(builtin)(message)
        else:
            exc = RemoteMethodError(f"{type_name}: {message}")
    exc.add_note(f"--- raised in {where}; remote traceback ---\n{remote_tb.rstrip()}")
    return exc

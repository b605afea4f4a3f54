"""A wake-up signal of one byte a turn between two processes of the same host.

Two processes that move their data through shared memory (a `CentralSampler` and its workers:
observations and actions) have only to tell the other side that their half is written. A
remote call does that at the price of a pickled message and the event loops on both sides; one
byte on a Unix-domain socket costs a system call each way. On Linux, `SignalListener` binds a
socket under a random name of the abstract namespace, which is in no file system and goes with
the socket, so a listener's process killed at any moment leaves nothing behind; it takes only
peers of its own user (their credentials, `SO_PEERCRED`). Elsewhere the socket is bound in a
fresh private directory (mode 0700, the socket 0600), removed when the listener closes. Each
peer connects with `connect_signal` and proves it got the address from the listener's owner by
sending the listener's random token and its number. A `Signal` waits with a bound
(`timeout`), never by spinning, and a peer that died reads as end-of-file at once:
`SignalClosed`.

A lock-step exchange waits on the scheduler twice a turn: on a busy machine, a woken process
queues behind others' time slices. `short_slice()` asks Linux's scheduler (EEVDF, 6.12 and
later) for short slices for the calling thread while it exchanges signals: the same share of
CPU time, handed out in smaller pieces, so that its wake-ups run sooner. Elsewhere it does
nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import secrets
import shutil
import socket
import struct
import sys
import tempfile
from collections.abc import Iterator

__all__ = [
    "SHORT_SLICE_NS",
    "Signal",
    "SignalClosed",
    "SignalListener",
    "connect_signal",
    "short_slice",
]

_TOKEN_BYTES = 16
_HELLO = struct.Struct("!16sI")
_ABSTRACT = sys.platform.startswith("linux")  # Unix-domain names outside any file system
_CREDS = struct.Struct("iII")  # struct ucred: pid, uid, gid


class SignalClosed(ConnectionError):
    """The other side's end is gone (its process died, or it closed), or it did not answer."""


class Signal:
    """One end of a connected Unix-domain socket carrying single bytes.

    Each byte is one system call: the socket blocks, and the kernel bounds its waits
    (`SO_RCVTIMEO`, `SO_SNDTIMEO`), where a socket timeout would `poll` before every call.

    Args:
        sock: the connected socket (this object owns it).
        timeout: the longest `recv` waits, in seconds.
    """

    def __init__(self, sock: socket.socket, timeout: float) -> None:
        sock.setblocking(True)
        seconds = max(timeout, 0.001)
        bound = struct.pack("ll", int(seconds), int(seconds % 1 * 1_000_000))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, bound)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, bound)
        self._sock = sock
        self._fd = sock.fileno()
        self.timeout = timeout

    def send(self, byte: bytes) -> None:
        """Send one byte.

        Raises:
            SignalClosed: the other end is gone.
        """
        try:
            os.write(self._fd, byte)
        except OSError as exc:
            raise SignalClosed(f"the signal's other end is gone ({exc})") from None

    def recv(self) -> bytes:
        """The next byte, waiting at most `timeout` seconds.

        Raises:
            SignalClosed: the other end is gone, or sent nothing within `timeout`.
        """
        try:
            byte = os.read(self._fd, 1)
        except BlockingIOError:  # the kernel's bound passed
            raise SignalClosed(f"no signal within {self.timeout:g} s") from None
        except OSError as exc:
            raise SignalClosed(f"the signal's other end is gone ({exc})") from None
        if not byte:
            raise SignalClosed("the signal's other end closed (its process exited)")
        return byte

    def fileno(self) -> int:
        """The socket's descriptor (-1 once closed): readable when the other end is gone."""
        return self._fd

    def close(self) -> None:
        """Close this end (the other side's `recv` then reads end-of-file)."""
        self._fd = -1  # a closed end reads and writes nothing (never a reused descriptor)
        with contextlib.suppress(OSError):
            self._sock.close()


class SignalListener:
    """Where the peers of one process connect their signals: a private Unix-domain socket.

    Attributes:
        path: the socket's address: on Linux an abstract name (it starts with a NUL byte and
            names no file), elsewhere a path in a directory of its own (mode 0700).
        token: the random bytes a peer must send first.
    """

    def __init__(self, backlog: int) -> None:
        self._dir: str | None = None
        self.token = secrets.token_bytes(_TOKEN_BYTES)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if _ABSTRACT:
                self.path = f"\0parl-signal-{secrets.token_hex(_TOKEN_BYTES)}"
                self._sock.bind(self.path)
            else:
                self._dir = tempfile.mkdtemp(prefix="parl-signal-")  # mode 0700
                self.path = os.path.join(self._dir, "s")
                self._sock.bind(self.path)
                os.chmod(self.path, 0o600)
            self._sock.listen(max(backlog, 1))
        except BaseException:
            self.close()
            raise

    def accept(
        self, expected: set[int], timeout: float, signal_timeout: float
    ) -> dict[int, Signal]:
        """The signals of the peers `expected` that connected, by their number.

        Waits at most `timeout` seconds in all; a connection with a wrong token or an
        unexpected number is dropped.
        """
        signals: dict[int, Signal] = {}
        self._sock.settimeout(timeout)
        try:
            while len(signals) < len(expected):
                conn, _ = self._sock.accept()
                if _ABSTRACT and _peer_uid(conn) != os.getuid():  # anyone may reach the name
                    conn.close()
                    continue
                conn.settimeout(timeout)
                try:
                    hello = _recv_exactly(conn, _HELLO.size)
                except OSError:
                    conn.close()
                    continue
                token, index = _HELLO.unpack(hello)
                if not secrets.compare_digest(token, self.token) or index not in expected:
                    conn.close()
                    continue
                if index in signals:
                    signals.pop(index).close()
                signals[index] = Signal(conn, signal_timeout)
        except OSError:  # a timeout: the peers that did not come get no signal
            pass
        return signals

    def close(self) -> None:
        """Stop listening: the name is free again (its directory removed, where it has one)."""
        with contextlib.suppress(OSError):
            self._sock.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


def _peer_uid(conn: socket.socket) -> int:
    """The user id of the process at the other end of a connected Unix-domain socket."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDS.size)
    uid: int = _CREDS.unpack(creds)[1]
    return uid


def connect_signal(path: str, token: bytes, index: int, timeout: float) -> Signal:
    """Connect peer `index` to a `SignalListener` at `path`, proving it with `token`.

    Raises:
        OSError: the socket cannot be reached (another host, or the listener is gone).
        ValueError: a token of the wrong size.
    """
    if not isinstance(token, bytes) or len(token) != _TOKEN_BYTES:
        raise ValueError(f"a signal token is {_TOKEN_BYTES} bytes, got {token!r:.40}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(10.0)
        sock.connect(path)
        sock.sendall(_HELLO.pack(token, index))
    except BaseException:
        sock.close()
        raise
    return Signal(sock, timeout)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed before its greeting")
        data += chunk
    return data


SHORT_SLICE_NS = 100_000
"""The scheduler slice `short_slice()` asks for: 0.1 ms, the shortest Linux grants."""

# sched_setattr / sched_getattr by architecture; struct sched_attr, its first version.
_SCHED_CALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}
_SCHED_ATTR = struct.Struct("IIQiIQQQII")


def _sched_attr(call: tuple[int, int] | None) -> bytes | None:
    if call is None:
        return None
    buf = ctypes.create_string_buffer(_SCHED_ATTR.size)
    if _libc().syscall(call[1], 0, buf, _SCHED_ATTR.size, 0) != 0:
        return None
    return buf.raw


def _set_sched_attr(call: tuple[int, int], attr: bytes) -> None:
    _libc().syscall(call[0], 0, ctypes.create_string_buffer(attr, len(attr)), 0)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def short_slice(slice_ns: int = SHORT_SLICE_NS) -> Iterator[None]:
    """Short scheduler slices for the calling thread inside the block (Linux; else nothing).

    Only a thread of the normal policy is changed (its nice value kept); the slice it had is
    restored on the way out.
    """
    call = _SCHED_CALLS.get(platform.machine()) if os.name == "posix" else None
    before = _sched_attr(call) if platform.system() == "Linux" else None
    if before is None or call is None:
        yield
        return
    size, policy, _, nice, *_ = _SCHED_ATTR.unpack(before)
    if policy != 0:  # not SCHED_OTHER: leave it alone
        yield
        return
    _set_sched_attr(call, _SCHED_ATTR.pack(size, 0, 0, nice, 0, slice_ns, 0, 0, 0, 0))
    try:
        yield
    finally:
        _set_sched_attr(call, before)

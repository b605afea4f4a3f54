"""A one-byte-a-step signal between a sampler and a worker actor of the same host.

`CentralSampler` moves observations and actions through shared memory; what is left of a step
is telling the other side that its half is written. A remote call does that at the price of a
pickled message and the event loops on both sides; one byte on a Unix-domain socket costs a
system call each way. `SignalListener` binds a socket in a fresh private directory (mode 0700,
the socket 0600), each worker connects with `connect_signal` and proves it got the address from
the sampler by sending the listener's random token and its worker number; the directory is
removed as soon as every worker is in. A `Signal` waits with a bound (`timeout`), never by
spinning, and a peer that died reads as end-of-file at once: `SignalClosed`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import struct
import tempfile

__all__ = ["Signal", "SignalClosed", "SignalListener", "connect_signal"]

_TOKEN_BYTES = 16
_HELLO = struct.Struct("!16sI")


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

    def close(self) -> None:
        """Close this end (the other side's `recv` then reads end-of-file)."""
        self._fd = -1  # a closed end reads and writes nothing (never a reused descriptor)
        with contextlib.suppress(OSError):
            self._sock.close()


class SignalListener:
    """Where the workers of one sampler connect their signals: a private Unix-domain socket.

    Attributes:
        path: the socket's path (in a directory of its own, mode 0700).
        token: the random bytes a worker must send first.
    """

    def __init__(self, backlog: int) -> None:
        self._dir = tempfile.mkdtemp(prefix="parl-signal-")  # mode 0700
        self.path = os.path.join(self._dir, "s")
        self.token = secrets.token_bytes(_TOKEN_BYTES)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.bind(self.path)
            os.chmod(self.path, 0o600)
            self._sock.listen(max(backlog, 1))
        except BaseException:
            self.close()
            raise

    def accept(
        self, expected: set[int], timeout: float, signal_timeout: float
    ) -> dict[int, Signal]:
        """The signals of the workers `expected` that connected, by worker number.

        Waits at most `timeout` seconds in all; a connection with a wrong token or an
        unexpected number is dropped.
        """
        signals: dict[int, Signal] = {}
        self._sock.settimeout(timeout)
        try:
            while len(signals) < len(expected):
                conn, _ = self._sock.accept()
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
        except OSError:  # a timeout: the workers that did not come use the call path
            pass
        return signals

    def close(self) -> None:
        """Stop listening and remove the socket and its directory."""
        with contextlib.suppress(OSError):
            self._sock.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def connect_signal(path: str, token: bytes, index: int, timeout: float) -> Signal:
    """Connect worker `index` to a `SignalListener` at `path`, proving it with `token`.

    Raises:
        OSError: the socket cannot be reached (another host, or the sampler is gone).
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

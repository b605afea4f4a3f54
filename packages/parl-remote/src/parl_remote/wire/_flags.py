"""Flags: two processes of the same host hand turns over in shared memory.

A lock-step exchange (a sampler wrote the actions; its worker wrote the observations) needs
no message, only a word that the other side sees change. `FlagSignal` keeps one mailbox a
direction in a shared-memory segment (a flag block of `FLAG_WORDS` 32-bit words), two words
each: the message and a count of messages sent. `send` writes the message, then the count, then
wakes a sleeper of that word (a Linux futex: one system call, nothing to read). `recv` looks at
the count first, then spins for a while (yielding the core every turn, so that on a busy machine
the process it waits for gets to run), then sleeps on the futex in bounded slices. Waking a
sleeper costs tens of microseconds (more on an idle virtual machine, whose halted CPU must be
woken first), so the spin adapts: it lasts about as long as the other side usually takes (a
running average of the waits, with some margin), up to `spin_s`; where the other side usually
takes longer than that, `recv` spins only briefly (`SPIN_FLOOR_S`) and sleeps, since a wake-up
is then a small share of the wait and a longer spin only takes a core from the others. The
process that would wake it may have died: between slices `recv` looks at the Unix-domain socket
that the two sides connected through (`_signal.Signal`, token-checked), which reads as
end-of-file once the other end is gone, and it gives up after `timeout` in all.

The words are written after the data they announce and read before it, and both sides use
plain loads and stores: that is in order on x86-64 (total store order), so the flags are used
there (`flags_available`); elsewhere the two sides keep to one byte a turn on the socket.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import select
import struct
import time
from typing import Any

from parl_remote.wire._signal import Signal, SignalClosed

__all__ = ["FLAG_BYTES", "FLAG_WORDS", "FlagSignal", "SPIN_FLOOR_S", "flags_available"]

FLAG_WORDS = 32
"""32-bit words of a flag block: two mailboxes, each on a 64-byte line of its own."""
FLAG_BYTES = 4 * FLAG_WORDS
"""The bytes of a flag block (64-byte aligned where it lies, so that each mailbox is a line)."""

_SYS_FUTEX = {"x86_64": 202}
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_TIMESPEC = struct.Struct("ll")
_SLICE_S = 0.05  # a futex sleep's bound: how soon a dead peer is noticed
_MASK = 0xFFFFFFFF

SPIN_FLOOR_S = 20e-6
"""The shortest spin of an adaptive `FlagSignal.recv`: what it spins where the other side
usually takes longer than its `spin_s`."""
_MARGIN = 1.5  # an adaptive spin lasts the usual wait times this, plus the floor
_AVERAGE = 1 / 8  # the weight of the latest wait in the running average


def flags_available() -> bool:
    """Whether step flags work here (Linux on x86-64)."""
    return platform.system() == "Linux" and platform.machine() in _SYS_FUTEX


@functools.cache
def _futex() -> tuple[Any, int]:
    libc = ctypes.CDLL(None, use_errno=True)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    return syscall, _SYS_FUTEX[platform.machine()]


class _Mailbox:
    """Two words of a flag block: `[message, count]`; the count is the futex."""

    def __init__(self, words: memoryview, first: int) -> None:
        self._view = words
        self._message, self._count = first, first + 1
        self._word = ctypes.c_uint32.from_buffer(words, 4 * self._count)  # keeps words exported
        self._addr = ctypes.c_void_p(ctypes.addressof(self._word))

    def post(self, message: int, count: int) -> None:
        view = self._view
        view[self._message] = message
        view[self._count] = count & _MASK

    def wake(self) -> None:
        syscall, number = _futex()
        syscall(number, self._addr, _FUTEX_WAKE, 1, None, None, 0)

    def count(self) -> int:
        return self._view[self._count]

    def message(self) -> int:
        return self._view[self._message]

    def sleep(self, seen: int, seconds: float) -> None:
        """Sleep while the count is still `seen`, at most `seconds` (or until a signal)."""
        syscall, number = _futex()
        timeout = ctypes.create_string_buffer(
            _TIMESPEC.pack(int(seconds), int(seconds % 1 * 1e9)), _TIMESPEC.size
        )
        syscall(number, self._addr, _FUTEX_WAIT, seen, timeout, None, 0)


class FlagSignal:
    """A `Signal`'s `send`/`recv` of single bytes, through a flag block in shared memory.

    Args:
        sock: the connected signal of the two sides (this object owns it): only watched, to
            see the other side go.
        words: the flag block: `FLAG_BYTES` of shared memory, writable (a `memoryview` of a
            `Segment`'s `buffer`, or an array of `FLAG_WORDS` uint32 on one), zeroed before
            either side uses it.
        sampler: True on the side that sends on the first mailbox (a sampler), False on
            the other's (its worker).
        spin_s: the longest `recv` spins before it sleeps (adaptive), or how long (not).
        adaptive: spin about as long as the other side usually takes (up to `spin_s`; only
            `SPIN_FLOOR_S` where it usually takes longer), not always `spin_s`.

    Attributes:
        usual_wait_s: the running average of `recv`'s waits (0 for a byte already there).
    """

    def __init__(
        self,
        sock: Signal,
        words: Any,
        sampler: bool,
        spin_s: float,
        adaptive: bool = True,
    ) -> None:
        view = memoryview(words)
        if view.readonly or not view.c_contiguous or view.nbytes != FLAG_BYTES:
            raise ValueError(
                f"a flag block is {FLAG_BYTES} writable contiguous bytes, got {words!r:.60}"
            )
        view = view.cast("B").cast("I")
        down, up = _Mailbox(view, 0), _Mailbox(view, FLAG_WORDS // 2)
        self._out, self._in = (down, up) if sampler else (up, down)
        self._sock: Signal | None = sock
        self._sent = self._out.count()
        self._received = self._in.count()
        self.timeout = sock.timeout
        self.spin_s = spin_s
        self.adaptive = adaptive
        self.usual_wait_s = 0.0

    def send(self, byte: bytes) -> None:
        """Post one byte to the other side.

        Raises:
            SignalClosed: this end is closed.
        """
        if self._sock is None:
            raise SignalClosed("the signal is closed")
        self.post(byte)
        self._out.wake()

    def post(self, byte: bytes) -> None:
        """Post one byte without waking the other side: `wake()` follows."""
        if self._sock is None:
            raise SignalClosed("the signal is closed")
        self._sent = (self._sent + 1) & _MASK
        self._out.post(byte[0], self._sent)

    def wake(self) -> None:
        """Wake the other side if it sleeps waiting for what was posted."""
        self._out.wake()

    def recv(self) -> bytes:
        """The byte the other side posted since the last `recv`, waiting at most `timeout` s.

        The two sides take turns (a byte each way a step): a mailbox holds one byte, so a
        second `send` before the other side's `recv` replaces the first.

        Raises:
            SignalClosed: the other side is gone, or posted nothing within `timeout`.
        """
        box, seen = self._in, self._received
        waited = 0.0
        if box.count() == seen:
            waited = self._wait(box, seen)
        self.usual_wait_s += (waited - self.usual_wait_s) * _AVERAGE
        self._received = box.count()
        return bytes((box.message(),))

    def spin_budget(self) -> float:
        """How long the next `recv` spins before it sleeps, in seconds."""
        if not self.adaptive:
            return self.spin_s
        spin = self.usual_wait_s * _MARGIN + SPIN_FLOOR_S
        return spin if spin <= self.spin_s else min(SPIN_FLOOR_S, self.spin_s)

    def _wait(self, box: _Mailbox, seen: int) -> float:
        """Wait for the count to move on from `seen`; the seconds it took."""
        clock = time.perf_counter
        start = clock()
        spin = self.spin_budget()
        while clock() - start < spin:
            os.sched_yield()
            if box.count() != seen:
                return clock() - start
        deadline = start + self.timeout
        while box.count() == seen:
            if self._peer_gone():
                raise SignalClosed("the signal's other end closed (its process exited)")
            left = deadline - clock()
            if left <= 0:
                raise SignalClosed(f"no signal within {self.timeout:g} s")
            box.sleep(seen, min(left, _SLICE_S))
        return clock() - start

    def _peer_gone(self) -> bool:
        sock = self._sock
        if sock is None:
            raise SignalClosed("the signal is closed")
        fd = sock.fileno()
        return fd < 0 or bool(select.select([fd], [], [], 0)[0])  # only end-of-file comes

    def close(self) -> None:
        """Close this end (the other side's `recv` then sees it gone within a slice)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

"""Shared memory between processes of one host: segments, pools, host identity, wake-ups.

The actors' connections move large arrays through this memory by themselves; this module is
for code that lays out memory of its own between its processes (the samplers of parl-algos:
rollouts written by worker actors straight into the sampler's segments).

- `host_id()` names this host: two processes may share memory only where their ids are equal
  (`PARL_HOST_ID`, else the host name and the kernel's boot id).
- `Segment.create(size)` makes a segment, an anonymous file (memfd) that leaves nothing in
  `/dev/shm` or anywhere else when its processes end, SIGKILL included; `Segment.attach(ref)`
  maps it in another process of the same host and user from its `ref` (plain values, sent
  any way: an actor call's argument). `segment.buffer` is a writable `memoryview` of it: wrap
  it as you like (`numpy.frombuffer(segment.buffer, ...)`).
- `SegmentPool` lends segments of one size and takes each back once what was made on it is
  gone; `sweep_dead_owners()` removes the named segments that earlier versions left in
  `/dev/shm` for owners that no longer run.
- A wake-up signal for turn-taking over shared memory: `SignalListener` and `connect_signal`
  connect a token-checked `Signal` (one byte a turn on a Unix-domain socket; a peer that died
  reads as closed at once, `SignalClosed`), and `FlagSignal` hands turns over through a flag
  block of `FLAG_BYTES` in a segment instead (a futex; Linux on x86-64, `flags_available`),
  the socket only watched. `short_slice()` asks the scheduler for short slices meanwhile.

```python
from parl_remote.shm import Segment

segment = Segment.create(1 << 20)      # in the owner
peer = Segment.attach(segment.ref)     # in another process of this host
peer.buffer[:5] = b"hello"             # seen by the owner at once
```
"""

from __future__ import annotations

from parl_remote.wire._flags import (
    FLAG_BYTES,
    FLAG_WORDS,
    SPIN_FLOOR_S,
    FlagSignal,
    flags_available,
)
from parl_remote.wire._segment import (
    Segment,
    SegmentPool,
    SegmentRef,
    sweep_dead_owners,
)
from parl_remote.wire._segment import memfd_available as shm_available
from parl_remote.wire._shm import host_id
from parl_remote.wire._signal import (
    SHORT_SLICE_NS,
    Signal,
    SignalClosed,
    SignalListener,
    connect_signal,
    short_slice,
)

__all__ = [
    "FLAG_BYTES",
    "FLAG_WORDS",
    "FlagSignal",
    "SHORT_SLICE_NS",
    "SPIN_FLOOR_S",
    "Segment",
    "SegmentPool",
    "SegmentRef",
    "Signal",
    "SignalClosed",
    "SignalListener",
    "connect_signal",
    "flags_available",
    "host_id",
    "shm_available",
    "short_slice",
    "sweep_dead_owners",
]

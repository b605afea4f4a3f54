"""`ParallelSampler`'s batches in shared memory, on a real local cluster.

Where its workers are on this host, a batch's arrays are views of one shared-memory segment
that the workers wrote into, lent to the batch: the segment is written again only once the
batch (and every view of it) is gone, a user who keeps many batches gets them all right, and
`close()` closes every segment while a batch still held stays readable. The batches stay those
of `SerialSampler`, bit for bit. A sampler killed with its workers leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import os
import re
import select
import signal
import subprocess
import sys

import numpy as np
import pytest

import parl
from parl.samplers import Batch, ParallelSampler, SerialSampler
from tests.algos.test_samplers import ENV_FN, LinearAgent
from tests.algos.test_samplers_remote import (
    SIZES,
    assert_continues,
    assert_same,
    failing_env,
    shm_names,
)
from tests.conftest import REPO_ROOT

ARRAYS = ("obs", "actions", "rewards", "terminated", "truncated", "next_obs")

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/maps"), reason="reads this process's mappings (Linux)"
)


@pytest.fixture(scope="module")
def cluster():
    client = parl.connect(cpu_num=4, log_to_driver=False)
    try:
        yield client
    finally:
        parl.disconnect()


def mappings() -> list[tuple[int, int, str]]:
    """This process's sampler segments mapped here: `(start, end, name)`, removed ones too."""
    prefix = f"/memfd:parl-sampler-{os.getpid()}-"
    found = []
    with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith(prefix):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                name = fields[5].strip().removesuffix(" (deleted)")
                found.append((start, end, name.removeprefix("/memfd:")))
    return found


def segment_of(array: np.ndarray) -> str | None:
    """The sampler segment whose mapping holds `array`'s data (None: memory of this process)."""
    address = array.__array_interface__["data"][0]
    for start, end, name in mappings():
        if start <= address < end:
            return name
    return None


def copied(batch: Batch) -> dict[str, np.ndarray]:
    return {name: getattr(batch, name).copy() for name in ARRAYS}


def assert_unchanged(batch: Batch, before: dict[str, np.ndarray]) -> None:
    for name in ARRAYS:
        assert getattr(batch, name).tobytes() == before[name].tobytes(), name


def test_a_batch_is_a_view_of_one_shared_segment_written_again_only_once_dropped(cluster):
    with (
        SerialSampler(ENV_FN, LinearAgent(), **SIZES) as serial,
        ParallelSampler(ENV_FN, LinearAgent(), **SIZES) as parallel,
    ):
        first = parallel.collect()
        assert_same(serial.collect(), first)
        names = {segment_of(getattr(first, name)) for name in ARRAYS}
        assert len(names) == 1 and None not in names  # every array, one segment
        (lent,) = names
        assert lent not in {segment.name for segment in parallel._group.segments[0] or []}
        address = first.obs.__array_interface__["data"][0]

        # Held: the next collect writes elsewhere, and the first batch stays as it was.
        before = copied(first)
        second = parallel.collect()
        assert_same(serial.collect(), second)
        assert not np.shares_memory(first.obs, second.obs)
        assert segment_of(second.obs) not in (None, lent)
        assert_unchanged(first, before)

        # A view of a batch holds its segment as the batch does.
        rewards = first.rewards[2:, 1]
        expected = rewards.copy()
        del first
        third = parallel.collect()
        assert_same(serial.collect(), third)
        assert segment_of(third.obs) not in (None, lent)
        np.testing.assert_array_equal(rewards, expected)

        # Dropped: its segment is written again.
        del rewards
        fourth = parallel.collect()
        assert_same(serial.collect(), fourth)
        assert segment_of(fourth.obs) == lent
        assert fourth.obs.__array_interface__["data"][0] == address


def test_a_user_keeping_every_batch_gets_them_all_right(cluster):
    before = shm_names()
    with (
        SerialSampler(ENV_FN, LinearAgent(), **SIZES) as serial,
        ParallelSampler(ENV_FN, LinearAgent(), **SIZES) as parallel,
    ):
        expected = [serial.collect() for _ in range(12)]
        kept = [parallel.collect() for _ in range(12)]
        limit = ParallelSampler._batch_segments
        for want, batch in zip(expected, kept, strict=True):  # read once all were collected
            assert_same(want, batch)
        shared = [segment_of(batch.obs) for batch in kept]
        assert None not in shared[:limit] and len(set(shared[:limit])) == limit
        assert shared[limit:] == [None] * (12 - limit)  # past the pool: copied, as before
        for a, b in itertools.combinations(kept, 2):
            assert not np.shares_memory(a.obs, b.obs)
        # The pool's segments and each worker's own one, and nothing more.
        assert len(shm_names() - before) == limit + SIZES["num_workers"]
        assert serial.episodes() == parallel.episodes()
        del kept, batch, a, b
        again = parallel.collect()
        assert_same(serial.collect(), again)
        assert segment_of(again.obs) in set(shared[:limit])  # lent from the pool again
    assert shm_names() == before


def test_close_leaves_a_held_batch_readable_and_unmaps_it_once_dropped(cluster):
    before = shm_names()
    with (
        SerialSampler(ENV_FN, LinearAgent(), **SIZES) as serial,
        ParallelSampler(ENV_FN, LinearAgent(), **SIZES) as parallel,
    ):
        held = parallel.collect()
        parallel.collect()  # dropped at once: its segment stays free until close
        expected = serial.collect()
        lent = segment_of(held.obs)
        assert lent is not None
    assert shm_names() == before  # every name removed
    assert_same(expected, held)  # still mapped, and still readable
    assert lent in {name for _, _, name in mappings()}
    with pytest.raises(RuntimeError, match="closed"):
        parallel.collect()
    del held
    gc.collect()
    assert lent not in {name for _, _, name in mappings()}


def test_the_copy_path_returns_the_same_batches_in_memory_of_this_process(cluster):
    with (
        SerialSampler(ENV_FN, LinearAgent(), **SIZES) as serial,
        ParallelSampler(ENV_FN, LinearAgent(), **SIZES) as parallel,
    ):
        for zero_copy in (False, True, False):
            parallel._zero_copy = zero_copy
            batch = parallel.collect()
            assert_same(serial.collect(), batch)
            assert (segment_of(batch.obs) is not None) == zero_copy
        assert serial.episodes() == parallel.episodes()


def test_a_collect_that_fails_gives_its_segment_back(cluster):
    # Seed 0, 2 workers x 3 envs: column 4 is worker 1's second environment.
    sizes = {"num_workers": 2, "envs_per_worker": 3, "horizon": 5, "seed": 0}
    env_fn = functools.partial(failing_env, 4, 3)
    with ParallelSampler(env_fn, LinearAgent(), **sizes) as sampler:
        with pytest.raises(parl.RemoteError, match="column 4 failed at step 3"):
            sampler.collect()
        pool = sampler._group.batches
        (made,) = [segment.name for segment in pool.segments]
        assert segment_of(sampler.collect().obs) == made  # the failed collect's, free again
        assert_continues(sampler)
        assert len(pool.segments) == 2  # the one batch held and the one being collected


KILLED = """
import time

import parl
from parl.samplers import ParallelSampler
from tests.algos.test_samplers import ENV_FN, LinearAgent

parl.connect(cpu_num=2, log_to_driver=False)
sizes = {"num_workers": 2, "envs_per_worker": 2, "horizon": 6, "seed": 3}
sampler = ParallelSampler(ENV_FN, LinearAgent(), **sizes)
held = sampler.collect()  # a batch lent from the pool, held
assert sampler.shared_memory == [True, True]
print(" ".join(str(pid) for pid, _ in sampler._group.where), flush=True)
time.sleep(120)
"""


def held_anywhere(prefix: str) -> set[str]:
    """The memfds named `prefix...` that any process of this host holds (a descriptor or a
    mapping)."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith(f"/memfd:{prefix}"):
                        found.add(target.split()[0])
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps", errors="replace") as f:
            found |= {line.split()[5] for line in f if f"/memfd:{prefix}" in line}
    return found


@pytest.mark.slow  # a cluster of its own, started and killed: 15 s at a load of 4 on 2 cores
def test_a_sampler_and_its_workers_killed_with_sigkill_leave_nothing_in_dev_shm():
    """The sampler's process, its cluster and its workers killed at once, each holding the
    segments (the sampler a lent batch, the workers their mappings): `/dev/shm` is as it was,
    and no process of this host holds a segment of theirs."""
    import psutil

    before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, "the sampler did not collect within 120 s"
        workers = [int(pid) for pid in proc.stdout.readline().split()]
        assert len(workers) == 2
        prefix = f"parl-sampler-{proc.pid}-"
        assert len(held_anywhere(prefix)) == 3  # each worker's and the batch's (it can fail)
        tree = psutil.Process(proc.pid).children(recursive=True)
        pids = {proc.pid, *workers, *(p.pid for p in tree)}
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(10)
        assert not psutil.wait_procs([p for p in tree if p.is_running()], timeout=30)[1]
        assert held_anywhere(prefix) == set()
        after = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
        killed = {str(pid) for pid in pids}  # a name of theirs would carry its owner's pid
        assert {n for n in after - before if set(re.findall(r"\d+", n)) & killed} == set()
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()

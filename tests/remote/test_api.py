"""The user's API of `@parl.remote_class`, against a real cluster (processes on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time

import numpy as np
import pytest

import parl
import parl_remote
from tests.remote.conftest import wait_until


@parl.remote_class
class Actor:
    """A test actor."""

    def __init__(self, k):
        self.k = k

    def add(self, a, b):
        """Add two numbers and k."""
        return a + b + self.k

    def pid(self):
        return os.getpid()

    def fail(self, message):
        raise ValueError(message)

    def echo(self, x):
        return x

    def sleep_then(self, seconds, value, started=None):
        import pathlib
        import time

        if started:
            pathlib.Path(started).touch()
        time.sleep(seconds)
        return value

    async def fetch(self, x):
        await asyncio.sleep(0.01)
        return x * 2

    async def wait_for_flag(self):
        self.flag = asyncio.Event() if not hasattr(self, "flag") else self.flag
        await asyncio.wait_for(self.flag.wait(), 10)
        return "released"

    async def set_flag(self):
        self.flag = asyncio.Event() if not hasattr(self, "flag") else self.flag
        self.flag.set()
        return "set"

    def make_lock(self):
        return threading.Lock()

    @staticmethod
    def static_add(a, b):
        return a + b


@parl.remote_class(wait=False)
class FutureActor:
    def __init__(self):
        self.seen = []

    def record(self, i):
        self.seen.append(i)
        return i

    def slow(self, seconds):
        import time

        time.sleep(seconds)
        return "done"

    def history(self):
        return self.seen


def used_slots(cluster) -> int:
    return cluster.status()["totals"]["cpu_used"]


def test_calls_attributes_and_the_original_class(connected):
    a = Actor(1)
    assert a.add(1, 2) == 4
    assert a.add(a=1, b=2) == 4
    assert a.k == 1
    a.k = 5
    assert a.k == 5 and a.add(1, 2) == 8
    assert a.static_add(2, 3) == 5
    assert a.pid() != os.getpid()
    local = Actor._original(1)
    assert type(local).__name__ == "Actor" and local.add(1, 2) == 4
    assert Actor.add.__doc__ == "Add two numbers and k."
    assert "add" in dir(a)


def test_numpy_arrays_round_trip(connected):
    a = Actor(0)
    for shape, dtype in [((3,), np.float32), ((1000, 1000), np.float64), ((2, 3, 4), np.int64)]:
        x = np.arange(np.prod(shape), dtype=dtype).reshape(shape)
        y = a.echo(x)
        assert y.dtype == dtype and y.shape == shape
        np.testing.assert_array_equal(x, y)
        y += 1  # the received array is ours to write
    assert a.echo({"obs": np.ones(5), "n": [1, 2]})["n"] == [1, 2]


def test_constructor_arguments_carry_large_arrays_and_tensors(connected):
    torch = pytest.importorskip("torch")
    weights = np.arange(100_000, dtype=np.float32)  # out of band: a buffer of its own
    tensor = torch.arange(50_000, dtype=torch.float64)  # no grad: travels as its array
    a = Actor({"weights": weights, "tensor": tensor})
    k = a.k
    np.testing.assert_array_equal(k["weights"], weights)
    assert torch.equal(k["tensor"], tensor)


def test_awaitable_twin_and_async_creation(connected):
    a = Actor(1)

    async def main():
        assert await a.aio.add(1, 2) == 4
        assert await a.aio.fetch(3) == 6
        assert await a.aio.k == 1
        b = await Actor.aio(10)
        assert await b.add(1, 2) == 13
        assert b.sync.add(1, 2) == 13
        assert b.sync.aio is not None and await b.sync.aio.add(0, 0) == 10
        return b.sync.pid()

    pid = asyncio.run(main())
    assert pid != a.pid()


def test_async_methods_run_concurrently_on_the_actor_loop(connected):
    a = Actor(0)

    async def main():
        # wait_for_flag only returns once set_flag ran: both must be in flight at once.
        waiting = a.aio.wait_for_flag()
        await asyncio.sleep(0.05)
        assert await a.aio.set_flag() == "set"
        return await waiting

    assert asyncio.run(main()) == "released"


def test_method_exceptions_keep_their_type_and_the_actor_lives(connected):
    a = Actor(1)
    with pytest.raises(ValueError, match="bad input") as info:
        a.fail("bad input")
    assert isinstance(info.value, parl.RemoteError)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "remote traceback" in notes and "raise ValueError(message)" in notes
    assert a.add(1, 1) == 3  # still alive

    async def main():
        with pytest.raises(ValueError, match="async too"):
            await a.aio.fail("async too")

    asyncio.run(main())


def test_missing_attributes_and_bad_arguments(connected):
    a = Actor(1)
    with pytest.raises(parl.RemoteAttributeError, match="no attribute 'nope'") as info:
        _ = a.nope
    assert isinstance(info.value, AttributeError)
    with pytest.raises(TypeError, match=r"add\(\) missing 1 required positional argument: 'b'"):
        a.add(1)
    with pytest.raises(TypeError, match=r"Actor\(\): missing a required argument: 'k'"):
        Actor()


def test_unpicklable_arguments_and_results_name_the_culprit(connected):
    a = Actor(1)
    lock = threading.Lock()
    with pytest.raises(parl.RemoteSerializeError, match=r"Actor.echo\(\).*argument 0.*lock"):
        a.echo(lock)
    with pytest.raises(parl.RemoteSerializeError, match=r"Actor.echo\(\).*argument 'x'.*lock"):
        a.echo(x=lock)
    with pytest.raises(parl.RemoteSerializeError, match=r"argument 0.*generator"):
        a.echo(i for i in range(3))
    with pytest.raises(
        parl.RemoteSerializeError, match=r"result of Actor.make_lock\(\) cannot be pickled.*lock"
    ):
        a.make_lock()
    assert a.add(0, 0) == 1  # the actor is still alive


def test_reserved_names_and_bad_decorations():
    with pytest.raises(TypeError, match="defines 'aio'.*reserves"):

        @parl.remote_class
        class Bad:
            def aio(self):
                pass

    with pytest.raises(TypeError, match="defines 'sync'"):

        @parl.remote_class(wait=False)
        class Bad2:
            sync = 1

    with pytest.raises(TypeError, match="defines '_parl_x'"):

        @parl.remote_class
        class Bad3:
            def _parl_x(self):
                pass

    with pytest.raises(TypeError, match="decorates a class"):
        parl.remote_class(lambda: 1)
    with pytest.raises(ValueError, match="max_memory=-1"):
        parl.remote_class(max_memory=-1)(Actor._original)


def test_wrong_spellings_show_the_right_one(connected):
    a = Actor(1)
    with pytest.raises(TypeError, match="await ClassName.aio"):
        a.aio(1)
    with pytest.raises(TypeError, match="handle.sync.k = value"):
        a.aio.k = 3
    with pytest.raises(TypeError, match="not a constructor"):
        _ = Actor.sync
    with pytest.raises(TypeError, match="needs a running event loop"):
        a.aio.add(1, 2)


def test_future_mode(connected):
    f = FutureActor()
    futures = [f.record(i) for i in range(200)]
    assert [fut.get() for fut in futures] == list(range(200))
    assert f.history().get() == list(range(200))  # executed in the order sent
    slow = f.slow(1.0)
    with pytest.raises(TimeoutError, match="has not finished yet"):
        slow.get_nowait()
    with pytest.raises(TimeoutError, match="within 0.01 s"):
        slow.get(timeout=0.01)
    assert slow.get() == "done"
    with pytest.raises(parl.FutureGetRepeatedlyError, match="already taken"):
        slow.get()
    assert slow.done()


def test_two_threads_waiting_on_one_future_both_return(connected):
    slow = FutureActor().slow(0.5)
    outcomes: list[object] = []

    def wait() -> None:
        try:
            outcomes.append(slow.get(timeout=30))
        except parl.FutureGetRepeatedlyError as exc:
            outcomes.append(type(exc))

    threads = [threading.Thread(target=wait) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(map(str, outcomes)) == sorted(["done", str(parl.FutureGetRepeatedlyError)])


@pytest.mark.xparl_only  # counts the objects of xparl's own driver
def test_a_call_in_flight_is_one_object_for_the_garbage_collector(connected):
    """A future-mode call sent and not answered yet leaves its future alone for the garbage
    collector to track (no lock, no queued closure). With torch imported a process tracks
    hundreds of thousands of objects, and each one that reaches the oldest generation brings a
    full collection, which walks them all, nearer."""
    f = FutureActor()
    f.slow(0.0).get()  # its first call of the method builds what later ones reuse
    gc.collect()
    gc.disable()
    try:
        busy = f.slow(3.0)  # the calls behind it wait for it on the actor: in flight
        before = len(gc.get_objects())
        futures = [f.slow(0.0) for _ in range(500)]
        # once the client's loop sent them: the futures, their list, little else
        wait_until(
            lambda: len(gc.get_objects()) - before < 550,
            timeout=2.5,
            what="the calls sent, each leaving one object tracked",
        )
        assert not busy.done()  # (so none of them was answered yet)
        assert [future.get(timeout=60) for future in futures] == ["done"] * 500
        assert busy.get() == "done"
    finally:
        gc.enable()


def test_awaitable_calls_keep_their_order(connected):
    @parl.remote_class
    class Log:
        def __init__(self):
            self.items = []

        def add(self, i):
            self.items.append(i)

        def get(self):
            return self.items

    log = Log()

    async def ordered():
        await asyncio.gather(*[log.aio.add(i) for i in range(100)])
        return await log.aio.get()

    assert asyncio.run(ordered()) == list(range(100))


@pytest.mark.xparl_only  # counts slots in `xparl status`
def test_deleting_the_handle_frees_the_slot(connected):
    cluster = connected
    wait_until(lambda: used_slots(cluster) == 0, what="no slot in use")
    a = Actor(1)
    b = Actor(2)
    method = b.add  # a bound method keeps its actor alive
    assert used_slots(cluster) == 2
    del a
    wait_until(lambda: used_slots(cluster) == 1, what="the slot of `del a`")
    del b
    assert method(1, 1) == 4
    del method
    gc.collect()
    wait_until(lambda: used_slots(cluster) == 0, what="the slot of b")


def test_calling_before_connect_says_to_connect():
    parl.disconnect()
    with pytest.raises(parl_remote.NotConnectedError, match=r"call parl.connect\("):
        Actor(1)


@pytest.mark.xparl_only  # counts slots in `xparl status`
def test_handles_are_freed_by_reference_counting_alone(connected):
    # Every path (blocking, awaitable, future) must leave no reference cycle behind: `del`
    # frees the actor at once, not whenever the garbage collector happens to run.
    cluster = connected
    wait_until(lambda: used_slots(cluster) == 0, what="no slot in use")
    gc.disable()
    try:
        a = Actor(1)
        f = FutureActor()

        async def use():
            assert await a.aio.add(1, 1) == 3
            b = await Actor.aio(2)
            assert await b.add(0, 0) == 2

        asyncio.run(use())
        assert a.add(0, 0) == 1 and f.record(7).get() == 7
        wait_until(lambda: used_slots(cluster) == 2, what="b's slot, freed with its coroutine")
        a = f = None  # drops the last handles (the coroutine above referred to `a`)
        wait_until(lambda: used_slots(cluster) == 0, what="both slots, without gc")
    finally:
        gc.enable()


def test_a_second_thread_reaches_an_actor_busy_in_a_long_call(connected, tmp_path):
    # The first thread's call holds the actor's event loop; the second thread's connection
    # must still be accepted (its call then waits its turn) instead of timing out as "dead".
    a = Actor(0)
    started = tmp_path / "started"
    results = []
    first = threading.Thread(target=lambda: results.append(a.sleep_then(5, "first", str(started))))
    first.start()
    wait_until(started.exists, what="the long call to start")
    began = time.monotonic()
    from parl_remote._config import settings

    old = settings.connect_timeout_s
    settings.connect_timeout_s = 2.5  # shorter than the call in progress
    try:
        assert a.add(1, 1) == 2  # a new connection: the pool's only one is busy
        waited = time.monotonic() - began
    finally:
        settings.connect_timeout_s = old
    first.join(10)
    assert results == ["first"]
    assert waited > 4  # it waited its turn behind the 5 s call, in order


@pytest.mark.xparl_only  # breaks an xparl socket
def test_a_broken_connection_to_a_live_actor_is_not_a_death(connected):
    import socket

    a = Actor(1)
    assert a.add(0, 0) == 1
    for conn in list(a._parl_ref.blocking.pool):  # the network drops this client's connection
        conn.sock.shutdown(socket.SHUT_RDWR)
    with pytest.raises(parl.RemoteError, match="lost the connection.*still counts alive") as info:
        a.add(1, 1)
    assert not isinstance(info.value, parl.RemoteActorDiedError)
    assert a.add(1, 1) == 3  # a later call connects again

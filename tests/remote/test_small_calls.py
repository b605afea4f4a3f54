"""Small calls on their quick path, against a real cluster: values, order, threads, failures.

A blocking call with plain arguments (`add(1, 2)`) is sent with its arguments as themselves
(not pickled), runs on the actor without a queue when nothing else is in flight, and its plain
result comes back as itself. These tests hold that path to the semantics of every other call.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
import threading

import pytest

import parl
import parl_remote
from parl_remote import RemoteActorDiedError
from parl_remote._exceptions import ProtocolError
from parl_remote.wire._serialize import plain, plain_args
from parl_remote.wire.protocol import messages as m
from tests.remote.conftest import client_env, wait_until


@parl.remote_class
class Recorder:
    """Keeps the order in which calls reached it."""

    def __init__(self):
        self.seen = []

    def echo(self, *args, **kwargs):
        return (args, kwargs) if kwargs or len(args) != 1 else args[0]

    def kinds(self, *args):
        return [type(a).__name__ for a in args]

    def record(self, source, i):
        self.seen.append((source, i))
        return i

    def history(self):
        return self.seen

    def fail(self, message):
        raise ValueError(message)

    def sleep_then(self, seconds, value, started):
        import pathlib
        import time

        pathlib.Path(started).touch()
        time.sleep(seconds)
        return value

    def pid(self):
        return os.getpid()

    async def wait_for_flag(self):
        self.flag = getattr(self, "flag", None) or asyncio.Event()
        await asyncio.wait_for(self.flag.wait(), 10)
        return "released"

    def set_flag(self):
        self.flag = getattr(self, "flag", None) or asyncio.Event()
        self.flag.set()
        return "set"

    def path(self, *args, **kwargs):
        """The function of the actor's call path that ran this method."""
        return sys._getframe(1).f_code.co_name

    def raise_path(self):
        raise KeyError(sys._getframe(1).f_code.co_name)

    def pair(self, a, b):
        return [a, b]

    def exit_now(self, code):
        sys.exit(code)

    def text(self, n):
        return "y" * n

    def slow_record(self, source, seconds, started):
        import pathlib
        import time

        pathlib.Path(started).touch()
        time.sleep(seconds)
        self.seen.append((source, 0))
        return len(self.seen)

    def hide_pid(self, value):
        self.pid = value  # an attribute that hides the method of that name
        return value


EDGES = [
    0,
    -1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    2**64,  # beyond msgpack: pickled
    -(2**63) - 1,
    2**100,
    1.5,
    -0.0,
    float("inf"),
    True,
    False,
    None,
    "",
    "ascii",
    "é and 漢",  # not ASCII: pickled
    "\ud800",  # a lone surrogate: pickled, never an encoding error
    "x" * 70_000,  # long: pickled
    b"bytes",
    bytearray(b"ba"),
    (1, 2),
    [1, "a"],
]


def test_which_values_travel_as_themselves():
    assert plain(1) and plain(2**64 - 1) and plain(-(2**63)) and plain("abc") and plain(None)
    assert plain(True) and plain(1.0)
    assert not plain(2**64) and not plain("é") and not plain(b"b") and not plain((1,))
    assert not plain("x" * 70_000) and not plain(1 + 0j)
    assert plain_args((1, "a", None, 2.5, False), {})
    assert not plain_args((1,), {"b": 2}) and not plain_args(([1],), {})
    for value in (1, -(2**63), 2**64 - 1, 0.1, "abc", True, None):  # what the wire keeps
        back = m.decoder.decode(m.encoder.encode(m.Result(1, b"", value))).value
        assert back == value and type(back) is type(value)


def test_every_value_comes_back_as_it_went(connected):
    a = Recorder()
    for value in EDGES:
        back = a.echo(value)
        assert back == value and type(back) is type(value), value
    nan = a.echo(float("nan"))
    assert isinstance(nan, float) and math.isnan(nan)
    assert a.kinds(1, 2.0, "s", None, True, 2**70) == [
        "int",
        "float",
        "str",
        "NoneType",
        "bool",
        "int",
    ]
    assert a.echo(1, b=2) == ((1,), {"b": 2})
    assert a.echo() == ((), {})

    async def awaited():
        return [await a.aio.echo(v) for v in EDGES]

    assert asyncio.run(awaited()) == EDGES


def test_blocking_calls_from_many_threads_keep_each_threads_order(connected):
    a = Recorder()
    errors, threads = [], []

    def caller(source):
        try:
            for i in range(150):
                assert a.record(source, i) == i
        except BaseException as exc:  # reported below
            errors.append(exc)

    for source in range(8):
        threads.append(threading.Thread(target=caller, args=(source,)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    seen = a.history()
    assert len(seen) == 8 * 150
    for source in range(8):
        assert [i for s, i in seen if s == source] == list(range(150))


def test_quick_blocking_calls_mixed_with_awaitable_ones_on_one_actor(connected):
    a = Recorder()
    done = threading.Event()

    def blocking():
        for i in range(200):
            a.record("blocking", i)
        done.set()

    async def awaited():
        thread = threading.Thread(target=blocking)
        thread.start()
        for start in range(0, 200, 20):  # bursts: these take the queued path
            got = await asyncio.gather(*[a.aio.record("aio", i) for i in range(start, start + 20)])
            assert got == list(range(start, start + 20))
        await asyncio.to_thread(thread.join, 60)

    asyncio.run(awaited())
    assert done.is_set()
    seen = a.history()
    for source in ("blocking", "aio"):
        assert [i for s, i in seen if s == source] == list(range(200))


def test_exceptions_on_the_quick_path_and_calls_after_them(connected):
    a = Recorder()
    for _ in range(3):
        with pytest.raises(ValueError, match="nope") as info:
            a.fail("nope")
        assert isinstance(info.value, parl.RemoteError)
        assert a.record("after", 1) == 1
    with pytest.raises(TypeError):
        a.record(1)  # the method's own TypeError, from the actor


def test_a_blocking_call_while_an_async_method_waits(connected):
    a = Recorder()

    async def main():
        waiting = asyncio.ensure_future(a.aio.wait_for_flag())
        await asyncio.sleep(0.2)  # the async method is running on the actor, and waits
        assert await asyncio.to_thread(a.set_flag) == "set"  # a quick blocking call meanwhile
        return await asyncio.wait_for(waiting, 15)

    assert asyncio.run(main()) == "released"


def test_the_actor_dies_during_a_quick_call(connected, tmp_path):
    a = Recorder()
    pid = a.pid()
    outcome, started = [], tmp_path / "started"

    def call():
        try:
            a.sleep_then(60, "never", str(started))
        except BaseException as exc:  # reported below
            outcome.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    wait_until(started.exists, what="the call to start")
    os.kill(pid, signal.SIGKILL)
    thread.join(30)
    assert not thread.is_alive(), "the call did not return after its actor died"
    assert len(outcome) == 1 and isinstance(outcome[0], RemoteActorDiedError)
    with pytest.raises(RemoteActorDiedError):
        a.record("late", 1)


@parl.remote_class(wait=False)
class Later:
    def echo(self, x):
        return x


def test_a_call_too_large_to_send_fails_alone_in_every_mode(module_cluster):
    np = pytest.importorskip("numpy")
    big = np.ones(2 << 20, dtype=np.uint8)
    with client_env(module_cluster, PARL_MAX_MESSAGE_BYTES=1 << 20):
        parl_remote.connect(module_cluster.address)
        later, now = Later(), Recorder()
        assert later.echo(1).get(timeout=30) == 1  # its connection is open: sent at once
        futures = [later.echo(1), later.echo(big), later.echo(2)]
        assert futures[0].get(timeout=30) == 1
        with pytest.raises(ProtocolError, match="exceeds the limit"):
            futures[1].get(timeout=30)
        assert futures[2].get(timeout=30) == 2
        with pytest.raises(ProtocolError, match="exceeds the limit"):
            now.echo(big)
        assert now.echo(3) == 3

        async def awaited():
            with pytest.raises(ProtocolError, match="exceeds the limit"):
                await now.aio.echo(big)
            return await now.aio.echo(4)

        assert asyncio.run(awaited()) == 4


# -- the lane: a plain call that arrives alone runs at once (`CallRunner.lane`) ----------------
def test_plain_calls_take_the_lane_and_others_the_general_path(connected):
    a = Recorder()
    assert a.path() == "lane"
    assert a.path(1, -2.5, "s", None, True) == "lane"
    assert a.path(1, k=2) == "_call"  # keywords: pickled
    assert a.path([1]) == "_call"  # not a plain value
    assert a.path(2**70) == "_call"  # beyond msgpack's ints
    assert a.path("é") == "_call"  # not ASCII
    assert a.pair(1, "b") == [1, "b"]  # run in the lane, its result pickled
    assert a.path() == "lane"
    for n in (10, 70_000, 3_000_000):  # replies of one read and of many, to a plain call
        assert a.text(n) == "y" * n
    assert a.path() == "lane"


def test_exceptions_raised_in_the_lane(connected):
    a = Recorder()
    for _ in range(3):
        with pytest.raises(KeyError, match="lane") as info:
            a.raise_path()
        assert isinstance(info.value, parl.RemoteError)
        assert "raise_path" in "".join(info.value.__notes__)  # the remote traceback
        assert a.path() == "lane"  # the actor goes on
    with pytest.raises(TypeError):
        a.pair(1)  # the method's own TypeError, from the lane
    assert a.record("after", 5) == 5


def test_a_plain_call_that_arrives_while_another_runs_waits_its_turn(connected, tmp_path):
    a = Recorder()
    started, answers = tmp_path / "started", []
    slow = threading.Thread(
        target=lambda: answers.append(("slow", a.slow_record("slow", 1.0, str(started))))
    )
    slow.start()
    wait_until(started.exists, what="the slow call to start")
    answers.append(("quick", a.record("quick", 1)))  # sent while the slow one runs
    slow.join(30)
    assert not slow.is_alive()
    assert a.history() == [("slow", 0), ("quick", 1)]
    assert sorted(answers) == [("quick", 1), ("slow", 1)]


def test_an_attribute_set_in_the_lane_hides_its_method_for_the_caller(connected):
    a = Recorder()
    assert a.path() == "lane"
    assert a.hide_pid(7) == 7  # the reply says that `pid` is hidden now
    assert a.pid == 7
    assert a.path() == "lane"


def test_sys_exit_in_the_lane_is_a_dead_actor_for_the_caller(connected):
    a = Recorder()
    with pytest.raises(RemoteActorDiedError):
        a.exit_now(3)
    with pytest.raises(RemoteActorDiedError, match=r"sys.exit\(3\)"):
        a.record("late", 1)


# -- the lanes' framing, with bytes (`Connection.exchanger`, `Connection.dispatcher`) -----------
def _ends(**kwargs):
    from parl_remote.wire.protocol.connection import Connection

    client = Connection("client", is_server=False, token=None, trusted=True, **kwargs)
    actor = Connection("actor", is_server=True, token=None, trusted=True, **kwargs)
    return client, actor


class _Wire:
    """The client's socket: what it wrote, and the reads it is given, one by one."""

    def __init__(self, *reads):
        self.sent, self.reads = [], list(reads)

    def sendall(self, data):
        self.sent.append(bytes(data))

    def recv_into(self, view):  # as a socket does: at most what fits
        data = self.reads.pop(0)
        n = min(len(data), len(view))
        view[:n] = data[:n]
        if n < len(data):
            self.reads.insert(0, data[n:])
        return n


def test_the_exchange_decodes_a_whole_reply_and_leaves_the_rest_to_the_protocol():
    from parl_remote.wire.protocol.connection import NEED_DATA

    client, actor = _ends()
    call = m.Call(7, "add", b"", m.CallKind.METHOD, (1, 2))
    reply = actor.frame(m.Result(7, b"", 3))
    wire = _Wire(reply)
    assert client.exchanger(wire.sendall, wire.recv_into)(call) == m.Result(7, b"", 3)
    actor.receive_data(wire.sent[0])  # what was written is the frame of the call
    assert actor.next_event() == (call, ()) and client.idle
    wire = _Wire(reply[:5], reply[5:])  # the reply in two reads: the protocol has the first
    exchange = client.exchanger(wire.sendall, wire.recv_into)
    assert exchange(call) is None and client.next_event() is NEED_DATA and not client.idle
    client.receive_data(reply[5:])
    assert client.next_event() == (m.Result(7, b"", 3), ()) and client.idle
    both = reply + actor.frame(m.Result(8, b"", 4))  # two frames in one read: both kept
    wire = _Wire(both)
    assert client.exchanger(wire.sendall, wire.recv_into)(call) is None
    assert [e[0].id for e in client.take_events()] == [7, 8]


def test_the_exchange_refuses_what_the_protocol_refuses():
    client, _ = _ends(max_message_bytes=64)
    wire = _Wire(b"")
    with pytest.raises(ProtocolError, match="exceeds the limit"):  # nothing sent
        client.exchanger(wire.sendall, wire.recv_into)(m.Call(1, "x" * 100, b""))
    assert wire.sent == []
    with pytest.raises(ConnectionError, match="closed"):
        client.exchanger(wire.sendall, wire.recv_into)(m.Call(1, "add", b""))
    wire = _Wire((100).to_bytes(4, "little") + bytes(104))  # over the limit when it arrives
    with pytest.raises(ProtocolError, match="limits"):
        client.exchanger(wire.sendall, wire.recv_into)(m.Call(1, "add", b""))
    client, _ = _ends()
    hello = m.encoder.encode(m.Refused("no"))
    wire = _Wire(len(hello).to_bytes(4, "little") + bytes(4) + hello)
    with pytest.raises(ProtocolError, match="after the handshake"):
        client.exchanger(wire.sendall, wire.recv_into)(m.Call(1, "add", b""))


def test_the_dispatcher_hands_on_a_whole_call_and_every_other_read_goes_the_general_way():
    from parl_remote.wire.protocol.connection import NEED_DATA

    client, actor = _ends()
    calls, others = [], []

    def general(nbytes):
        others.append(nbytes)
        actor.buffer_updated(nbytes)

    dispatch = actor.dispatcher(m.Call, calls.append, general)
    call = m.Call(3, "add", b"", m.CallKind.METHOD, (1, 2))

    def read(data):
        actor.get_buffer()[: len(data)] = data
        dispatch(len(data))

    frame = client.frame(call)
    read(frame)
    assert calls == [call] and others == [] and actor.next_event() is NEED_DATA
    read(frame[:3])  # a frame begun: this read and the next go the general way
    read(frame[3:])
    assert calls == [call] and others == [3, len(frame) - 3]
    assert actor.take_events() == [(call, ())]
    read(client.frame(m.Result(1, b"", 2)))  # not a Call
    read(frame + frame)  # two frames
    assert calls == [call] and len(others) == 4 and len(actor.take_events()) == 3

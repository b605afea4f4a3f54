"""The I/O-free call core, tested with plain messages: no sockets, no loops, no processes."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

from parl_remote._exceptions import (
    ProtocolError,
    RemoteActorDiedError,
    RemoteAttributeError,
    RemoteError,
    RemoteSerializeError,
)
from parl_remote.client._call_core import (
    INIT,
    ActorCore,
    Replies,
    error_from,
    init_payload,
    message_id,
)
from parl_remote.wire import _serialize as ser
from parl_remote.wire.protocol import messages as m
from parl_remote.wire.protocol.connection import NEED_DATA, Connection, hold

ASSIGNED = m.ActorAssigned(7, "a1", "10.0.0.2", 5000, 4242, "w1")
BIG = ser.OUT_OF_BAND_MIN // 8  # float64 items of an array that travels out of band


def _core() -> ActorCore:
    return ActorCore("Learner", ASSIGNED)


def _over_the_wire(msg, buffers):
    """Send through a real sans-I/O connection pair and decode on the other side."""
    sender = Connection("client", is_server=False, token=None, trusted=True)
    receiver = Connection("actor", is_server=True, token=None, trusted=True)
    receiver.receive_data(b"".join(bytes(b) for b in sender.send(msg, buffers)))
    event = receiver.next_event()
    assert receiver.next_event() is NEED_DATA
    return event


class Point:
    def __init__(self, x, y=0):
        self.x, self.y = x, y


def test_calls_get_increasing_ids_from_one_counter_across_threads():
    core = _core()
    ids = []

    def make(n):
        ids.extend(core.call(m.CallKind.METHOD, "f", (), {})[0].id for _ in range(n))

    threads = [threading.Thread(target=make, args=(500,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(ids) == list(range(1, 2001))


def test_a_method_call_pickles_its_arguments_and_decodes_on_the_actor():
    core = _core()
    call, buffers = core.call(m.CallKind.METHOD, "add", (1, 2), {"c": 3})
    assert (call.id, call.name, call.kind) == (1, "add", m.CallKind.METHOD)
    assert buffers == []
    received, received_buffers = _over_the_wire(call, buffers)
    assert received == call and received.kind is m.CallKind.METHOD
    assert ser.loads(received.payload, received_buffers) == ((1, 2), {"c": 3})


def test_attribute_reads_and_writes():
    core = _core()
    get, buffers = core.call(m.CallKind.GETATTR, "k", (), {})
    assert get.kind is m.CallKind.GETATTR and pickle.loads(get.payload) is None and not buffers
    put, _ = core.call(m.CallKind.SETATTR, "k", (5,), {})
    assert put.kind is m.CallKind.SETATTR and pickle.loads(put.payload) == 5


def test_blocking_calls_send_views_of_the_callers_arrays_and_others_copy_them_once():
    core = _core()
    x = np.arange(BIG, dtype=np.float64)
    _, views = core.call(m.CallKind.METHOD, "learn", (x,), {})
    copies = hold(None, core.call(m.CallKind.METHOD, "learn", (x,), {})[1]).buffers  # sent later
    assert len(views) == len(copies) == 1
    x[0] = -1.0  # the caller goes on with its array after the call returned
    assert np.frombuffer(views[0].raw(), dtype=np.float64)[0] == -1.0  # a view: not copied
    assert np.frombuffer(copies[0], dtype=np.float64)[0] == 0.0  # a copy: unchanged
    small = np.zeros(4)
    _, none = core.call(m.CallKind.METHOD, "learn", (small,), {})
    assert none == []  # small arrays travel inside the pickle


def test_init_carries_the_class_the_arguments_and_the_bundle():
    core = _core()
    payload, buffers = init_payload(Point, "Point", (np.ones(BIG),), {"y": 2})
    init, sent = core.init(payload, buffers, b"zip")
    sent = hold(None, sent).buffers  # sent later: copied
    assert (init.actor_id, init.bundle) == ("a1", b"zip") and isinstance(sent[0], bytes)
    received, received_buffers = _over_the_wire(init, sent)
    cls, args, kwargs = ser.loads(received.payload, received_buffers)
    assert cls is Point and kwargs == {"y": 2} and args[0].shape == (BIG,)
    assert core.init(payload, buffers, b"")[1] is buffers  # sent now: as they are


def test_init_checks_the_arguments_against_the_class():
    with pytest.raises(TypeError, match=r"Point\(\): missing a required argument: 'x'"):
        init_payload(Point, "Point", (), {})
    with pytest.raises(RemoteSerializeError, match=r"cannot send Point\(...\).*argument 'y'"):
        init_payload(Point, "Point", (1,), {"y": threading.Lock()})


def test_unpicklable_arguments_are_named():
    core = _core()
    with pytest.raises(RemoteSerializeError, match=r"Learner.learn\(\).*argument 1, <unlocked"):
        core.call(m.CallKind.METHOD, "learn", (1, threading.Lock()), {})
    with pytest.raises(RemoteSerializeError, match="the value for 'k'"):
        core.call(m.CallKind.SETATTR, "k", (threading.Lock(),), {})


def test_results_become_values_with_their_arrays():
    core = _core()
    data, buffers = ser.dumps({"w": np.full(BIG, 3.0)})
    reply, received = _over_the_wire(m.Result(1, data), buffers)
    value = core.result(reply, received, "weights")
    assert value["w"][0] == 3.0 and value["w"].flags.writeable
    assert core.result(m.Ready("a1", 1), (), INIT) == ()
    assert core.result(m.Ready("a1", 1, shadowed=["arg1"]), (), INIT) == ("arg1",)


def test_errors_become_exceptions_of_their_kind():
    core = _core()
    try:
        raise KeyError("missing")
    except KeyError as exc:
        raised = m.Error(
            3, "raised", "KeyError", str(exc), "Traceback: here", ser.dumps_exception(exc)
        )
    with pytest.raises(KeyError) as info:
        core.result(raised, (), "lookup")
    assert isinstance(info.value, RemoteError)
    assert "raised in Learner.lookup() of actor a1" in "\n".join(info.value.__notes__)
    attribute = m.Error(4, "attribute", "AttributeError", "no attribute 'x'")
    with pytest.raises(RemoteAttributeError, match=r"no attribute 'x' \(in Learner.x\(\)"):
        core.result(attribute, (), "x")
    serialize = m.Error(5, "serialize", "PicklingError", "cannot pickle", "tb text")
    with pytest.raises(RemoteSerializeError, match="(?s)cannot pickle.*remote traceback.*tb text"):
        core.result(serialize, (), "f")
    refused = m.Error(0, "error", "RuntimeError", "already built")
    with pytest.raises(RemoteError, match=r"Learner.__init__\(\) of actor a1: already built"):
        core.result(refused, (), INIT)
    assert type(error_from(refused, "here")) is RemoteError


def test_a_result_that_cannot_be_unpickled_and_an_unexpected_reply():
    core = _core()
    with pytest.raises(RemoteSerializeError, match=r"result of Learner.f\(\) could not be"):
        core.result(m.Result(1, b"not a pickle"), (), "f")
    with pytest.raises(RemoteError, match=r"answered Ready to f\(\)"):
        core.result(m.Ready("a1", 1), (), "f")


def test_fate_a_lost_connection_or_a_death_whose_first_reason_stays():
    core = _core()
    lost = core.fate_error(None)  # the master still counts the actor alive
    assert type(lost) is RemoteError and "may or may not have run" in str(lost)
    assert core.dead is None
    died = core.fate_error("its worker was lost")
    assert isinstance(died, RemoteActorDiedError)
    assert "Learner actor a1 (pid 4242 on 10.0.0.2) died: its worker was lost" in str(died)
    core.mark_dead("released")
    assert core.dead == "its worker was lost"
    assert "died: its worker was lost" in str(core.fate_error(None))
    assert core.died_error() is not core.died_error()  # one exception per failed call


def test_message_ids_of_requests_and_replies():
    assert message_id(m.Call(9, "f", b"")) == message_id(m.Result(9, b"")) == 9
    assert message_id(m.Error(9, "error", "E", "")) == 9
    assert message_id(m.Init("a1", b"")) == message_id(m.Ready("a1", 1)) == 0
    assert message_id(m.StatusRequest(4)) == message_id(m.StatusReply(4, {})) == 4
    assert message_id(m.Ping()) is None and message_id(m.ActorDied("a1", "x")) is None


def test_replies_match_their_waiters_in_any_order():
    replies: Replies[str] = Replies()
    replies.expect(0, "init")
    replies.expect(1, "first")
    replies.expect(2, "second")
    with pytest.raises(ValueError, match="id 2 is already waiting"):
        replies.expect(2, "again")
    assert replies.match(m.Result(2, b"")) == "second"
    assert replies.match(m.Result(2, b"")) is None  # answered already
    assert replies.match(m.Ping()) is None
    assert replies.match(m.Ready("a1", 1)) == "init"
    replies.expect(3, "third")
    replies.forget(3)
    assert len(replies) == 1
    assert replies.take_all() == ["first"] and len(replies) == 0


def test_an_unknown_call_kind_is_a_protocol_error():
    receiver = Connection("actor", is_server=True, token=None, trusted=True)
    envelope = m.encoder.encode(["Call", 1, "f", b"", 7])  # kinds are 0, 1 and 2
    with pytest.raises(ProtocolError, match="Invalid enum value 7"):
        receiver.receive_data(len(envelope).to_bytes(4, "little") + bytes(4) + envelope)
        receiver.next_event()

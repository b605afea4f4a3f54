"""The worker's dispatch tables: what it takes from the master and from its actor processes."""

from __future__ import annotations

import shutil
import socket
import typing

import pytest

from parl_remote._exceptions import ProtocolError
from parl_remote.actor._host import ActorHost
from parl_remote.client._call_core import init_payload
from parl_remote.master._master import Master
from parl_remote.wire.protocol import messages as m
from parl_remote.worker._worker import Worker

pytestmark = pytest.mark.xparl_only  # the xparl worker


@pytest.fixture
def worker():
    worker = Worker("127.0.0.1", 1, cpu_num=1, token=None)
    yield worker
    shutil.rmtree(worker.run_dir, ignore_errors=True)


def test_every_table_maps_wire_messages_to_handlers():
    wire = set(typing.get_args(m.Message))
    for table in (Worker._master_handlers, Worker._host_handlers, Master._handlers):
        assert set(table) <= wire and all(callable(h) for h in table.values())
    assert set(Worker._master_handlers) == {
        m.StartActor,
        m.StopActor,
        m.ShutdownWorker,
        m.Preload,
    }


def test_a_message_the_worker_does_not_take_is_a_protocol_error_naming_it(worker):
    with pytest.raises(ProtocolError, match="a worker does not take CreateActor from the master"):
        worker._on_master(None, m.CreateActor(1, "Learner"), ())
    with pytest.raises(ProtocolError, match="does not take Ping from an actor process"):
        worker._on_host(None, m.Ping())


def test_shutdown_from_the_master_stops_the_worker(worker):
    worker._on_master(None, m.ShutdownWorker("the cluster is being stopped"), ())
    assert worker._stopping


class _Conn:
    """Stands for a connection: keeps what is sent on it."""

    def __init__(self) -> None:
        self.sent: list[object] = []
        self.closed = False

    def send(self, msg, buffers=(), batch=False) -> None:
        self.sent.append(msg)

    def close(self) -> None:
        self.closed = True


class _Plain:
    def ping(self):
        return "pong"


@pytest.fixture
def actor_host(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ours, theirs = socket.socketpair()
    host = ActorHost(ours, "127.0.0.1", None)
    host.ctl = _Conn()
    yield host
    ours.close()
    theirs.close()


def test_an_init_that_comes_before_its_assign_waits_for_it(actor_host):
    payload, _ = init_payload(_Plain, "_Plain", (), {})
    client = _Conn()
    actor_host._on_message(client, m.Init("a1", payload), ())
    assert client.sent == [] and actor_host.instance is None  # held until the Assign
    actor_host._on_ctl(actor_host.ctl, m.Assign("a1", "c1", "_Plain"), ())
    assert isinstance(actor_host.instance, _Plain)
    assert [type(msg) for msg in client.sent] == [m.Ready]
    assert [type(msg) for msg in actor_host.ctl.sent] == [m.Assigned, m.ActorInitialized]


def test_an_early_init_for_another_actor_fails_its_client_only(actor_host):
    payload, _ = init_payload(_Plain, "_Plain", (), {})
    client, second = _Conn(), _Conn()
    actor_host._on_message(client, m.Init("a2", payload), ())
    actor_host._on_message(second, m.Init("a3", payload), ())  # only one waits
    assert "is not actor a3" in second.sent[0].message and second.closed
    actor_host._on_ctl(actor_host.ctl, m.Assign("a1", "c1", "_Plain"), ())
    assert actor_host.instance is None and client.closed
    assert "this process is not actor a2" in client.sent[0].message
    assert [type(msg) for msg in actor_host.ctl.sent] == [m.Assigned]

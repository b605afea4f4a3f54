"""The worker's dispatch tables: what it takes from the master and from its actor processes."""

from __future__ import annotations

import shutil
import typing

import pytest

from parl_remote._exceptions import ProtocolError
from parl_remote._master import Master
from parl_remote._worker import Worker
from parl_remote.protocol import messages as m

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

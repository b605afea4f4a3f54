"""Preloading that yields to actors: no actor waits behind an import it does not need, the
worker preloads one warm process at a time, and while its actors keep the CPUs busy it lowers
that process's session (where the autogroup shares the CPUs) or holds it; a lowered process
has its share back before it takes an actor.

The real cluster test holds a preloaded import open (a module that waits for a file) and asks
for an actor that imports nothing: it must answer while the import is still in flight in its
own process. The pacing itself is checked on `PreloadPacer` with processes that record what
they are told, and on `Preloader` in this process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from parl_remote._util import loaded_module
from parl_remote.actor._preload import Preloader
from parl_remote.wire.protocol import messages as m
from parl_remote.worker import _priority
from parl_remote.worker._actor_process import ActorProcess, PreloadPacer
from tests.remote.conftest import make_cluster, run_client_script, wait_until

_HELD_MODULE = """
import os
import time

if not os.environ.get("PARL_ACTOR_ID"):  # a warm process preloading it: hold until released
    with open(os.environ["HELD_LOG"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    deadline = time.monotonic() + 80
    while not os.path.exists(os.environ["HELD_RELEASE"]) and time.monotonic() < deadline:
        time.sleep(0.02)
"""

_HELD_SCRIPT = """
import json, os, time
import parl

parl.connect({address!r})


@parl.remote_class
class Importer:
    def __init__(self):
        import held_import  # reported: the worker's warm process preloads it next


@parl.remote_class
class Plain:
    def pid(self):
        return os.getpid()


first = Importer()  # holds one of the worker's two slots from now on
deadline = time.monotonic() + 60
while time.monotonic() < deadline and not open(os.environ["HELD_LOG"]).read():
    time.sleep(0.02)
holder = int(open(os.environ["HELD_LOG"]).read().split()[0])
plain = Plain()  # the one warm process left is inside that import
result = {{"plain": plain.pid(), "holder": holder}}
result["released"] = os.path.exists(os.environ["HELD_RELEASE"])
open(os.environ["HELD_RELEASE"], "w").close()
print("RESULT", json.dumps(result))
"""


def test_an_actor_does_not_wait_for_a_preloaded_import_it_does_not_need(tmp_path):
    site, log, release = tmp_path / "site", tmp_path / "held.log", tmp_path / "release"
    site.mkdir()
    (site / "held_import.py").write_text(textwrap.dedent(_HELD_MODULE))
    log.write_text("")
    cluster = make_cluster(
        tmp_path,
        workers=(2,),
        PYTHONPATH=str(site),
        HELD_LOG=str(log),
        HELD_RELEASE=str(release),
        PARL_CONNECT_TIMEOUT_S=90,  # an actor that waited would outlast the script's timeout
    )
    try:
        script = _HELD_SCRIPT.format(address=cluster.address)
        result = run_client_script(script, cluster, cwd=tmp_path, timeout=60)
        lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, result.stdout + result.stderr
        seen = json.loads(lines[0].removeprefix("RESULT "))
    finally:
        release.touch()
        cluster.stop()
    # The plain actor's process was the one inside the held import, and answered before it ended.
    assert seen == {"plain": seen["holder"], "holder": seen["holder"], "released": False}


# -- the pacer ---------------------------------------------------------------------------------
class _Told:
    def __init__(self) -> None:
        self.sent: list[object] = []

    def send(self, msg: object) -> None:
        self.sent.append(msg)


def _warm(ready_at: float) -> ActorProcess:
    ready: concurrent.futures.Future[None] = concurrent.futures.Future()
    ready.set_result(None)
    return ActorProcess(proc=None, death_w=-1, ready=ready, ctl=_Told(), ready_at=ready_at)


def _actor(cpu: list[float]) -> ActorProcess:
    """A built actor whose CPU time is `cpu[0]` seconds when sampled."""
    host = _warm(0.0)
    host.actor_id, host.built = "a1", True
    times = SimpleNamespace(user=0.0, system=0.0)

    def cpu_times() -> SimpleNamespace:
        times.user = cpu[0]
        return times

    host.ps = SimpleNamespace(pid=4242, cpu_times=cpu_times)
    return host


def test_the_pacer_preloads_one_warm_process_at_a_time_in_chunks_to_the_least_preloaded():
    pacer = PreloadPacer(cpus=2)
    old, new = _warm(1.0), _warm(2.0)
    names = [f"mod{i}" for i in range(PreloadPacer.CHUNK + 3)]
    pacer.pace([old, new], names)
    assert old.ctl.sent == [m.Preload(names[: PreloadPacer.CHUNK])] and new.ctl.sent == []
    pacer.pace([old, new], names)  # `old` imports: nobody else starts
    assert len(old.ctl.sent) == 1 and new.ctl.sent == []
    old.preload_done = PreloadPacer.CHUNK  # it went through its chunk: the other has had fewer
    pacer.pace([old, new], names)
    assert new.ctl.sent == [m.Preload(names[: PreloadPacer.CHUNK])]
    new.preload_done = PreloadPacer.CHUNK
    pacer.pace([old, new], names)
    assert old.ctl.sent[-1] == m.Preload(names[PreloadPacer.CHUNK :])
    old.preload_done = len(names)
    # The most preloaded first, one importing last.
    assert sorted([new, old], key=ActorProcess.warmth) == [old, new]


def test_the_pacer_holds_the_process_importing_while_the_actors_keep_the_cpus_busy():
    cpu = [0.0]
    pacer = PreloadPacer(cpus=2, quiet_s=3600.0)
    actor, importing, waiting = _actor(cpu), _warm(1.0), _warm(2.0)
    hosts = [actor, importing, waiting]
    pacer.sample(hosts)
    pacer.pace(hosts, ["json"])
    assert importing.ctl.sent == [m.Preload(["json"])]
    cpu[0] = 1e6  # far more than a CPU since the last sample
    pacer.sample(hosts)
    assert pacer.busy
    pacer.pace(hosts, ["json", "wave"])
    assert importing.ctl.sent[-1] == m.PausePreload(True) and importing.preload_paused
    importing.preload_done = 1  # went through its name: still nothing new starts while busy
    pacer.pace(hosts, ["json", "wave"])
    assert waiting.ctl.sent == [] and importing.ctl.sent[-1] == m.PausePreload(True)
    pacer.quiet_s = 0.0  # quiet again
    pacer.pace(hosts, ["json", "wave"])
    assert waiting.ctl.sent == [m.Preload(["json", "wave"])]


def test_a_paused_preloader_holds_at_its_next_module_and_goes_on_when_told_or_stopped(
    tmp_path, monkeypatch
):
    for name in ("paced_a", "paced_b"):
        (tmp_path / f"{name}.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        preloader = Preloader(max_mb=1e9)
        preloader.pause(True)
        preloader.add(["paced_a"])
        time.sleep(0.3)  # room to import, which it must not take
        assert preloader.paused and preloader.busy and "paced_a" not in sys.modules
        preloader.pause(False)
        wait_until(lambda: not preloader.busy, 30, what="the preload")
        assert preloader.imported == ["paced_a"]
        stopped = Preloader(max_mb=1e9)
        stopped.pause(True)
        stopped.add(["paced_b"])
        assert stopped.finish(30)  # stopping lets the held thread go: it imports nothing more
        assert stopped.imported == [] and not stopped.paused
        assert not any(type(f).__name__ == "_Gate" for f in sys.meta_path)
    finally:
        for name in ("paced_a", "paced_b"):
            sys.modules.pop(name, None)


def test_an_actor_gets_the_least_preloaded_process_that_has_what_its_class_needs():
    pacer = PreloadPacer(cpus=2)
    pacer.number(["numpy", "numpy.core", "torch", "torch.nn"])
    fresh, numpy_done, all_done, importing = _warm(1.0), _warm(2.0), _warm(3.0), _warm(0.5)
    numpy_done.preload_sent = numpy_done.preload_done = 2
    all_done.preload_sent = all_done.preload_done = 4
    importing.preload_sent, importing.preload_done = 4, 2
    hosts = [fresh, numpy_done, all_done, importing]
    assert pacer.pick(hosts, "Unknown") is all_done  # no record: the most preloaded
    pacer.note("Plain", [])
    pacer.note("NumpyUser", ["numpy.core", "not_in_the_set"])
    pacer.note("TorchUser", ["torch"])
    assert pacer.pick(hosts, "Plain") is fresh  # the preloaded ones stay for those who need them
    assert pacer.pick(hosts, "NumpyUser") is numpy_done
    assert pacer.pick(hosts, "TorchUser") is all_done
    pacer.note("TorchUser", [])  # a later actor that imported nothing: what it needs stays
    assert pacer.needs["TorchUser"] == 3
    assert pacer.pick([fresh, importing], "TorchUser") is fresh  # none fits: none importing
    assert pacer.pick([], "Plain") is None


def test_a_module_half_imported_by_the_preloader_is_not_taken_from_sys_modules(
    tmp_path, monkeypatch
):
    # The preloader's thread may be importing numpy when a call's shared-memory buffers arrive:
    # the receiver must not use the half-made module (it copies the buffers out instead).
    (tmp_path / "half_made.py").write_text(
        "import os, time\n"
        "end = time.monotonic() + 60\n"
        "while not os.path.exists(os.environ['HALF_MADE_RELEASE']) and time.monotonic() < end:\n"
        "    time.sleep(0.01)\n"
        "frombuffer = len\n"
    )
    release = tmp_path / "release"
    monkeypatch.setenv("HALF_MADE_RELEASE", str(release))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        preloader = Preloader(max_mb=1e9)
        preloader.add(["half_made"])
        wait_until(lambda: "half_made" in sys.modules, 30, what="the import to start")
        assert not hasattr(sys.modules["half_made"], "frombuffer")  # half made
        assert loaded_module("half_made") is None
        release.write_text("")
        wait_until(lambda: not preloader.busy, 30, what="the preload")
        assert loaded_module("half_made").frombuffer is len
        assert loaded_module("not_imported_anywhere") is None
    finally:
        release.write_text("")
        sys.modules.pop("half_made", None)


# -- a low CPU share instead of a hold, where the autogroup shares the CPUs ----------------------
_lowers = pytest.mark.skipif(
    not _priority.lowers_here(), reason="no autogroup shares the CPUs here (a cgroup, or not Linux)"
)


@_lowers
def test_the_pacer_lowers_the_process_importing_while_busy_and_never_holds_it():
    cpu = [0.0]
    pacer = PreloadPacer(cpus=2, quiet_s=3600.0, nice=12)
    actor, importing = _actor(cpu), _warm(1.0)
    importing.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        hosts = [actor, importing]
        pacer.sample(hosts)
        cpu[0] = 1e6  # the actors keep the CPUs busy
        pacer.sample(hosts)
        assert pacer.busy
        pacer.pace(hosts, ["json"])
        assert importing.ctl.sent == [m.Preload(["json"])]  # started, busy as it is
        assert importing.nice == 12 == _priority.nice_of(importing.proc.pid)
        pacer.pace(hosts, ["json"])
        assert importing.ctl.sent == [m.Preload(["json"])] and not importing.preload_paused
        assert wait_until(lambda: importing.set_nice(0), 5, what="the share given back")
        assert importing.nice == 0 == _priority.nice_of(importing.proc.pid)
    finally:
        importing.proc.kill()
        importing.proc.wait(10)


def test_the_root_cpu_group_is_read_from_the_process_cgroups(tmp_path):
    inside = _priority._in_root_cpu_group
    assert inside("4:cpu,cpuacct:/\n0::/user.slice\n", str(tmp_path))  # v1 decides
    assert not inside("4:cpu,cpuacct:/docker/abc\n0::/\n", str(tmp_path))
    assert not inside("", str(tmp_path))  # nothing known: no autogroup assumed
    (tmp_path / "user.slice").mkdir()
    assert inside("0::/user.slice\n", str(tmp_path))  # v2, no CPU controller given to it
    (tmp_path / "user.slice" / "cpu.weight").write_text("100\n")
    assert not inside("0::/user.slice\n", str(tmp_path))
    assert not inside("0::/gone.slice\n", str(tmp_path))
    (tmp_path / "cpu.weight").write_text("100\n")  # a namespace's own cgroup shown as /
    assert not inside("0::/\n", str(tmp_path))
    with pytest.raises(ValueError, match="from 0 to 19"):
        _priority.set_nice(os.getpid(), 20)


def test_a_worker_gives_a_lowered_process_its_share_back_before_it_takes_an_actor(tmp_path):
    if not _priority.lowers_here():
        pytest.skip("no autogroup shares the CPUs here (a cgroup, or not Linux)")
    from parl_remote.worker._worker import Worker

    worker = Worker("127.0.0.1", 1, cpu_num=1, token=None)
    host = _warm(1.0)
    host.proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        assert wait_until(lambda: host.set_nice(15), 5, what="the session lowered")
        host.actor_id = "a1"
        # Given back at once, or within the kernel's tenth of a second after the change above.
        asyncio.run(worker._restore_share(host))
        assert host.nice == 0 == _priority.nice_of(host.proc.pid)
    finally:
        host.proc.kill()
        host.proc.wait(10)
        shutil.rmtree(worker.run_dir, ignore_errors=True)

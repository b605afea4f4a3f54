"""Warm processes that arrive with their actors' imports: real clusters, and the pure checks.

The observable is the user's own module: shipped as code and imported by the actor process, it
records at its import whether numpy was already in `sys.modules` (put there by a preload, since
nothing else of a warm process imports numpy) before it imports numpy itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types

import pytest

import parl_remote
from parl_remote.actor._preload import (
    MAX_NAME_CHARS,
    Preloader,
    check_report,
    drop_shadowed,
    imported_since,
    is_module_name,
    preload_names,
)
from parl_remote.wire._transport import SyncConnection
from parl_remote.wire.protocol import messages as m
from tests.remote.conftest import make_cluster, run_client_script, wait_until

_USER_MODULE = """
import os
import sys

NUMPY_BEFORE = "numpy" in sys.modules  # before this module imports it: a preload did
import numpy as np

SEEN = []


class NumpyUser:  # made remote by the script: pickled by reference, this module imported there
    def __init__(self, extra=None):
        self.extra_before = extra in sys.modules  # before this actor imports it: a preload did
        if extra:
            __import__(extra)  # imported in the actor only, never by the client

    def report(self):
        return {
            "numpy_before": NUMPY_BEFORE,
            "pid": os.getpid(),
            "worker_pid": os.getppid(),
            "extra_before": self.extra_before,
            "marker": getattr(np, "_parl_test_marker", None),
            "seen": list(SEEN),
        }

    def mark(self):
        np._parl_test_marker = os.getpid()
        SEEN.append(os.getpid())
"""

_SCRIPT = """
import json, sys, time
import parl

parl.connect({address!r})
import numpy_user
NumpyUser = parl.remote_class(numpy_user.NumpyUser)

first = NumpyUser({extra!r})
first.mark()                     # state in its process, to be seen by no other actor
reports = [first.report()]
time.sleep({settle})
for _ in range({attempts}):
    actor = NumpyUser({extra!r})
    reports.append(actor.report())
    del actor
    if reports[-1]["numpy_before"]:
        break
    time.sleep(0.5)
print("REPORTS", json.dumps(reports))
"""


def _run(cluster, tmp_path, *, settle=0.0, attempts=40, extra=None) -> list[dict]:
    (tmp_path / "numpy_user.py").write_text(textwrap.dedent(_USER_MODULE))
    script = _SCRIPT.format(address=cluster.address, settle=settle, attempts=attempts, extra=extra)
    result = run_client_script(script, cluster, cwd=tmp_path, timeout=120)
    lines = [line for line in result.stdout.splitlines() if line.startswith("REPORTS ")]
    assert lines, result.stdout + result.stderr
    return json.loads(lines[0].removeprefix("REPORTS "))


def test_a_later_actor_finds_numpy_imported_ahead_and_nothing_of_another(tmp_path):
    cluster = make_cluster(tmp_path, workers=(2,))
    try:
        reports = _run(cluster, tmp_path)
    finally:
        cluster.stop()
    first, later = reports[0], reports[1:]
    assert first["numpy_before"] is False  # a fresh cluster: nothing preloaded yet
    assert later[-1]["numpy_before"] is True, reports
    # No state of the first actor anywhere else: its processes are never reused.
    assert first["marker"] == first["pid"] and first["seen"] == [first["pid"]]
    assert all(r["marker"] is None and r["seen"] == [] for r in later)
    assert len({r["pid"] for r in reports}) == len(reports)


def test_preloading_off_imports_nothing_ahead(tmp_path):
    cluster = make_cluster(tmp_path, workers=(2,), PARL_PRELOAD=0)
    try:
        reports = _run(cluster, tmp_path, settle=3.0, attempts=3)
    finally:
        cluster.stop()
    assert len(reports) == 4
    assert not any(r["numpy_before"] for r in reports)


def test_a_failing_preload_is_skipped_and_actors_still_start(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    attempts = tmp_path / "boom.log"
    (site / "preload_boom.py").write_text(
        textwrap.dedent(
            """
            import os
            with open(os.environ["BOOM_LOG"], "a") as f:
                f.write(os.environ.get("PARL_ACTOR_ID", "-") + "\\n")
            if not os.environ.get("PARL_ACTOR_ID"):
                raise RuntimeError("preload_boom loads in actors only")
            """
        )
    )
    cluster = make_cluster(tmp_path, workers=(2,), PYTHONPATH=str(site), BOOM_LOG=str(attempts))
    try:
        reports = _run(cluster, tmp_path, extra="preload_boom")
        # The warm processes tried it (and failed) ahead of their actors; each actor still
        # imported it for itself.
        lines = wait_until(
            lambda: "-" in attempts.read_text().split() and attempts.read_text().split(),
            15,
            what="a preload of preload_boom",
        )
    finally:
        cluster.stop()
    assert len([line for line in lines if line != "-"]) == len(reports)
    assert reports[-1]["numpy_before"] is True  # the other preloads went on
    assert "preloading preload_boom skipped: RuntimeError" in cluster.log("worker-0.log")


# -- the pure parts ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "",
        "1abc",
        "a..b",
        ".a",
        "a.",
        "os; rm -rf /",
        "a-b",
        "x" * (MAX_NAME_CHARS + 1),
        5,
        None,
        "__main__",
        "__main__.sub",
        "numpy\n",
    ],
)
def test_a_report_with_a_bad_module_name_is_rejected(name):
    assert not is_module_name(name)
    with pytest.raises(ValueError, match="is not a module name"):
        check_report(["numpy", name], limit=10)


def test_a_report_over_the_limit_is_rejected_and_a_good_one_kept():
    assert check_report(["numpy", "torch.nn", "_ctypes"], limit=3) == [
        "numpy",
        "torch.nn",
        "_ctypes",
    ]
    with pytest.raises(ValueError, match="over the limit of 2"):
        check_report(["a", "b", "c"], limit=2)


def test_imported_since_leaves_out_shipped_and_made_up_modules(tmp_path, monkeypatch):
    (tmp_path / "shipped_mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    import wave  # noqa: F401 - a standard-library module a test run does not import otherwise

    import shipped_mod  # noqa: F401

    monkeypatch.setitem(sys.modules, "made_up", types.ModuleType("made_up"))
    try:
        names = imported_since(before, str(tmp_path), limit=100)
        assert "shipped_mod" not in names and "made_up" not in names
        assert "wave" in names or "wave" in before
        assert imported_since(before, str(tmp_path), limit=0) == []
        # A shipped module replaces an imported one of the same name.
        monkeypatch.setitem(sys.modules, "wave_copy", sys.modules["wave"])
        assert drop_shadowed(["wave_copy.py", "data/wave.txt"], str(tmp_path)) == ["wave_copy"]
        assert "wave_copy" not in sys.modules
    finally:
        sys.modules.pop("shipped_mod", None)


def test_drop_shadowed_skips_a_module_a_failing_import_removed_meanwhile(tmp_path, monkeypatch):
    """The preloading thread imports while `drop_shadowed` runs: one of the names it saw may be
    gone by the time it looks (an import that failed takes its module out of sys.modules)."""
    import parl_remote.actor._preload as preload

    for name in ("gone_pkg", "gone_pkg.a", "gone_pkg.b"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))

    def origin(module):
        sys.modules.pop("gone_pkg.b", None)  # meanwhile: a failed import took it out
        return "/elsewhere/" + module.__name__

    monkeypatch.setattr(preload, "_origin", origin)
    dropped = drop_shadowed(["gone_pkg/__init__.py"], str(tmp_path))
    assert sorted(dropped) == ["gone_pkg", "gone_pkg.a"]
    assert not any(name.startswith("gone_pkg") for name in sys.modules)


def test_the_preloader_imports_in_the_background_skips_failures_and_stops(tmp_path, monkeypatch):
    (tmp_path / "pre_ok.py").write_text("X = 1\n")
    (tmp_path / "pre_bad.py").write_text("raise RuntimeError('no')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    preloader = Preloader(max_mb=1e9)
    try:
        preloader.add(["pre_bad", "pre_bad.sub", "pre_missing", "pre_ok", "not a name"])
        wait_until(lambda: not preloader.busy, 30, what="the preloads")
        assert preloader.finish(30)
        assert preloader.imported == ["pre_ok"]
        assert preloader.failed == ["pre_bad", "pre_missing"]  # pre_bad.sub skipped with it
        assert "pre_bad" not in sys.modules
        preloader.add(["json"])  # once stopped, nothing more
        assert preloader.imported == ["pre_ok"]
        capped = Preloader(max_mb=0.0)  # over its memory bound at once: imports nothing
        capped.add(["pre_ok_too"])
        wait_until(lambda: not capped.busy, 30, what="the preloads")
        assert capped.finish(30) and capped.imported == [] and capped.failed == []
    finally:
        for name in ("pre_ok", "pre_bad"):
            sys.modules.pop(name, None)


def test_the_preloading_thread_keeps_its_processs_priority(tmp_path, monkeypatch):
    """A niced thread that holds the GIL through a long import stalls its process's event loop
    whenever other processes keep the CPUs busy: the preloader must not lower its own thread."""
    (tmp_path / "pre_nice.py").write_text(
        "import os, threading\nNICE = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    preloader = Preloader(max_mb=1e9)
    try:
        preloader.add(["pre_nice"])
        wait_until(lambda: not preloader.busy, 30, what="the preload")
        assert preloader.finish(30) and preloader.imported == ["pre_nice"]
        assert os.getpriority(os.PRIO_PROCESS, 0) == sys.modules["pre_nice"].NICE
    finally:
        sys.modules.pop("pre_nice", None)


# -- across workers, and the master's bounds ------------------------------------------------------
_IMPORT_LOGGING_MODULE = """
import os
import sys

with open(os.environ["{log}"], "a") as f:  # who imports this user module, and where
    f.write(os.environ.get("PARL_ACTOR_ID", "-") + " " + os.path.basename(sys.argv[0]) + "\\n")
"""


_SHARED_SCRIPT = """
import json, os, time
import parl

parl.connect({address!r})
import numpy_user
NumpyUser = parl.remote_class(numpy_user.NumpyUser)

first = NumpyUser("site_marker")  # holds its worker's only slot from now on
reports = [first.report()]
deadline = time.monotonic() + 60  # until a warm process of the other worker preloaded it
while time.monotonic() < deadline:
    with open(os.environ["SITE_LOG"]) as f:
        if any(line.startswith("- ") for line in f):
            break
    time.sleep(0.05)
second = NumpyUser("site_marker")
reports.append(second.report())
print("REPORTS", json.dumps(reports))
"""


def test_what_one_workers_actor_imported_is_preloaded_on_another_worker(tmp_path):
    site, import_log, site_log = tmp_path / "site", tmp_path / "imports.log", tmp_path / "site.log"
    site.mkdir()
    (site / "site_marker.py").write_text(_IMPORT_LOGGING_MODULE.replace("{log}", "SITE_LOG"))
    site_log.write_text("")
    cluster = make_cluster(
        tmp_path,
        workers=(1, 1),
        PYTHONPATH=str(site),  # an installed module, not shipped code
        IMPORT_LOG=str(import_log),
        SITE_LOG=str(site_log),
    )
    try:
        module = _IMPORT_LOGGING_MODULE.replace("{log}", "IMPORT_LOG") + _USER_MODULE
        (tmp_path / "numpy_user.py").write_text(module)
        script = _SHARED_SCRIPT.format(address=cluster.address)
        result = run_client_script(script, cluster, cwd=tmp_path, timeout=120)
        lines = [line for line in result.stdout.splitlines() if line.startswith("REPORTS ")]
        assert lines, result.stdout + result.stderr
        first, second = json.loads(lines[0].removeprefix("REPORTS "))
    finally:
        cluster.stop()
    assert first["worker_pid"] != second["worker_pid"]  # the first holds its worker's one slot
    assert first["numpy_before"] is False and first["extra_before"] is False
    # The first actor's imports reached the other worker through the master, ahead of time.
    assert second["numpy_before"] is True and second["extra_before"] is True
    # The user's own module ran in the two actors only, never in a warm process ahead of one.
    importers = [line for line in import_log.read_text().split("\n") if "_host.py" in line]
    assert len(importers) == 2 and not any(line.startswith("- ") for line in importers)


def _fake_worker(cluster, worker_id: str) -> SyncConnection:
    """A connection that registers as a worker of one slot, and reads `Accepted`."""
    host, port = cluster.address.rsplit(":", 1)
    token = cluster.env["PARL_CLUSTER_TOKEN"].encode()
    conn = SyncConnection.open(host, int(port), token=token, role="worker", timeout=10)
    conn.sock.settimeout(10)
    conn.send(m.RegisterWorker(worker_id, "fake", "127.0.0.1", 1, 1))
    accepted, _ = conn.receive()
    assert isinstance(accepted, m.Accepted)
    return conn


def _next_preload(conn: SyncConnection) -> m.Preload:
    while True:  # heartbeats' pings may come first
        msg, _ = conn.receive()
        if isinstance(msg, m.Preload):
            return msg


def test_the_master_shares_valid_preload_reports_only_and_within_bounds(tmp_path):
    cluster = make_cluster(tmp_path, workers=(), PARL_PRELOAD_MAX_MODULES=4)
    conns = []
    try:
        one = _fake_worker(cluster, "w1")
        two = _fake_worker(cluster, "w2")
        conns += [one, two]
        one.send(m.Preload(["numpy", "os; rm -rf /"]))  # one bad name: none of it is taken
        one.send(m.Preload(["a", "b", "c", "d", "e"]))  # over PARL_PRELOAD_MAX_MODULES
        one.send(m.Preload(["json", "numpy"]))
        assert _next_preload(two).modules == ["json", "numpy"]  # the first message it gets
        one.send(m.Preload(["json", "wave", "csv", "zlib"]))  # a set of 4 at most
        assert _next_preload(two).modules == ["wave", "csv"]
        three = _fake_worker(cluster, "w3")  # a newcomer hears the whole set at once
        conns.append(three)
        assert _next_preload(three).modules == ["json", "numpy", "wave", "csv"]
    finally:
        for conn in conns:
            conn.close()
        cluster.stop()
    log = cluster.log()
    assert "is not a module name" in log and "over the limit of 4" in log


def test_the_preloader_says_when_it_went_through_everything_and_takes_names_after(
    tmp_path, monkeypatch
):
    for name in ("idle_a", "idle_b"):
        (tmp_path / f"{name}.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reports: list[int] = []
    preloader = Preloader(max_mb=1e9, on_idle=reports.append)
    try:
        preloader.add(["idle_a", "json"])
        wait_until(lambda: reports == [2], 30, what="the first report")
        preloader.add(["idle_b"])  # its thread has ended: a new one takes it
        wait_until(lambda: reports == [2, 3], 30, what="the second report")
        assert "idle_b" in sys.modules and preloader.finish(30)
    finally:
        for name in ("idle_a", "idle_b"):
            sys.modules.pop(name, None)


def test_a_worker_takes_a_process_done_preloading_then_one_not_preloading_then_the_longest_warm():
    from parl_remote.worker._actor_process import ActorProcess

    def host(ready_at: float, sent: int, done: int) -> ActorProcess:
        return ActorProcess(
            proc=None, death_w=-1, ready=None, ready_at=ready_at, preload_sent=sent,
            preload_done=done,
        )  # fmt: skip

    busy_old, settled_new, settled_old = host(1.0, 5, 2), host(9.0, 5, 5), host(5.0, 5, 5)
    fresh = host(0.5, 0, 0)  # sent nothing yet: no import in flight for its actor to meet
    order = sorted([busy_old, settled_new, fresh, settled_old], key=ActorProcess.warmth)
    assert order == [settled_old, settled_new, fresh, busy_old]


_TORCH_USER_MODULE = """
import os
import sys

TORCH_BEFORE = "torch" in sys.modules  # before this module imports it: a preload did
import torch


class TorchUser:
    def report(self):
        return {"torch_before": TORCH_BEFORE, "pid": os.getpid(), "torch": torch.__version__}
"""

_FIRST_TORCH_ACTOR = """
import json, os, time
import parl

parl.connect({address!r}{preload})
deadline = time.monotonic() + 120  # until the warm process went through torch to the marker
while time.monotonic() < deadline:
    with open(os.environ["SITE_LOG"]) as f:
        if any(line.startswith("- ") for line in f):
            break
    time.sleep(0.05)
import torch_user
TorchUser = parl.remote_class(torch_user.TorchUser)
print("REPORT", json.dumps(TorchUser().report()))
"""


def _first_torch_actor(tmp_path, *, master_args=(), preload=""):
    """The report of the first actor of a cluster of one slot, whose class imports torch.

    `site_marker` (installed, preloaded after torch) writes a line when a warm process imports
    it: then that process went through torch; the script creates its actor after that line.
    """
    site, site_log = tmp_path / "site", tmp_path / "site.log"
    site.mkdir()
    (site / "site_marker.py").write_text(_IMPORT_LOGGING_MODULE.replace("{log}", "SITE_LOG"))
    site_log.write_text("")
    (tmp_path / "torch_user.py").write_text(_TORCH_USER_MODULE)
    cluster = make_cluster(
        tmp_path,
        workers=(1,),
        master_args=master_args,
        PYTHONPATH=str(site),
        SITE_LOG=str(site_log),
    )
    try:
        script = _FIRST_TORCH_ACTOR.format(address=cluster.address, preload=preload)
        result = run_client_script(script, cluster, cwd=tmp_path, timeout=180)
        lines = [line for line in result.stdout.splitlines() if line.startswith("REPORT ")]
        assert lines, result.stdout + result.stderr
    finally:
        cluster.stop()
    assert site_log.read_text().startswith("- "), "no warm process imported the marker"
    return json.loads(lines[0].removeprefix("REPORT "))


def test_xparl_start_preload_has_the_first_torch_actor_find_torch_imported(tmp_path):
    report = _first_torch_actor(tmp_path, master_args=("--preload", "torch,site_marker"))
    assert report["torch_before"] is True


def test_connect_preload_has_the_first_torch_actor_find_torch_imported(tmp_path):
    report = _first_torch_actor(tmp_path, preload=", preload=['torch', 'site_marker']")
    assert report["torch_before"] is True


def test_preload_names_are_checked_before_anything_starts():
    assert preload_names("torch, numpy") == ["torch", "numpy"]
    assert preload_names(["torch.nn"]) == ["torch.nn"]
    with pytest.raises(ValueError, match=r"preload: 'no such' is not a module name"):
        preload_names("torch,no such")
    with pytest.raises(ValueError, match="is not a module name"):
        parl_remote.connect("127.0.0.1:1", preload=["__main__"])
    with pytest.raises(ValueError, match="preload applies to PARL's own clusters"):
        parl_remote.connect(backend="ray", preload=["torch"])


def test_xparl_start_refuses_a_preload_that_names_no_module(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "parl_remote.cli", "start", "--preload", "torch,no such"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PARL_HOME=str(tmp_path)),
        check=False,
    )
    assert result.returncode == 2
    assert "preload: 'no such' is not a module name" in result.stderr
    assert not (tmp_path / "token").exists()  # refused before anything started

"""Warm processes that arrive with their actors' imports: real clusters, and the pure checks.

The observable is the user's own module: shipped as code and imported by the actor process, it
records at its import whether numpy was already in `sys.modules` (put there by a preload, since
nothing else of a warm process imports numpy) before it imports numpy itself.
"""

from __future__ import annotations

import json
import sys
import textwrap
import types

import pytest

from parl_remote._preload import (
    MAX_NAME_CHARS,
    Preloader,
    check_report,
    drop_shadowed,
    imported_since,
    is_module_name,
)
from tests.remote.conftest import make_cluster, run_client_script, wait_until

_USER_MODULE = """
import os
import sys

NUMPY_BEFORE = "numpy" in sys.modules  # before this module imports it: a preload did
import numpy as np

SEEN = []


class NumpyUser:  # made remote by the script: pickled by reference, this module imported there
    def __init__(self, extra=None):
        if extra:
            __import__(extra)  # imported in the actor only, never by the client

    def report(self):
        return {
            "numpy_before": NUMPY_BEFORE,
            "pid": os.getpid(),
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

"""The code bundle is built once however many threads create actors at the same moment, and
looks again only at the modules imported since its last look."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import parl_remote.client._bundle as bundle_module
from parl_remote.client._bundle import Bundle, user_module_files


def test_threads_asking_at_once_all_get_the_whole_bundle(tmp_path, monkeypatch):
    assert user_module_files(), "this test's own package is a user module: the bundle is not empty"
    for _ in range(20):  # each round a fresh bundle, first asked by 8 threads together
        bundle = Bundle()
        start = threading.Barrier(8)

        def ask(bundle: Bundle = bundle, start: threading.Barrier = start) -> bytes:
            start.wait(timeout=10)
            return bundle.data()

        with ThreadPoolExecutor(8) as pool:
            datas = list(pool.map(lambda _: ask(), range(8)))
        assert all(datas), "a thread got an empty bundle"
        assert len(set(datas)) == 1

    # A module imported since the last look is shipped, and the next look examines it alone.
    looked_at: list[list[str]] = []
    find = bundle_module._find_user_modules

    def spy(modules, files, packages):
        modules = list(modules)
        looked_at.append([name for name, _ in modules])
        find(modules, files, packages)

    monkeypatch.setattr(bundle_module, "_find_user_modules", spy)
    (tmp_path / "bundle_newcomer.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    bundle.data()  # nothing new since the rounds' looks
    assert looked_at == []
    import bundle_newcomer  # noqa: F401

    try:
        assert b"bundle_newcomer.py" in bundle.data()
        assert looked_at == [["bundle_newcomer"]]
    finally:
        sys.modules.pop("bundle_newcomer", None)

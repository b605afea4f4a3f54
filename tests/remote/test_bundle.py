"""The code bundle is built once however many threads create actors at the same moment."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from parl_remote.client._bundle import Bundle, user_module_files


def test_threads_asking_at_once_all_get_the_whole_bundle():
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

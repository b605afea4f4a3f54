"""The master's garbage collector steps: survivors frozen, frozen cycles collected on growth."""

from __future__ import annotations

import gc
import weakref

from parl_remote.master._collector import Collector


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_a_step_frees_young_cycles_and_frozen_ones_wait_for_a_quarter_more_objects():
    collector = Collector(check_every=1)
    try:
        collector.step()
        young = _Node()
        young_ref = weakref.ref(young)
        del young
        collector.step()
        assert young_ref() is None  # made since the last step: collected by this one
        old = _Node()
        old_ref = weakref.ref(old)
        collector.step()  # alive: frozen
        del old
        gc.collect()
        collector.step()
        assert old_ref() is not None and collector.full_collections == 0
        base = gc.get_freeze_count()
        grown = [[] for _ in range(base // 4 + 1000)]  # the frozen objects grow by a quarter
        collector.step()
        assert old_ref() is None and collector.full_collections == 1
        assert gc.get_freeze_count() >= len(grown)
    finally:
        collector.close()
    assert gc.get_freeze_count() == 0

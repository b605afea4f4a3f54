"""`parl.utils.ReplayMemory`: ring buffer semantics, sampling bounds, and save/load."""

from __future__ import annotations

import numpy as np
import pytest

from parl.utils import Batch, ReplayMemory


def _fill(memory: ReplayMemory, start: int, stop: int) -> None:
    for i in range(start, stop):
        obs = np.full(memory.obs_shape, i, dtype=np.float32)
        act = i if memory.act_shape == () else np.full(memory.act_shape, i, dtype=np.float32)
        memory.append(obs, act, float(i), obs + 0.5, i % 2 == 0)


def test_append_and_sample_shapes():
    memory = ReplayMemory(100, obs_dim=4, act_dim=2, seed=0)
    _fill(memory, 0, 10)
    assert memory.size() == len(memory) == 10
    obs, act, reward, next_obs, terminal = memory.sample_batch(32)
    assert obs.shape == (32, 4) and next_obs.shape == (32, 4)
    assert act.shape == (32, 2) and act.dtype == np.float32
    assert reward.shape == (32,) and terminal.shape == (32,)
    # Each sampled row is one consistent transition.
    np.testing.assert_array_equal(obs[:, 0], reward)
    np.testing.assert_array_equal(next_obs[:, 0], reward + 0.5)
    np.testing.assert_array_equal(terminal, (reward % 2 == 0).astype(np.float32))


def test_a_batch_is_named_and_unpacks_as_five_arrays():
    memory = ReplayMemory(10, obs_dim=2, act_dim=0, seed=0)
    _fill(memory, 0, 4)
    batch = memory.sample_batch(8)
    assert isinstance(batch, Batch) and len(batch) == 5
    obs, act, reward, next_obs, terminal = batch
    assert batch.obs is obs and batch.act is act and batch.reward is reward
    assert batch.next_obs is next_obs and batch.terminal is terminal
    assert batch.weights is None and batch.indices is None  # a uniform sample has neither


def test_discrete_actions_are_int64():
    memory = ReplayMemory(10, obs_dim=(2, 3), act_dim=0)
    _fill(memory, 0, 3)
    obs, act, *_ = memory.sample_batch(4)
    assert obs.shape == (4, 2, 3)
    assert act.shape == (4,) and act.dtype == np.int64


def test_sampling_never_returns_unwritten_slots():
    memory = ReplayMemory(1000, obs_dim=1, act_dim=0, seed=1)
    _fill(memory, 1, 6)  # rewards 1..5; every unwritten slot holds reward 0
    _, _, reward, _, _ = memory.sample_batch(5000)
    assert set(reward.tolist()) == {1.0, 2.0, 3.0, 4.0, 5.0}


def test_ring_buffer_overwrites_the_oldest():
    memory = ReplayMemory(5, obs_dim=1, act_dim=0, seed=2)
    _fill(memory, 0, 12)
    assert memory.size() == 5
    _, _, reward, _, _ = memory.sample_batch(2000)
    assert set(reward.tolist()) == {7.0, 8.0, 9.0, 10.0, 11.0}


def test_empty_memory_cannot_be_sampled():
    with pytest.raises(ValueError, match="memory is empty"):
        ReplayMemory(5, 1, 0).sample_batch(1)
    with pytest.raises(ValueError, match="max_size=0 must be positive"):
        ReplayMemory(0, 1, 0)


def test_same_seed_same_batches():
    a, b = ReplayMemory(50, 2, 0, seed=3), ReplayMemory(50, 2, 0, seed=3)
    _fill(a, 0, 30), _fill(b, 0, 30)
    for x, y in zip(a.sample_batch(16), b.sample_batch(16), strict=True):
        np.testing.assert_array_equal(x, y)


def test_save_load_restores_exactly(tmp_path):
    original = ReplayMemory(8, obs_dim=3, act_dim=0)
    _fill(original, 0, 13)  # wrapped around: next slot to overwrite is 5
    original.save(tmp_path / "mem")
    restored = ReplayMemory(8, obs_dim=3, act_dim=0)
    restored.load(tmp_path / "mem")
    assert restored.size() == 8
    # Appending the same transitions afterwards yields identical buffers.
    _fill(original, 13, 16), _fill(restored, 13, 16)
    for name in ("obs", "act", "reward", "next_obs", "terminal"):
        np.testing.assert_array_equal(getattr(restored, name), getattr(original, name))


def test_load_into_a_smaller_memory_keeps_the_most_recent(tmp_path):
    original = ReplayMemory(8, obs_dim=1, act_dim=0)
    _fill(original, 0, 13)  # holds 5..12
    original.save(tmp_path / "mem.npz")
    small = ReplayMemory(3, obs_dim=1, act_dim=0, seed=0)
    small.load(tmp_path / "mem.npz")
    assert small.size() == 3
    assert small.reward.tolist() == [10.0, 11.0, 12.0]
    _fill(small, 13, 14)  # overwrites the oldest (10)
    assert sorted(small.reward.tolist()) == [11.0, 12.0, 13.0]


def test_load_rejects_other_shapes(tmp_path):
    original = ReplayMemory(4, obs_dim=3, act_dim=0)
    _fill(original, 0, 2)
    original.save(tmp_path / "mem")
    with pytest.raises(
        ValueError, match=r"'obs' .* has shape \(2, 3\), this memory stores \(2, 4\)"
    ):
        ReplayMemory(4, obs_dim=4, act_dim=0).load(tmp_path / "mem")

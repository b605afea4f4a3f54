"""`parl.utils.PrioritizedReplayMemory` and its `SumTree`: sums, sampling frequencies, weights."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parl.utils import PrioritizedBatch, PrioritizedReplayMemory
from parl.utils._prioritized_replay_memory import SumTree


@settings(max_examples=50, deadline=None)
@given(
    capacity=st.integers(1, 37),
    updates=st.lists(st.tuples(st.integers(0, 36), st.floats(0, 100)), max_size=60),
)
def test_sum_tree_matches_a_plain_array(capacity, updates):
    tree = SumTree(capacity)
    leaves = np.zeros(capacity)
    written = np.zeros(capacity, dtype=bool)
    for index, value in updates:
        index %= capacity
        tree.update(index, value)
        leaves[index] = value
        written[index] = True
    assert tree.total() == pytest.approx(leaves.sum())
    assert tree.min() == (leaves[written].min() if written.any() else np.inf)
    np.testing.assert_array_equal(tree[np.arange(capacity)], leaves)
    if leaves.sum() > 0:
        # Every prefix-sum query lands on the leaf whose cumulative interval contains it.
        cumulative = np.cumsum(leaves)
        mass = np.linspace(0, leaves.sum(), 50, endpoint=False)
        # A mass on a boundary between two leaves goes either way with the sums' rounding.
        gap = np.abs(mass[:, None] - cumulative[None, :]).min(axis=1)
        mass = mass[gap > 1e-9 * leaves.sum()]
        expected = np.searchsorted(cumulative, mass, side="right")
        np.testing.assert_array_equal(tree.find_prefix_sum(mass), expected)


def test_sum_tree_batched_update_with_repeated_indices():
    tree = SumTree(5)
    tree.update(np.array([0, 1, 1, 4]), np.array([1.0, 2.0, 3.0, 4.0]))
    assert tree.total() == pytest.approx(8.0)  # leaf 1 holds the last value, 3
    assert tree.min() == 1.0  # leaves never set do not count
    with pytest.raises(ValueError, match="finite and non-negative"):
        tree.update(0, -1.0)
    with pytest.raises(IndexError):
        tree.update(5, 1.0)


def _memory(n: int, **kwargs) -> PrioritizedReplayMemory:
    memory = PrioritizedReplayMemory(n, obs_dim=1, act_dim=0, seed=0, **kwargs)
    for i in range(n):
        memory.append([i], i, float(i), [i + 1], False)
    return memory


@pytest.mark.parametrize("stratified", [True, False])
def test_sampling_frequencies_follow_priorities_to_the_alpha(stratified):
    memory = _memory(4, alpha=0.5, stratified=stratified)
    memory.update_priorities(np.arange(4), np.array([1.0, 4.0, 9.0, 16.0]) - memory.eps)
    counts = np.zeros(4)
    for _ in range(400):
        *_, idx = memory.sample_batch(25)
        counts += np.bincount(idx, minlength=4)
    # p^0.5 = 1, 2, 3, 4: probabilities 0.1, 0.2, 0.3, 0.4.
    np.testing.assert_allclose(counts / counts.sum(), [0.1, 0.2, 0.3, 0.4], atol=0.01)


def test_a_stratified_batch_draws_once_from_each_segment_of_the_mass():
    # Equal priorities, batch_size = size: each segment holds exactly one transition, so a
    # stratified batch is every transition once; independent draws repeat some (for 64 of 64,
    # all distinct has probability 64! / 64**64, about 3e-27).
    stratified = _memory(64)
    independent = _memory(64, stratified=False)
    for _ in range(5):
        np.testing.assert_array_equal(np.sort(stratified.sample_batch(64).indices), np.arange(64))
        assert len(np.unique(independent.sample_batch(64).indices)) < 64


def test_importance_weights_are_normalised_by_the_rarest_transition():
    memory = _memory(3, alpha=1.0, weight_norm="memory")
    memory.update_priorities(np.arange(3), np.array([1.0, 2.0, 5.0]) - memory.eps)
    obs, act, _, next_obs, _, weights, idx = memory.sample_batch(64, beta=0.5)
    prob = np.array([1.0, 2.0, 5.0])[idx] / 8.0
    expected = (3 * prob) ** -0.5 / (3 * (1.0 / 8.0)) ** -0.5
    np.testing.assert_allclose(weights, expected, rtol=1e-6)
    assert weights.dtype == np.float32 and weights.max() <= 1.0
    # The fields stay one consistent transition per row.
    np.testing.assert_array_equal(obs[:, 0], idx)
    np.testing.assert_array_equal(act, idx)
    np.testing.assert_array_equal(next_obs[:, 0], idx + 1)


def test_batch_normalised_weights_have_the_batchs_rarest_transition_at_one():
    memory = _memory(3, alpha=1.0)  # weight_norm="batch", the default
    memory.update_priorities(np.arange(3), np.array([1.0, 2.0, 5.0]) - memory.eps)
    for _ in range(20):
        *_, weights, idx = memory.sample_batch(4, beta=0.5)
        prob = np.array([1.0, 2.0, 5.0])[idx] / 8.0
        expected = (3 * prob) ** -0.5 / (3 * prob.min()) ** -0.5
        np.testing.assert_allclose(weights, expected, rtol=1e-6)
        assert weights.max() == 1.0
    # One tiny priority anywhere in the memory shrinks every weight under "memory", none under
    # "batch" unless the batch drew it.
    by_memory, by_batch = _memory(1000, alpha=1.0, weight_norm="memory"), _memory(1000, alpha=1.0)
    for memory in (by_memory, by_batch):
        memory.update_priorities(np.array([0]), np.array([1e-4]))
    assert by_memory.sample_batch(8, beta=1.0).weights.max() < 1e-3
    assert by_batch.sample_batch(8, beta=1.0).weights.max() == 1.0
    with pytest.raises(ValueError, match="weight_norm='max' must be 'memory' or 'batch'"):
        _memory(2, weight_norm="max")


def test_a_batch_is_named_with_weights_and_indices():
    memory = _memory(5)
    batch = memory.sample_batch(8)
    assert isinstance(batch, PrioritizedBatch)
    obs, act, reward, next_obs, terminal, weights, indices = batch
    assert batch.obs is obs and batch.act is act and batch.reward is reward
    assert batch.next_obs is next_obs and batch.terminal is terminal
    assert batch.weights is weights and batch.indices is indices
    assert indices.dtype == np.int64 and weights.shape == (8,)
    np.testing.assert_array_equal(batch.obs[:, 0], batch.indices)


def test_beta_anneals_to_one_over_beta_steps():
    memory = _memory(4, alpha=1.0, beta=0.4, beta_steps=4)
    memory.update_priorities(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]) - memory.eps)
    betas = []
    for _ in range(6):
        betas.append(memory.current_beta())
        memory.sample_batch(4)
    np.testing.assert_allclose(betas, [0.4, 0.55, 0.7, 0.85, 1.0, 1.0])
    # At beta = 1 the weights fully correct: w_i = min_j P(j) / P(i).
    batch = memory.sample_batch(16)
    np.testing.assert_allclose(batch.weights, 1.0 / (batch.indices + 1.0), rtol=1e-6)
    assert _memory(4).current_beta() == 0.4  # without beta_steps it stays
    with pytest.raises(ValueError, match="beta_steps=0 must be positive"):
        PrioritizedReplayMemory(4, 1, 0, beta_steps=0)


def test_new_transitions_get_the_largest_priority_seen():
    memory = PrioritizedReplayMemory(10, obs_dim=1, act_dim=0, alpha=1.0, seed=0)
    memory.append([0], 0, 0.0, [0], False)
    memory.update_priorities([0], [7.0])
    memory.append([1], 1, 0.0, [1], False)
    np.testing.assert_allclose(memory.priorities(), [7.0 + memory.eps] * 2)


def test_sampling_only_returns_written_slots_after_wrapping():
    memory = _memory(8)
    for i in range(3):  # overwrite slots 0..2
        memory.append([100 + i], i, 0.0, [0], True)
    *_, idx = memory.sample_batch(256)
    assert idx.min() >= 0 and idx.max() < 8
    partial = PrioritizedReplayMemory(16, obs_dim=1, act_dim=0, seed=1)
    for i in range(5):
        partial.append([i], i, 0.0, [i], False)
    *_, idx = partial.sample_batch(256)
    assert set(idx.tolist()) <= set(range(5))


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="beta=1.5 must be in"):
        PrioritizedReplayMemory(4, 1, 0, beta=1.5)
    memory = _memory(4)
    with pytest.raises(IndexError, match="sample_batch returned"):
        memory.update_priorities([7], [1.0])
    with pytest.raises(ValueError, match="empty"):
        PrioritizedReplayMemory(4, 1, 0).sample_batch(2)


def test_save_and_load_keep_the_transitions_and_reprioritize(tmp_path):
    memory = _memory(6, alpha=1.0)
    memory.update_priorities(np.arange(6), np.arange(6) + 1.0)
    memory.save(tmp_path / "per")
    restored = PrioritizedReplayMemory(6, obs_dim=1, act_dim=0, alpha=1.0, seed=0)
    restored.load(tmp_path / "per.npz")
    assert len(restored) == 6
    np.testing.assert_array_equal(restored.obs, memory.obs)
    np.testing.assert_allclose(restored.priorities(), np.ones(6))
    *_, idx = restored.sample_batch(12)
    assert set(idx.tolist()) == set(range(6))  # stratified over equal priorities: all appear

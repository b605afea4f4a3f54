"""`parl.utils.OfflineDataset`: files, validation, sampling, and the other sources."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from parl.utils import Batch, OfflineDataset, ReplayMemory


def _arrays(n: int = 7, obs_dim: int = 3, act_dim: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    terminated = np.zeros(n, dtype=bool)
    truncated = np.zeros(n, dtype=bool)
    terminated[2] = True
    truncated[-1] = True
    return {
        "obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
        "action": rng.uniform(-1, 1, size=(n, act_dim)).astype(np.float32),
        "reward": np.arange(n, dtype=np.float32),
        "next_obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
        "terminated": terminated,
        "truncated": truncated,
    }


def test_save_and_load_round_trip_every_array(tmp_path):
    arrays = _arrays()
    dataset = OfflineDataset(**arrays)
    dataset.save(tmp_path / "data")  # the suffix is added
    loaded = OfflineDataset.load(tmp_path / "data.npz")
    assert len(loaded) == loaded.size() == 7
    for name, array in arrays.items():
        got = getattr(loaded, name)
        np.testing.assert_array_equal(got, array)
        assert got.dtype == array.dtype, name
    assert not list(tmp_path.glob(".parl-*"))  # no temporary file left behind
    assert "7 transitions" in repr(loaded)


def test_load_converts_numeric_flags_and_float64(tmp_path):
    arrays = _arrays()
    arrays["obs"] = arrays["obs"].astype(np.float64)
    arrays["next_obs"] = arrays["next_obs"].astype(np.float64)
    arrays["terminated"] = arrays["terminated"].astype(np.float32)
    arrays["truncated"] = arrays["truncated"].astype(np.int64)
    np.savez(tmp_path / "d.npz", **arrays)
    dataset = OfflineDataset.load(tmp_path / "d.npz")
    assert dataset.obs.dtype == dataset.next_obs.dtype == np.float32
    assert dataset.terminated.dtype == dataset.truncated.dtype == np.bool_
    np.testing.assert_array_equal(dataset.terminated, arrays["terminated"] == 1)


def test_discrete_actions_stay_integers():
    arrays = _arrays()
    arrays["action"] = np.arange(7, dtype=np.int32) % 3
    batch = OfflineDataset(**arrays).sample_batch(4)
    assert batch.act.dtype == np.int64 and batch.act.shape == (4,)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda a: a.pop("truncated"), r"missing \['truncated'\]"),
        (
            lambda a: a.update(actions=a.pop("action")),
            r"missing \['action'\], unexpected \['actions'\]",
        ),
        (lambda a: a.update(reward=a["reward"][:-1]), r"differ in length.*'reward': 6"),
        (lambda a: a.update(reward=a["reward"][:, None]), r"'reward' has shape \(7, 1\)"),
        (lambda a: a.update(next_obs=a["next_obs"][:, :2]), r"'next_obs' has shape \(7, 2\)"),
        (lambda a: a.update(obs=a["obs"].astype(str)), r"'obs' has dtype <U.*real numbers"),
        (lambda a: a.update(terminated=a["reward"]), r"'terminated' must hold only 0 and 1"),
        (lambda a: a.update(truncated=a["obs"][:, 0].astype(complex)), r"'truncated' has dtype"),
        (lambda a: a["reward"].__setitem__(3, np.nan), r"'reward' holds non-finite"),
        (lambda a: [a.update({k: v[:0]}) for k, v in list(a.items())], r"no transitions"),
    ],
)
def test_load_names_what_is_wrong(tmp_path, change, message):
    arrays = _arrays()
    change(arrays)
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=message) as info:
        OfflineDataset.load(tmp_path / "bad.npz")
    assert "bad.npz" in str(info.value)


def test_load_rejects_files_that_are_not_npz(tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match=r"junk.npz.*not a readable .npz"):
        OfflineDataset.load(tmp_path / "junk.npz")
    np.save(tmp_path / "one.npy", np.zeros(3))
    with pytest.raises(ValueError, match="holds one array"):
        OfflineDataset.load(tmp_path / "one.npy")
    np.savez(tmp_path / "objects.npz", obs=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match=r"objects.npz.*allow_pickle"):
        OfflineDataset.load(tmp_path / "objects.npz")
    with pytest.raises(FileNotFoundError):
        OfflineDataset.load(tmp_path / "absent.npz")


def test_constructor_validates_too():
    arrays = _arrays()
    arrays["action"] = arrays["action"][:3]
    with pytest.raises(ValueError, match=r"OfflineDataset: the arrays differ in length"):
        OfflineDataset(**arrays)


def test_sample_batch_is_a_named_batch_of_real_rows():
    arrays = _arrays(n=50)
    dataset = OfflineDataset(**arrays, seed=3)
    batch = dataset.sample_batch(64)
    assert isinstance(batch, Batch)
    assert batch._fields == ("obs", "act", "reward", "next_obs", "terminal")
    assert batch.obs.shape == (64, 3) and batch.act.shape == (64, 2)
    assert batch.terminal.dtype == np.float32 and batch.reward.dtype == np.float32
    rows = batch.reward.astype(int)  # reward i marks row i
    np.testing.assert_array_equal(batch.obs, arrays["obs"][rows])
    np.testing.assert_array_equal(batch.next_obs, arrays["next_obs"][rows])
    np.testing.assert_array_equal(batch.terminal, arrays["terminated"][rows])
    assert len(set(rows.tolist())) > 20  # spread over the dataset


def test_sample_batch_is_reproducible_from_a_seed_or_a_generator():
    arrays = _arrays(n=50)
    a = OfflineDataset(**arrays, seed=1).sample_batch(16).reward
    b = OfflineDataset(**arrays, seed=1).sample_batch(16).reward
    np.testing.assert_array_equal(a, b)
    dataset = OfflineDataset(**arrays)
    c = dataset.sample_batch(16, np.random.default_rng(5)).reward
    d = dataset.sample_batch(16, np.random.default_rng(5)).reward
    np.testing.assert_array_equal(c, d)
    with pytest.raises(ValueError, match="batch_size=0"):
        dataset.sample_batch(0)


def test_episode_returns_and_obs_statistics():
    dataset = OfflineDataset(**_arrays())  # rewards 0..6; ends after rows 2 and 6
    np.testing.assert_array_equal(dataset.episode_ends(), [2, 6])
    assert dataset.num_episodes() == 2
    np.testing.assert_allclose(dataset.episode_returns(), [0 + 1 + 2, 3 + 4 + 5 + 6])
    mean, std = dataset.obs_mean_std(eps=0.0)
    np.testing.assert_allclose(mean, dataset.obs.mean(0), rtol=1e-5)
    np.testing.assert_allclose(std, dataset.obs.std(0), rtol=1e-5)


def _filled_memory(max_size: int, steps: int) -> ReplayMemory:
    """Episodes of 4 steps; the second one terminates, the others are cut by a time limit."""
    memory = ReplayMemory(max_size, 2, 1, seed=0)
    obs, t = np.zeros(2), 0
    for step in range(steps):
        next_obs = np.array([step + 1.0, t + 1.0])
        ended = t == 3
        memory.append(obs, [step / 10], float(step), next_obs, ended and step // 4 == 1)
        obs, t = (np.array([100.0 + step, 0.0]), 0) if ended else (next_obs, t + 1)
    return memory


@pytest.mark.parametrize("max_size", [100, 10])  # room to spare, and a wrapped ring buffer
def test_from_replay_memory_recovers_order_and_episode_ends(max_size):
    memory = _filled_memory(max_size, 12)
    dataset = OfflineDataset.from_replay_memory(memory)
    first = 12 - len(dataset)
    assert len(dataset) == min(12, max_size)
    np.testing.assert_array_equal(dataset.reward, np.arange(first, 12))  # oldest first
    np.testing.assert_allclose(dataset.action[:, 0], np.arange(first, 12) / 10)
    ends = {3: "truncated", 7: "terminated", 11: "truncated"}
    for row, step in enumerate(range(first, 12)):
        assert dataset.terminated[row] == (ends.get(step) == "terminated"), step
        assert dataset.truncated[row] == (ends.get(step) == "truncated"), step
    with pytest.raises(ValueError, match="empty"):
        OfflineDataset.from_replay_memory(ReplayMemory(5, 2, 1))


def _episode(length: int, terminated: bool, offset: float = 0.0):
    return types.SimpleNamespace(
        observations=np.arange(length + 1, dtype=np.float32)[:, None] + offset,
        actions=np.zeros((length, 1), dtype=np.float32),
        rewards=np.ones(length),
        terminations=np.array([False] * (length - 1) + [terminated]),
        truncations=np.zeros(length, dtype=bool),
    )


def test_from_episodes_pairs_each_observation_with_the_next():
    dataset = OfflineDataset.from_episodes([_episode(3, True), _episode(2, False, offset=10)])
    np.testing.assert_array_equal(dataset.obs[:, 0], [0, 1, 2, 10, 11])
    np.testing.assert_array_equal(dataset.next_obs[:, 0], [1, 2, 3, 11, 12])
    np.testing.assert_array_equal(dataset.terminated, [0, 0, 1, 0, 0])
    np.testing.assert_array_equal(dataset.truncated, [0, 0, 0, 0, 1])  # unfinished: cut
    np.testing.assert_array_equal(dataset.episode_returns(), [3, 2])
    bad = _episode(3, True)
    bad.observations = bad.observations[:-1]
    with pytest.raises(ValueError, match="episode 0 has 3 observations for 3 actions"):
        OfflineDataset.from_episodes([bad])
    structured = _episode(2, True)
    structured.observations = {"a": np.zeros(3)}
    with pytest.raises(ValueError, match="structured"):
        OfflineDataset.from_episodes([structured])
    with pytest.raises(ValueError, match="no episodes"):
        OfflineDataset.from_episodes([])


def test_from_minari_without_minari_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "minari", None)  # as if absent, whatever is installed
    with pytest.raises(ImportError, match="pip install minari"):
        OfflineDataset.from_minari("D4RL/pen/human-v2")


class _Countdown:
    """A gymnasium-style environment: the observation counts down from 3; it terminates at 0,
    or is truncated after 2 steps when started from `reset(seed=1)`'s odd seeds."""

    def __init__(self):
        self.limit = None

    def reset(self, seed=None):
        self.t, self.limit = 0, (2 if seed == 1 else None)
        self.x = 3.0
        return np.array([self.x]), {}

    def step(self, action):
        self.x -= 1.0
        self.t += 1
        terminated = self.x == 0
        truncated = self.limit is not None and self.t >= self.limit and not terminated
        return np.array([self.x]), float(action[0]), terminated, truncated, {}


def test_collect_keeps_each_step_and_episode_end():
    dataset = OfflineDataset.collect(
        _Countdown(), lambda obs: np.array([obs[0]]), episodes=2, seed=1
    )
    np.testing.assert_array_equal(dataset.obs[:, 0], [3, 2, 3, 2, 1])
    np.testing.assert_array_equal(dataset.next_obs[:, 0], [2, 1, 2, 1, 0])
    np.testing.assert_array_equal(dataset.terminated, [0, 0, 0, 0, 1])
    np.testing.assert_array_equal(dataset.truncated, [0, 1, 0, 0, 0])
    np.testing.assert_array_equal(dataset.episode_returns(), [5, 6])
    with pytest.raises(ValueError, match="episodes=0"):
        OfflineDataset.collect(_Countdown(), lambda obs: obs, episodes=0)

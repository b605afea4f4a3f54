"""Seeded noise: names regenerate the same bits in any process; the shared table."""

from __future__ import annotations

import os
import pickle
import textwrap

import numpy as np
import pytest

from parl_evo import (
    ConfigError,
    NoiseTable,
    NoiseTableError,
    SamplingInfo,
    SeedNoise,
)
from parl_evo import _noise as noise_module
from tests.conftest import run_python

# The first values of each source, pinned bit for bit (float32 bit patterns): if numpy ever
# changed PCG64's normal transform, samplers and learners on different versions would disagree,
# and this test would say so.
SEED_NOISE_12345_FIRST = [0xBF9BA749, 0xBEBD196E, 0x3FEEDD35, 0xBE63445A]  # -1.216, -0.369, ...
TABLE_SEED_7_FIRST = [0x3FC2CFE4, 0xBF92720F, 0x3F93387F, 0xBFE46F84]  # 1.522, -1.144, ...


def bits(array):
    return [int(v) for v in np.asarray(array, dtype="<f4").view("<u4")]


def test_sampling_info_is_small_validated_and_picklable():
    info = SamplingInfo(np.uint64(2**64 - 1), -1, np.int64(3))
    assert info == SamplingInfo(2**64 - 1, -1, 3)
    assert type(info.key) is int and type(info.version) is int
    assert pickle.loads(pickle.dumps(info)) == info
    assert len(pickle.dumps(info)) < 120
    assert info.mirrored() == SamplingInfo(2**64 - 1, 1, 3)
    with pytest.raises(ValueError, match="sign=0 must be 1 or -1"):
        SamplingInfo(1, 0)
    with pytest.raises(ValueError, match="key=-1"):
        SamplingInfo(-1)
    with pytest.raises(TypeError, match="must be an int"):
        SamplingInfo(1.5)
    with pytest.raises(AttributeError):
        info.key = 3  # frozen


def test_seed_noise_is_pcg64_float32_and_pinned():
    noise = SeedNoise().noise(12345, 100_000)
    assert noise.dtype == np.float32 and noise.shape == (100_000,)
    assert bits(noise[:4]) == SEED_NOISE_12345_FIRST
    expected = np.random.Generator(np.random.PCG64(12345)).standard_normal(100_000, np.float32)
    assert noise.tobytes() == expected.tobytes()
    assert abs(float(noise.mean())) < 0.02 and abs(float(noise.std()) - 1) < 0.02
    assert SeedNoise().noise(12346, 10).tobytes() != SeedNoise().noise(12345, 10).tobytes()


def test_seed_noise_keys_are_63_bit_and_reproducible():
    keys = [SeedNoise().draw_key(np.random.default_rng(1), 10) for _ in range(2)]
    assert keys[0] == keys[1] and 0 <= keys[0] < 2**63


def test_noise_regenerates_bit_for_bit_in_another_process(noise_dir):
    infos = [SamplingInfo(2**63 + 17, -1, 0), SamplingInfo(5, 1, 2)]
    table = NoiseTable(seed=3, size=50_000, directory=noise_dir)
    here_seed = [SeedNoise().noise(i.key, 30_000).tobytes() for i in infos]
    here_table = [table.noise(k, 30_000).tobytes() for k in (0, 19_999)]
    code = textwrap.dedent(
        f"""
        import hashlib, pickle, sys
        from parl_evo import SeedNoise, NoiseTable
        infos = pickle.loads({pickle.dumps(infos)!r})
        table = pickle.loads({pickle.dumps(table)!r})
        for info in infos:
            print(hashlib.sha256(SeedNoise().noise(info.key, 30_000).tobytes()).hexdigest())
        for key in (0, 19_999):
            print(hashlib.sha256(table.noise(key, 30_000).tobytes()).hexdigest())
        print("torch" in sys.modules)
        """
    )
    inode = os.stat(table.path).st_ino
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert os.stat(table.path).st_ino == inode  # the other process mapped this file, not a new one
    import hashlib

    expected = [hashlib.sha256(b).hexdigest() for b in here_seed + here_table]
    assert result.stdout.split() == [*expected, "False"]


def test_table_is_the_seed_stream_built_in_chunks(noise_dir, monkeypatch):
    monkeypatch.setattr(noise_module, "_TABLE_BUILD_CHUNK", 1000)  # many chunks, one odd tail
    with NoiseTable(seed=7, size=4321, directory=noise_dir) as table:
        assert bits(table.table[:4]) == TABLE_SEED_7_FIRST
        # The table is the seed source's vector for key=seed: two generators, one stream.
        assert table.table.tobytes() == SeedNoise().noise(7, 4321).tobytes()
        assert table.noise(100, 5).tobytes() == table.table[100:105].tobytes()
        table.verify()


def test_table_is_one_shared_read_only_file(noise_dir):
    first = NoiseTable(seed=1, size=10_000, directory=noise_dir)
    files = os.listdir(noise_dir)
    assert files == [os.path.basename(first.path)]  # no temporary left behind
    second = NoiseTable(seed=1, size=10_000, directory=noise_dir, verify=True)
    assert second.path == first.path and second == first
    assert np.shares_memory(first.noise(0, 10), first.table)  # a slice, not a copy
    with pytest.raises(ValueError, match="read-only"):
        second.table[0] = 1.0
    other = NoiseTable(seed=2, size=10_000, directory=noise_dir)
    assert other != first and len(os.listdir(noise_dir)) == 2
    for table in (first, second, other):
        table.close()
    assert len(os.listdir(noise_dir)) == 2  # close() unmaps; the files stay for others


def test_table_owner_cleans_up_and_mappings_survive_unlink(noise_dir):
    owner = NoiseTable(seed=4, size=1000, directory=noise_dir, cleanup=True)
    user = NoiseTable(seed=4, size=1000, directory=noise_dir)
    before = user.noise(10, 20).copy()
    owner.close()
    assert os.listdir(noise_dir) == []
    assert user.noise(10, 20).tobytes() == before.tobytes()  # still mapped
    user.close()
    with pytest.raises(ValueError, match="is closed"):
        user.noise(0, 1)


def test_table_keys_stay_inside_and_dim_must_fit(noise_dir):
    table = NoiseTable(seed=5, size=100, directory=noise_dir)
    rng = np.random.default_rng(0)
    keys = [table.draw_key(rng, 90) for _ in range(200)]
    assert min(keys) >= 0 and max(keys) <= 10 and len(set(keys)) == 11
    with pytest.raises(ConfigError, match="cache_size to at least 101"):
        table.draw_key(rng, 101)
    with pytest.raises(ValueError, match="key=11 is not an offset"):
        table.noise(11, 90)


def test_damaged_table_file_is_reported_with_the_fix(noise_dir):
    table = NoiseTable(seed=6, size=1000, directory=noise_dir)
    path = table.path
    table.close()
    with open(path, "r+b") as f:  # flip a data byte: only the checksum notices
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0xFF]))
    NoiseTable(seed=6, size=1000, directory=noise_dir).close()  # header fine: maps
    with pytest.raises(NoiseTableError, match="fails its checksum.*delete the file"):
        NoiseTable(seed=6, size=1000, directory=noise_dir, verify=True)
    with open(path, "r+b") as f:
        f.truncate(500)
    with pytest.raises(NoiseTableError, match="has 500 bytes.*delete it"):
        NoiseTable(seed=6, size=1000, directory=noise_dir)
    with open(path, "wb") as f:
        f.write(b"x" * 4064)
    with pytest.raises(NoiseTableError, match="is not a format-1 noise table"):
        NoiseTable(seed=6, size=1000, directory=noise_dir)


def test_table_arguments_are_checked(noise_dir):
    with pytest.raises(ConfigError, match="size=0 must be positive"):
        NoiseTable(seed=1, size=0, directory=noise_dir)
    with pytest.raises(ConfigError, match="seed=-1"):
        NoiseTable(seed=-1, size=10, directory=noise_dir)


def test_a_table_that_cannot_be_built_says_where_and_what_to_do(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    with pytest.raises(NoiseTableError, match="could not build the noise table.*directory="):
        NoiseTable(seed=1, size=10, directory=blocker / "sub")

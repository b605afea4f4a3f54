"""The sample log: round trips, many writers, and clear errors for damaged files."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from parl_evo import (
    ESAgent,
    SampleLogCorruptError,
    SampleLogError,
    SampleLogTruncatedError,
    SampleLogWriter,
    SamplingInfo,
    SolverStateError,
    read_sample_log,
)
from tests.conftest import run_python
from tests.evo.conftest import rosenbrock

RECORD = 33  # 8-byte record head + 25-byte payload
CONFIG = {
    "seed": 11,
    "solver": {"type": "BASIC_ES", "population_size": 8, "weight_decay": 0.001},
    "gaussian_sampling": {"std": 0.05},
    "optimizer": {"type": "Adam", "base_lr": 0.01},
}


def infos_and_rewards(count=8, seed=0):
    agent = ESAgent(CONFIG, model=np.zeros(12))
    sampler = agent.clone()
    infos = [sampler.add_noise() for _ in range(count)]
    rewards = [-rosenbrock(agent.solver.candidate(i)) for i in infos]
    return infos, rewards


def write_log(path, infos, rewards, meta=None):
    with SampleLogWriter(path, meta=meta or {"dim": 12}) as log:
        for info, reward in zip(infos, rewards, strict=True):
            log.append(info, reward)


def test_round_trip_is_exact(tmp_path):
    path = tmp_path / "samples.log"
    infos = [SamplingInfo(2**64 - 1, -1, 7), SamplingInfo(0, 1, 0), SamplingInfo(99, 1, 2**62)]
    rewards = [-1e300, 0.1, float(np.nextafter(1.0, 2.0))]
    write_log(path, infos, rewards, meta={"dim": 12, "noise": {"kind": "seed"}})
    batch = read_sample_log(path)
    assert batch.infos == infos
    assert batch.rewards.tolist() == rewards
    assert batch.meta == {"dim": 12, "noise": {"kind": "seed"}}
    assert os.path.getsize(path) == batch.end
    # Resume from `end`: only what was appended since.
    write_log(path, infos[:1], [5.0], meta={"dim": 12, "noise": {"kind": "seed"}})
    later = read_sample_log(path, start=batch.end)
    assert later.infos == infos[:1] and later.rewards.tolist() == [5.0]
    assert read_sample_log(path, start=later.end).infos == []


def test_offline_update_in_another_process_equals_in_memory(tmp_path):
    infos, rewards = infos_and_rewards()
    learner = ESAgent(CONFIG, model=np.zeros(12))
    with ESAgent(CONFIG, model=np.zeros(12)).open_log(tmp_path / "samples.log") as log:
        log.extend(infos, rewards)
    code = textwrap.dedent(
        f"""
        import hashlib
        import numpy as np
        from parl_evo import ESAgent
        agent = ESAgent({CONFIG!r}, model=np.zeros(12))
        stats, end = agent.update_from_log({str(tmp_path / "samples.log")!r})
        print(stats.used, end, hashlib.sha256(agent.get_weights().tobytes()).hexdigest())
        """
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    learner.update(infos, rewards)
    used, end, digest = result.stdout.split()
    assert used == "8" and int(end) == os.path.getsize(tmp_path / "samples.log")
    assert digest == hashlib.sha256(learner.get_weights().tobytes()).hexdigest()


def test_many_processes_append_to_one_log(tmp_path):
    path = tmp_path / "shared.log"
    writer = textwrap.dedent(
        f"""
        import sys
        from parl_evo import SampleLogWriter, SamplingInfo
        base = int(sys.argv[1])
        with SampleLogWriter({str(path)!r}, meta={{"dim": 3}}) as log:
            for i in range(300):
                log.append(SamplingInfo(base + i, 1, 0), float(base + i))
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", writer, str(base)], stderr=subprocess.PIPE)
        for base in (0, 1000, 2000)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    batch = read_sample_log(path)
    keys = [info.key for info in batch.infos]
    assert sorted(keys) == [b + i for b in (0, 1000, 2000) for i in range(300)]
    for base in (0, 1000, 2000):  # each writer's records stay in its order
        mine = [k for k in keys if base <= k < base + 1000]
        assert mine == sorted(mine)
    assert batch.rewards.tolist() == [float(k) for k in keys]


def test_truncated_log_names_file_and_record(tmp_path):
    path = tmp_path / "cut.log"
    infos, rewards = infos_and_rewards(5)
    write_log(path, infos, rewards)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - 10)
    with pytest.raises(SampleLogTruncatedError) as err:
        read_sample_log(path)
    message = str(err.value)
    assert str(path) in message and "record 4 (byte" in message
    assert f"truncate the file to {size - RECORD} bytes" in message
    batch = read_sample_log(path, allow_partial_tail=True)
    assert batch.infos == infos[:4] and batch.end == size - RECORD
    with open(path, "r+b") as f:
        f.truncate(10)
    with pytest.raises(SampleLogTruncatedError, match="ends inside the header"):
        read_sample_log(path)


def test_corrupt_records_name_file_record_and_byte(tmp_path):
    path = tmp_path / "bad.log"
    infos, rewards = infos_and_rewards(4)
    write_log(path, infos, rewards)
    size = os.path.getsize(path)
    first = size - 4 * RECORD
    with open(path, "r+b") as f:  # flip a bit of the reward of record 2
        f.seek(first + 2 * RECORD + 10)
        byte = f.read(1)
        f.seek(first + 2 * RECORD + 10)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(SampleLogCorruptError) as err:
        read_sample_log(path)
    message = str(err.value)
    assert f"{path}: record 2 (byte {first + 2 * RECORD}): checksum mismatch" in message
    with open(path, "r+b") as f:  # a wrong length field in record 1
        f.seek(first + RECORD)
        f.write((999).to_bytes(4, "little"))
    with pytest.raises(SampleLogCorruptError, match=r"record 1 .* length field is 999"):
        read_sample_log(path)
    with open(path, "r+b") as f:
        f.write(b"NOTALOG!")
    with pytest.raises(SampleLogCorruptError, match="not a sample log"):
        read_sample_log(path)


def test_a_log_refuses_samples_of_another_setup(tmp_path):
    path = tmp_path / "samples.log"
    agent = ESAgent(CONFIG, model=np.zeros(12))
    agent.open_log(path).close()
    with pytest.raises(SampleLogError, match="write to a new log file"):
        ESAgent(CONFIG, model=np.zeros(13)).open_log(path)
    cma = ESAgent({**CONFIG, "solver": {"type": "CMA_ES"}}, model=np.zeros(12))
    with pytest.raises(SolverStateError, match="update from a log written by samplers of this"):
        cma.update_from_log(path)

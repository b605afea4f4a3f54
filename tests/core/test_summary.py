"""`parl.utils.summary`: real TensorBoard event files, read back with TensorBoard's own reader."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader

from parl.utils import _event_file, summary
from parl.utils.summary import SummaryWriter


def _load(logdir) -> EventAccumulator:
    acc = EventAccumulator(os.fspath(logdir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def test_crc32c_known_answer():
    assert _event_file.crc32c(b"123456789") == 0xE3069283
    assert _event_file.crc32c(b"") == 0


def test_scalars_read_back(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        for step in range(5):
            writer.add_scalar("train/loss", 1.0 / (step + 1), step)
        writer.add_scalar("eval/return", np.float64(475.5), 1000)
        writer.add_scalar("eval/return", torch.tensor(500.0), 2000)
        writer.add_scalar("neg/step", 3.0, -7)
    acc = _load(tmp_path)
    assert set(acc.Tags()["scalars"]) == {"train/loss", "eval/return", "neg/step"}
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [0, 1, 2, 3, 4]
    assert [e.value for e in loss] == pytest.approx([1, 1 / 2, 1 / 3, 1 / 4, 1 / 5], rel=1e-6)
    assert [(e.step, e.value) for e in acc.Scalars("eval/return")] == [(1000, 475.5), (2000, 500.0)]
    assert acc.Scalars("neg/step")[0].step == -7


def test_every_record_passes_tensorboards_checksum_check(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        writer.add_scalar("a", 1.0, 1)
        writer.add_histogram("h", np.arange(1000), 1)
    (path,) = glob.glob(os.path.join(tmp_path, "events.out.tfevents.*"))
    records = list(RawEventFileLoader(path).Load())
    assert len(records) == 3  # the file-version header, then the two events

    # A flipped payload byte must be caught: corrupt the last record and read again.
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[-6] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))
    assert len(list(RawEventFileLoader(path).Load())) < 3


def test_histograms_read_back(tmp_path):
    values = np.random.default_rng(0).normal(size=10_000)
    with SummaryWriter(tmp_path) as writer:
        writer.add_histogram("weights", values, 3, bins=30)
        writer.add_histogram("weights", torch.arange(10.0), 4)
    acc = _load(tmp_path)
    first, second = acc.Histograms("weights")
    histo = first.histogram_value
    assert first.step == 3
    assert histo.num == 10_000
    assert histo.min == pytest.approx(values.min()) and histo.max == pytest.approx(values.max())
    assert histo.sum == pytest.approx(values.sum())
    assert histo.sum_squares == pytest.approx((values**2).sum())
    assert len(histo.bucket) == 30 and sum(histo.bucket) == 10_000
    assert histo.bucket_limit[-1] == pytest.approx(values.max())
    assert second.histogram_value.num == 10


def test_histogram_rejects_bad_values(tmp_path):
    with SummaryWriter(tmp_path) as writer:
        with pytest.raises(ValueError, match="'h' has NaN"):
            writer.add_histogram("h", [1.0, float("nan")], 0)
        with pytest.raises(ValueError, match="'h' got no values"):
            writer.add_histogram("h", [], 0)
        with pytest.raises(ValueError, match="non-empty string"):
            writer.add_scalar("", 1.0, 0)


def test_closed_writer_refuses_writes(tmp_path):
    writer = SummaryWriter(tmp_path)
    writer.close()
    with pytest.raises(ValueError, match="is closed"):
        writer.add_scalar("x", 1.0, 0)


def test_module_level_api(tmp_path):
    summary.set_dir(tmp_path / "run")
    try:
        assert summary.get_dir() == os.fspath(tmp_path / "run")
        summary.add_scalar("rollout/return", 10.0, 100)
        summary.add_histogram("rollout/actions", [0, 1, 1, 0, 1], 100)
        summary.flush()
        acc = _load(tmp_path / "run")
        assert acc.Scalars("rollout/return")[0].value == 10.0
        assert acc.Histograms("rollout/actions")[0].histogram_value.num == 5
    finally:
        summary.close()

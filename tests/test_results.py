"""The result files in `benchmarks/results/` follow their format, and the writer keeps it."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import sys

import pytest

from tests.conftest import REPO_ROOT


def _results():
    path = os.path.join(REPO_ROOT, "benchmarks", "_results.py")
    spec = importlib.util.spec_from_file_location("_results", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


RESULT_FILES = sorted(glob.glob(os.path.join(REPO_ROOT, "benchmarks", "results", "*.json")))


def test_there_are_result_files():
    assert len(RESULT_FILES) >= 4, RESULT_FILES


@pytest.mark.parametrize("path", RESULT_FILES, ids=os.path.basename)
def test_every_result_file_follows_the_format(path):
    results = _results()
    data = results.load(os.path.basename(path)[: -len(".json")])
    assert data["rows"] or data["history"], path
    for row in data["rows"]:
        assert row["machine"]["cores"] >= 1
        assert row["date"][:4].isdigit() and row["date"][4] == "-", row["date"]


def test_record_writes_a_row_and_replaces_the_same_claim(tmp_path):
    results = _results()

    def row(ours, peer_value, task="CartPole-v1"):
        return results.Row(
            task=task,
            algorithm="PPO",
            metric="env steps to a training mean of 475",
            better="lower",
            ours=ours,
            peer="Stable-Baselines3 2.9.2 PPO",
            peer_value=peer_value,
            seeds=[1, 2, 3],
            command="python benchmarks/learning.py --tasks ppo --baseline sb3",
        )

    path = results.record("learning", [row(30_000, 20_000)], directory=str(tmp_path))
    assert path == str(tmp_path / "learning.json")
    results.record(
        "learning", [row(10_000, 20_000), row(5, 10, "Acrobot-v1")], directory=str(tmp_path)
    )
    data = json.loads((tmp_path / "learning.json").read_text())
    assert [(r["task"], r["ours"], r["ratio"]) for r in data["rows"]] == [
        ("CartPole-v1", 10_000, 0.5),
        ("Acrobot-v1", 5, 0.5),
    ]
    machine = results.machine()
    assert data["rows"][0]["machine"] == machine and machine["cpu"] and machine["cores"] >= 1


def test_a_ratio_alone_is_a_row_and_no_figure_at_all_is_refused():
    results = _results()
    kwargs = dict(
        task="ALE Pong-v5",
        algorithm="ParallelSampler 2x8",
        metric="env steps per second, relative to the peer",
        better="higher",
        peer="gymnasium SyncVectorEnv",
        seeds=[],
        command="python benchmarks/samplers.py",
    )
    assert results.Row(ours=None, peer_value=None, ratio=1.8, **kwargs).to_json()["ratio"] == 1.8
    with pytest.raises(ValueError, match="give ours and peer_value, or ratio"):
        results.Row(ours=None, peer_value=None, **kwargs)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"better": "faster"}, "better='faster', not one of"),
        ({"ratio": 2.0}, "ratio 2.0 is not ours / peer_value"),
        ({"seeds": "1-3"}, "row 0 needs 'seeds'"),
        ({"ours": None}, "give both figures, or neither"),
    ],
)
def test_a_broken_row_is_named(change, message):
    row = {
        "task": "CartPole-v1",
        "algorithm": "PPO",
        "metric": "env steps",
        "better": "lower",
        "ours": 1.0,
        "peer": "SB3",
        "peer_value": 2.0,
        "ratio": 0.5,
        "seeds": [1],
        "machine": {"cpu": "x", "cores": 2},
        "date": "2026-11-24",
        "command": "python benchmarks/learning.py",
    }
    with pytest.raises(ValueError, match=message):
        _results().validate({"title": "t", "rows": [{**row, **change}]}, "t.json")


def test_a_name_that_is_not_a_file_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="name='../x' must be letters"):
        _results().load("../x", str(tmp_path))

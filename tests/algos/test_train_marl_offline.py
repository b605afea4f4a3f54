"""`parl-train` runs of the multi-agent configs: their sync mode on a real cluster, resume.

Each run is the real command's `main` in a process of its own (`train_cli.parl_train`) with a
budget of a few hundred env steps; the sync runs start an embedded cluster of real processes
on 127.0.0.1.
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from parl_algos.qmix import QMixer, VDNMixer
from parl_algos.train import SPECS, apply_override, latest_checkpoint, load_config
from parl_algos.train._marl_actors import EnvGroup, EnvGroups

from .test_train_runs import PARL_TRAIN, parl_train, rows, small_args


def test_list_shows_the_multi_agent_sync_modes():
    proc = subprocess.run([PARL_TRAIN, "--list"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    for name in ("maddpg/simple_spread", "mappo/simple_spread", "qmix/simple_spread"):
        assert lines[name].split()[-3:] == ["modes:", "single", "sync"]


def built(name: str, *overrides: tuple[str, str]):
    """The algorithm `parl-train NAME --key value ...` trains."""
    config = load_config(name)
    for key, text in overrides:
        apply_override(config, key, text)
    return SPECS[config.algorithm].build(config, None, None).agent.alg


def test_the_multi_agent_options_reach_the_algorithm():
    mappo = built("mappo/simple_spread")
    assert mappo.value_normalizer is None and mappo.critic_optimizer is None
    mappo = built(
        "mappo/simple_spread", ("agent.value_norm", "true"), ("agent.separate_optimizers", "true")
    )
    assert mappo.value_normalizer is not None and mappo.critic_optimizer is not None
    mixers = {m: built("qmix/simple_spread", ("agent.mixer", m)).mixer for m in ("qmix", "vdn")}
    assert isinstance(mixers["qmix"], QMixer) and isinstance(mixers["vdn"], VDNMixer)
    assert built("qmix/simple_spread", ("agent.mixer", "none")).mixer is None


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("qmix/simple_spread", ["--agent.mixer", "none"]),
        (
            "mappo/simple_spread",
            ["--agent.value_norm", "true", "--agent.separate_optimizers", "true"],
        ),
    ],
)
def test_the_multi_agent_options_train(name, options, tmp_path):
    """Independent Q-learners; MAPPO with the paper's value normalisation and optimisers."""
    args = [*small_args(name), "--train.total_steps", "300", *options]
    proc = parl_train(name, "--logdir", str(tmp_path), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = rows(tmp_path)
    assert int(written[-1]["env_step"]) >= 300
    assert any(r["mean_return"] for r in written)


def test_env_groups_in_this_process_step_as_one_group_of_every_env():
    env = load_config("mappo/simple_spread").env
    groups, whole = EnvGroups(env, 3), EnvGroup(env, 3)
    try:
        seeds = [5, 6, 7]
        for a, b in zip(groups.reset(seeds), whole.reset(seeds), strict=True):
            np.testing.assert_array_equal(a, b)
        actions = np.random.default_rng(0).integers(0, 5, (3, 3))
        stepped, expected = groups.step(actions), whole.step(actions)
        assert [x.shape for x in stepped] == [(3, 3, 18), (3, 54), (3, 3), (3,), (3,)]
        for a, b in zip(stepped, expected, strict=True):
            np.testing.assert_array_equal(a, b)
        with pytest.raises(ValueError, match="2 actions for 3 envs"):
            whole.step(actions[:2])
    finally:
        groups.close()
        whole.close()


def test_env_groups_reset_the_environments_they_are_told_to():
    env = load_config("maddpg/simple_spread").env
    groups, one = EnvGroups(env, 3), EnvGroup(env, 1)
    try:
        obs, state = groups.reset([1, 2, 3])
        again, again_state = groups.reset([9, 2], [0, 2])
        assert again.shape == (2, *obs.shape[1:]) and again_state.shape == (2, state.shape[1])
        np.testing.assert_array_equal(again[0], one.reset([9])[0][0])
        np.testing.assert_array_equal(again[1], one.reset([2])[0][0])
        with pytest.raises(ValueError, match="distinct increasing indices"):
            groups.reset([1, 2], [2, 0])
        with pytest.raises(ValueError, match="distinct increasing indices"):
            groups.reset([1], [3])
        with pytest.raises(ValueError, match="1 seeds for 2 envs"):
            one.reset([1], [0, 0])
    finally:
        groups.close()
        one.close()


@pytest.mark.parametrize(
    "name", ["maddpg/simple_spread", "mappo/simple_spread", "qmix/simple_spread"]
)
def test_sync_mode_on_actors_writes_the_rows_of_single_mode(name, tmp_path):
    """Three environments on two actors of an embedded cluster: the same seeds, the same
    actions, so the same rows (the timing column aside) as the run in one process."""
    args = [*small_args(name), "--agent.num_envs", "3", "--train.total_steps", "300"]
    written = {}
    for mode in ("single", "sync"):
        logdir = tmp_path / mode
        proc = parl_train(name, "--mode", mode, "--actors", "2", "--logdir", str(logdir), *args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        written[mode] = [{k: v for k, v in r.items() if k != "seconds"} for r in rows(logdir)]
    assert written["sync"] == written["single"]
    assert int(written["sync"][-1]["env_step"]) >= 300
    assert all(r["mean_return"] for r in written["sync"][1:])  # MADDPG's first: step 3


@pytest.mark.parametrize("name", ["mappo/simple_spread", "qmix/simple_spread"])
def test_multi_agent_runs_resume_from_a_periodic_checkpoint_with_the_same_rows(name, tmp_path):
    """As after `kill -9`: the rows past the last checkpoint are dropped and written again."""
    whole = tmp_path / "whole"
    args = ["--train.total_steps", "400", *small_args(name), "--train.checkpoint_every", "150"]
    proc = parl_train(name, "--logdir", str(whole), *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    crashed = tmp_path / "crashed"
    shutil.copytree(whole, crashed)
    shutil.rmtree(latest_checkpoint(str(crashed)))  # the run died before its last checkpoint
    resume_from = int(latest_checkpoint(str(crashed)).rsplit("-", 1)[1])
    assert resume_from < int(rows(whole)[-1]["env_step"])
    proc = parl_train("--resume", str(crashed))
    assert proc.returncode == 0, proc.stderr[-3000:]

    def without_time(logdir):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rows(logdir)]

    assert without_time(crashed) == without_time(whole)
    assert any(r["mean_return"] for r in rows(whole))
    assert f"resumed {crashed}" in (crashed / "log.log").read_text()

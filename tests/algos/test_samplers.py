"""The samplers' stepping rules, checked on `SerialSampler` against environments replayed by hand.

Seeding (`seed + k` on the first reset of column `k`), same-step autoreset with unseeded later
resets, `final_obs`, shapes and dtypes, and the episode records; the samplers on a cluster
(tests/algos/test_samplers_remote.py) must return the very same batches.
"""

from __future__ import annotations

import functools
import os
import sys

import gymnasium as gym
import numpy as np
import pytest

import parl
from parl.samplers import Batch, SerialSampler

# CartPole with a short time limit and a poor balancer (LinearAgent's default weights):
# episodes end both ways, terminated and truncated, within a few collects.
ENV_FN = functools.partial(gym.make, "CartPole-v1", max_episode_steps=10)


class LinearAgent:
    """A deterministic agent: each row's action depends on that row alone (numpy, no torch)."""

    def __init__(self, obs_dim: int = 4, n_actions: int = 2, scale: float = -1.0) -> None:
        w = np.linspace(-1.0, 1.0, obs_dim * n_actions, dtype=np.float32)
        self.w = (w.reshape(obs_dim, n_actions) * scale).astype(np.float32)

    def sample(self, obs):
        scores = (obs[:, :, None] * self.w[None]).sum(axis=1)
        return scores.argmax(axis=1), {"scores": scores}

    def get_weights(self):
        return {"w": self.w.copy()}

    def set_weights(self, weights) -> None:
        self.w = np.array(weights["w"], dtype=np.float32)


def replay_column(batches: list[Batch], k: int, seed: int) -> None:
    """Step a fresh environment with column `k`'s actions; every recorded value must match."""
    env = ENV_FN()
    obs, _ = env.reset(seed=seed + k)
    for batch in batches:
        for t in range(len(batch.actions)):
            np.testing.assert_array_equal(batch.obs[t, k], obs)
            obs, reward, terminated, truncated, _ = env.step(int(batch.actions[t, k]))
            assert batch.rewards[t, k] == reward
            assert batch.terminated[t, k] == terminated and batch.truncated[t, k] == truncated
            if terminated or truncated:
                np.testing.assert_array_equal(batch.final_obs[(t, k)], obs)
                obs, _ = env.reset()  # later resets are unseeded
            else:
                assert (t, k) not in batch.final_obs
        np.testing.assert_array_equal(batch.next_obs[k], obs)


def test_parl_samplers_is_the_parl_algos_module():
    import parl_algos.samplers

    assert parl.samplers is parl_algos.samplers
    assert Batch is parl_algos.samplers.Batch


def test_serial_batches_have_the_documented_shapes_and_dtypes():
    with SerialSampler(ENV_FN, LinearAgent(), num_workers=2, envs_per_worker=3, horizon=5) as s:
        batch = s.collect()
    assert isinstance(batch, Batch)
    assert batch.obs.shape == (5, 6, 4) and batch.obs.dtype == np.float32
    assert batch.actions.shape == (5, 6) and batch.actions.dtype == np.int64
    assert batch.rewards.shape == (5, 6) and batch.rewards.dtype == np.float32
    assert batch.terminated.dtype == bool and batch.truncated.dtype == bool
    assert batch.terminated.shape == batch.truncated.shape == (5, 6)
    assert batch.next_obs.shape == (6, 4) and batch.next_obs.dtype == np.float32
    assert batch.extras["scores"].shape == (5, 6, 2)
    assert batch.worker is None and batch.weights_version is None


def test_serial_seeds_columns_apart_and_resets_in_the_same_step():
    seed = 7
    with SerialSampler(ENV_FN, LinearAgent(), num_workers=2, envs_per_worker=2, horizon=9) as s:
        batches = [s.collect() for _ in range(4)]  # 36 steps: every column ends episodes
    for k in range(4):
        replay_column(batches, k, 0)
    assert sum(len(b.final_obs) for b in batches) >= 4
    assert any(b.truncated.any() for b in batches) and any(b.terminated.any() for b in batches)
    firsts = {tuple(batches[0].obs[0, k]) for k in range(4)}
    assert len(firsts) == 4  # every column started from its own seed
    with SerialSampler(ENV_FN, LinearAgent(), 1, 1, 3, seed=seed) as other:
        replay_column([other.collect()], 0, seed)


def test_consecutive_collects_continue_the_same_episodes():
    with SerialSampler(ENV_FN, LinearAgent(), num_workers=1, envs_per_worker=2, horizon=4) as s:
        first, second = s.collect(), s.collect()
    np.testing.assert_array_equal(second.obs[0], first.next_obs)


def test_episodes_are_dated_by_the_samplers_env_steps():
    with SerialSampler(ENV_FN, LinearAgent(), num_workers=2, envs_per_worker=2, horizon=10) as s:
        batches = [s.collect() for _ in range(3)]
        episodes = s.episodes()
        assert s.episodes() == []  # each episode is reported once
        assert s.env_steps == 3 * 10 * 4
    expected = []
    for i, batch in enumerate(batches):
        done = batch.terminated | batch.truncated
        for t, k in zip(*np.nonzero(done), strict=True):
            expected.append((i * 40 + (t + 1) * 4, k))
    assert [e.env_step for e in episodes] == [step for step, _ in expected]
    assert all(e.length >= 1 and e.ret == e.length for e in episodes)  # CartPole: +1 a step
    assert all(e.length <= 10 for e in episodes)


def test_actions_take_the_action_spaces_dtype_and_shape():
    class FloatActions(LinearAgent):
        def sample(self, obs):
            return np.ones((len(obs), 1), dtype=np.float64) * 0.5  # no extras

    env_fn = functools.partial(gym.make, "Pendulum-v1")
    with SerialSampler(env_fn, FloatActions(obs_dim=3), 1, 2, horizon=3) as s:
        batch = s.collect()
    assert batch.actions.shape == (3, 2, 1) and batch.actions.dtype == np.float32
    assert batch.extras == {}


def test_bad_arguments_and_a_closed_sampler_say_what_was_wrong():
    with pytest.raises(ValueError, match="num_workers=0"):
        SerialSampler(ENV_FN, LinearAgent(), num_workers=0)
    with pytest.raises(TypeError, match="sample"):
        SerialSampler(ENV_FN, object())

    class WrongShape(LinearAgent):
        def sample(self, obs):
            return np.zeros(len(obs) + 1, dtype=np.int64)

    with (
        SerialSampler(ENV_FN, WrongShape(), 1, 2, 3) as s,
        pytest.raises(ValueError, match="shape"),
    ):
        s.collect()
    s.close()  # again: nothing happens
    with pytest.raises(RuntimeError, match="closed"):
        s.collect()


def test_a_batch_becomes_the_trajectory_the_on_policy_agents_learn_from():
    env_fn = functools.partial(gym.make, "CartPole-v1", max_episode_steps=8)  # mostly truncated
    with SerialSampler(env_fn, LinearAgent(), num_workers=2, envs_per_worker=2, horizon=36) as s:
        batch = s.collect()
    trajectory = batch.to_trajectory()
    assert trajectory.obs.shape == (37, 4, 4)
    np.testing.assert_array_equal(trajectory.obs[:-1], batch.obs)
    np.testing.assert_array_equal(trajectory.obs[-1], batch.next_obs)
    assert not (trajectory.truncated & trajectory.terminated).any()
    truncated = [tuple(int(x) for x in i) for i in trajectory.final_index]
    only = [k for k in batch.final_obs if batch.truncated[k] and not batch.terminated[k]]
    assert truncated and truncated == only
    for (t, k), obs in zip(truncated, trajectory.final_obs, strict=True):
        np.testing.assert_array_equal(obs, batch.final_obs[(t, k)])
    np.testing.assert_array_equal(trajectory.extras["scores"], batch.extras["scores"])


def test_named_segments_of_a_killed_owner_are_swept(tmp_path):
    import os
    import subprocess

    from parl_remote.shm import sweep_dead_owners
    from parl_remote.wire._segment import SHM_DIR

    if not os.access(SHM_DIR, os.W_OK):
        pytest.skip("no writable /dev/shm on this machine")
    # A process that made a named segment (as earlier versions did) and was killed with
    # SIGKILL before it could remove it.
    make = (
        "import os, secrets; name = f'parl-sampler-{os.getpid()}-{secrets.token_hex(8)}'; "
        "fd = os.open(os.path.join('/dev/shm', name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600); "
        "os.ftruncate(fd, 16); print(name, flush=True)"
    )
    code = make + "; import signal; os.kill(os.getpid(), signal.SIGKILL)"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    name = proc.stdout.strip()
    assert proc.returncode == -9 and name and os.path.exists(os.path.join(SHM_DIR, name))
    mine = f"parl-sampler-{os.getpid()}-{os.urandom(8).hex()}"  # a live owner's segment stays
    with open(os.path.join(SHM_DIR, mine), "wb"):
        pass
    try:
        assert name in sweep_dead_owners()
        assert not os.path.exists(os.path.join(SHM_DIR, name))
        assert os.path.exists(os.path.join(SHM_DIR, mine))
    finally:
        os.unlink(os.path.join(SHM_DIR, mine))


def test_a_step_signal_checks_its_token_and_reads_a_gone_peer_as_closed():
    from parl_remote.shm import SignalClosed, SignalListener, connect_signal

    listener = SignalListener(backlog=3)
    try:
        if sys.platform.startswith("linux"):  # a name in no file system
            assert listener.path.startswith("\0parl-signal-")
        else:
            assert os.stat(listener.path).st_mode & 0o777 == 0o600
            assert os.stat(os.path.dirname(listener.path)).st_mode & 0o777 == 0o700
        with pytest.raises(ValueError, match="16 bytes"):
            connect_signal(listener.path, b"short", 0, timeout=1.0)
        impostor = connect_signal(listener.path, bytes(16), 0, timeout=1.0)  # a wrong token
        stranger = connect_signal(listener.path, listener.token, 7, timeout=1.0)  # not expected
        worker = connect_signal(listener.path, listener.token, 1, timeout=1.0)
        signals = listener.accept({1}, timeout=5.0, signal_timeout=0.2)
        assert list(signals) == [1]
        sampler = signals[1]
        with pytest.raises(SignalClosed):
            impostor.recv()  # dropped by the listener
        sampler.send(b"s")
        assert worker.recv() == b"s"
        worker.send(b"r")
        assert sampler.recv() == b"r"
        with pytest.raises(SignalClosed, match="no signal within 0.2 s"):
            sampler.recv()  # a bounded wait
        worker.close()  # the worker's process is gone
        with pytest.raises(SignalClosed, match="closed"):
            sampler.recv()
        for signal in (impostor, stranger, sampler):
            signal.close()
    finally:
        listener.close()
    assert not os.path.exists(os.path.dirname(listener.path) or listener.path)
    with pytest.raises(OSError):  # the name is free again: nobody listens
        connect_signal(listener.path, listener.token, 1, timeout=1.0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract socket names: Linux")
def test_a_signal_listener_killed_before_its_peers_came_leaves_nothing():
    import signal
    import subprocess
    import tempfile

    from parl_remote.shm import connect_signal

    def ours():
        return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("parl-signal-")}

    before = ours()
    code = (
        "import sys, time; from parl_remote.shm import SignalListener; "
        "listener = SignalListener(2); "
        "sys.stdout.write(listener.path.encode('unicode_escape').decode() + ' ' + "
        "listener.token.hex() + chr(10)); sys.stdout.flush(); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        path, token = line[0].encode().decode("unicode_escape"), bytes.fromhex(line[1])
        connect_signal(path, token, 0, timeout=1.0).close()  # listening, one peer of two in
    finally:
        proc.send_signal(signal.SIGKILL)  # the window: not every peer has connected
        proc.wait(10)
        proc.stdout.close()
    assert ours() == before
    with pytest.raises(OSError):  # its name went with its socket
        connect_signal(path, token, 1, timeout=1.0)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0,
    reason="a peer of another user: needs Linux and root to change users",
)
def test_a_signal_listener_drops_a_peer_of_another_user_even_with_the_token():
    import threading

    from parl_remote.shm import SignalListener, connect_signal

    listener = SignalListener(backlog=2)
    try:
        pid = os.fork()
        if pid == 0:  # a process of another user, with the right token: dropped (status 0)
            status = 2
            try:
                os.setuid(65534)
                connect_signal(listener.path, listener.token, 1, timeout=10.0).recv()
                status = 1
            except OSError as exc:  # SignalClosed, or its hello refused (a broken pipe)
                status = 1 if "no signal within" in str(exc) else 0  # dropped: closed, reset
            finally:
                os._exit(status)
        accepted = {}
        accepting = threading.Thread(
            target=lambda: accepted.update(listener.accept({1}, 30.0, 1.0)), daemon=True
        )
        accepting.start()
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        mine = connect_signal(listener.path, listener.token, 1, timeout=1.0)  # this user's
        accepting.join(30)
        assert list(accepted) == [1]
        mine.close()
        accepted[1].close()
    finally:
        listener.close()


@pytest.mark.skipif(
    not __import__("parl_remote.shm").shm.flags_available(),
    reason="step flags are used on Linux x86-64 only",
)
def test_step_flags_wake_a_sleeper_bound_their_waits_and_see_a_gone_peer():
    import socket
    import threading

    from parl_remote.shm import FLAG_BYTES, FlagSignal, Segment, Signal, SignalClosed

    segment = Segment.create(FLAG_BYTES)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    words = segment.buffer
    sampler = FlagSignal(Signal(a, 0.3), words, sampler=True, spin_s=20e-6)
    worker = FlagSignal(Signal(b, 10.0), words, sampler=False, spin_s=20e-6)
    try:
        sampler.send(b"s")
        assert worker.recv() == b"s"
        worker.send(b"r")
        assert sampler.recv() == b"r"
        sampler.send(b"a")
        assert worker.recv() == b"a"
        late = threading.Timer(0.1, worker.send, (b"r",))  # past the spin: a sleeper woken
        late.start()
        assert sampler.recv() == b"r"
        late.join(timeout=10)
        with pytest.raises(SignalClosed, match="no signal within 0.3 s"):
            sampler.recv()  # a bounded wait
        worker.close()  # the worker's process is gone: its socket reads as end-of-file
        with pytest.raises(SignalClosed, match="closed"):
            sampler.recv()
        with pytest.raises(SignalClosed, match="closed"):
            worker.send(b"r")
    finally:
        sampler.close()
        worker.close()
        segment.close()


@pytest.mark.skipif(
    not __import__("parl_remote.shm").shm.flags_available(),
    reason="step flags are used on Linux x86-64 only",
)
def test_step_flags_spin_about_as_long_as_the_other_side_usually_takes():
    import socket

    from parl_remote.shm import FLAG_BYTES, SPIN_FLOOR_S, FlagSignal, Segment, Signal

    segment = Segment.create(FLAG_BYTES)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    words = segment.buffer
    sampler = FlagSignal(Signal(a, 10.0), words, sampler=True, spin_s=1e-3)
    worker = FlagSignal(Signal(b, 10.0), words, sampler=False, spin_s=50e-6, adaptive=False)
    try:
        assert sampler.spin_budget() == SPIN_FLOOR_S  # nothing waited for yet
        sampler.usual_wait_s = 200e-6  # the workers usually take 0.2 ms: spin past that
        assert 200e-6 < sampler.spin_budget() <= 1e-3
        sampler.usual_wait_s = 5e-3  # longer than the longest spin: sleep almost at once
        assert sampler.spin_budget() == SPIN_FLOOR_S
        for _ in range(40):  # bytes already there when asked for: the usual wait falls
            worker.send(b"r")
            assert sampler.recv() == b"r"
        assert sampler.usual_wait_s < 1e-4
        assert sampler.spin_budget() < 200e-6
        assert worker.spin_budget() == 50e-6  # not adaptive: always its own spin
        worker.usual_wait_s = 1.0
        assert worker.spin_budget() == 50e-6
    finally:
        sampler.close()
        worker.close()
        segment.close()


def test_short_slice_asks_for_short_slices_inside_and_restores_the_threads_own():
    from parl_remote.wire._signal import (
        _SCHED_ATTR,
        _SCHED_CALLS,
        SHORT_SLICE_NS,
        _sched_attr,
        short_slice,
    )

    call = _SCHED_CALLS.get(__import__("platform").machine())
    before = _sched_attr(call) if sys.platform == "linux" else None
    if before is None:  # elsewhere the block just runs
        with short_slice():
            pass
        pytest.skip("no sched_getattr here")
    with short_slice():
        inside = _sched_attr(call)
    slices = _SCHED_ATTR.unpack(before)[5] != 0  # sched_runtime: Linux 6.12+ reports the slice
    assert _SCHED_ATTR.unpack(inside)[5] == (SHORT_SLICE_NS if slices else 0)
    assert _SCHED_ATTR.unpack(inside)[3] == _SCHED_ATTR.unpack(before)[3]  # the nice value kept
    assert _sched_attr(call) == before

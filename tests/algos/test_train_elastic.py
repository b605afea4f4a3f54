"""`parl-train` survives the actors that die under it (`train.restart_actors`, the default).

Each test runs the real command in a subprocess on CartPole whose actor's process is killed
with SIGKILL once during the run (`failing_env.KilledOnce`): a sampling actor of PPO's sync and
async modes, of DQN's async mode, of GA3C's central predictor, one of A3C's gradient actors and
of R2D2's actors, and the evaluator. The run exits 0, its rows of progress.csv go on past the
fault with strictly increasing env steps, the last counting the replaced actor, and log.log
has the replacement's line. With `train.restart_actors = false` the first death ends the run.
A run on a cluster of two workers survives its master killed and started again on the same
port, and the loss of a whole worker with its actors meanwhile, and still reaches 475. A
multi-agent run's environment actor killed mid-run is replaced too (`EnvGroups`), its lost
step's environments starting new episodes that the loop is told of.
"""

from __future__ import annotations

import csv
import logging
import os
import re
import signal
import subprocess
import time

import numpy as np
import psutil
import pytest

import parl
from parl.samplers import Replacements
from parl_algos.train import load_config
from parl_algos.train._marl_actors import EnvGroup, EnvGroups
from tests.algos.test_train_failures import PARL_TRAIN, ROOT
from tests.remote.conftest import make_cluster, run_script, wait_until

KILLED_ONCE = "tests.algos.failing_env:KilledOnce-v0"
SMALL = ["--no-progress", "--train.log_every", "256", "--train.checkpoint_every", "100000"]
RUNS = {
    "ppo-sync": ["ppo/cartpole", "--mode", "sync", "--train.total_steps", "3072"],
    # Async runs on one actor: a replacement is made on its worker's waiter thread while the
    # run goes on with the other workers, so with two a short run can end before it is ready;
    # with one, the run's every step after the fault is the replacement's.
    "ppo-async": [
        *["ppo/cartpole", "--mode", "async", "--actors", "1", "--train.total_steps", "3072"],
    ],
    "dqn-async": [
        "dqn/cartpole",
        "--mode",
        "async",
        *["--actors", "1"],
        "--train.total_steps",
        "2560",
        "--agent.learning_starts",
        "256",
        "--agent.gradient_steps",
        "8",
    ],
    "ga3c-sync": ["ga3c/cartpole", "--mode", "sync", "--train.total_steps", "3200"],
    "ga3c-async": ["ga3c/cartpole", "--mode", "async", "--train.total_steps", "3200"],
    # One actor: the run's every step after the fault is the replacement's.
    "a3c-async": [
        "a3c/cartpole",
        "--mode",
        "async",
        *["--actors", "1"],
        "--train.total_steps",
        "3200",
    ],
    "r2d2-async": [
        "r2d2/cartpole-masked",
        "--mode",
        "async",
        *["--actors", "1", "--train.total_steps", "2000"],
        *["--agent.learning_starts", "4", "--agent.batch_size", "8"],
        *["--agent.updates_per_collect", "2"],
    ],
}


def parl_train(
    tmp_path, argv: list[str], kill_at: int, kill_in: str = "sampler"
) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
        "PARL_TEST_KILL_AT": str(kill_at),
        "PARL_TEST_KILL_IN": kill_in,
        "PARL_TEST_KILL_MARK": str(tmp_path / "killed"),
        "PARL_TEST_SPARE_PARENT": str(os.getpid()),  # the learner's parent: never killed
    }
    command = [PARL_TRAIN, *argv, "--env.id", KILLED_ONCE, "--logdir", str(tmp_path / "run")]
    result = subprocess.run(command, capture_output=True, timeout=240, env=env, cwd=ROOT)
    result.stdout, result.stderr = result.stdout.decode(), result.stderr.decode()
    return result


def rows(tmp_path) -> list[dict[str, str]]:
    with open(tmp_path / "run" / "progress.csv", newline="") as f:
        return list(csv.DictReader(f))


def assert_went_on(tmp_path, result) -> None:
    """The run ended well past the fault: rows before and after it, the replacement logged."""
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "killed").exists()  # the actor was killed
    written = rows(tmp_path)
    steps = [int(r["env_step"]) for r in written]
    assert steps == sorted(set(steps))  # strictly increasing through the fault
    restarts = [int(r["actor_restarts"]) for r in written]
    assert restarts[0] == 0 and restarts[-1] == 1 and restarts == sorted(restarts)
    assert restarts.count(1) >= 2  # rows go on after the replacement
    log = (tmp_path / "run" / "log.log").read_text()
    evaluator = re.search(r"the evaluator \(pid \d+ on [^)]+\) died", log)
    assert ("SIGKILL" in log and "; replaced in" in log) or evaluator, log[-3000:]


# PPO's two modes and DQN's async mode run in the default suite; the loops of GA3C, A3C and R2D2
# (the same replacement, other actors) in the slow suite, to keep the default one short.
FAST_RUNS = ("ppo-sync", "ppo-async", "dqn-async")
# The env step of the killed actor's environment at which it dies: after the run's first row.
# DQN async's first row comes at 256 env steps of the run, when its one worker's environments
# are at step 256 or below; a warm spare replaces an actor killed before it, so it dies at 400.
# PPO async's first row waits for a 32-step rollout of its worker, which may run its second (to
# step 64) meanwhile: step 80 is in a third, which starts only after the first is read.
KILL_AT = {"dqn-async": 400, "ppo-async": 80}


@pytest.mark.parametrize(
    "run", [r if r in FAST_RUNS else pytest.param(r, marks=pytest.mark.slow) for r in RUNS]
)
def test_a_sampling_actor_killed_mid_run_is_replaced_and_the_run_goes_on(tmp_path, run):
    argv = [*RUNS[run], *SMALL, "--train.eval_every", "0"]
    result = parl_train(tmp_path, argv, kill_at=KILL_AT.get(run, 60))
    assert_went_on(tmp_path, result)
    log = (tmp_path / "run" / "log.log").read_text()
    assert re.search(r"(worker|actor) \d+ .*died", log), log[-3000:]  # the sampling actor


def test_a_killed_evaluator_is_replaced_and_the_run_goes_on(tmp_path):
    argv = [*RUNS["ppo-sync"], *SMALL, "--train.eval_every", "512", "--train.eval_episodes", "1"]
    result = parl_train(tmp_path, argv, kill_at=5, kill_in="evaluator")
    assert_went_on(tmp_path, result)
    log = (tmp_path / "run" / "log.log").read_text()
    assert re.search(r"the evaluator \(pid \d+ on [^)]+\) died: .*SIGKILL.*; replaced in", log), log


_EMBEDDED_CLUSTER = """
import time

import psutil

from parl_algos.train import load_config
from parl_algos.train._envs import connect

config = load_config("ppo/cartpole")
config.train.actors = 1
connect(config)  # the run's embedded cluster, and no actor on it
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    for proc in psutil.Process().children(recursive=True):
        try:
            with open(f"/proc/{proc.pid}/maps") as f:
                if "libtorch_cpu" in f.read():
                    print("TORCH IN", " ".join(proc.cmdline()))
                    raise SystemExit(0)
        except OSError:  # gone meanwhile
            pass
    time.sleep(0.2)
print("NO PROCESS OF THE CLUSTER IMPORTED TORCH")
"""


def test_an_embedded_clusters_warm_processes_import_torch_before_any_actor_asks():
    """The spare that replaces a lost actor is ready without a second of importing torch."""
    result = run_script(_EMBEDDED_CLUSTER, {**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert "TORCH IN" in result.stdout, result.stdout + result.stderr[-3000:]
    assert "parl_remote.actor._host" in result.stdout  # a warm actor process


@pytest.mark.slow  # the library's restart=False is tested in the default suite
def test_without_restarts_the_first_death_ends_the_run(tmp_path):
    argv = [*RUNS["ppo-sync"], *SMALL, "--train.eval_every", "0", "--train.restart_actors", "false"]
    result = parl_train(tmp_path, argv, kill_at=120)
    assert result.returncode == 1
    assert "an actor died" in result.stderr and "killed by SIGKILL" in result.stderr


def _rows_of(run_dir) -> list[dict[str, str]]:
    try:
        with open(run_dir / "progress.csv", newline="") as f:
            return list(csv.DictReader(f))
    except FileNotFoundError:
        return []


@pytest.mark.slow
def test_a_run_survives_its_master_restarting_and_a_whole_worker_lost_and_still_reaches_475(
    tmp_path,
):
    """PPO sync on a cluster of two workers: once the run has rows, its master is killed, and
    while it is down so is a worker that runs one of its actors, with every actor process under
    that worker; the master then comes back on the same port. The lost actors are placed again
    on the other worker once the master is back, and the run goes on to 475 within its budget.
    """
    cluster = make_cluster(tmp_path, workers=(2, 2), PARL_HEARTBEAT_S=0.2)
    run_dir = tmp_path / "run"
    env = {
        **cluster.env,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
        "PARL_HEARTBEAT_S": "0.2",
    }
    command = [
        PARL_TRAIN, "ppo/cartpole", "--mode", "sync", "--address", cluster.address,
        "--train.eval_every", "0", "--train.stop_at_target", "true",
        "--no-progress", "--logdir", str(run_dir),
    ]  # fmt: skip
    run = subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_until(
            lambda: len(_rows_of(run_dir)) >= 2 or run.poll() is not None,
            timeout=180,
            what="the run's rows",
        )
        assert run.poll() is None, run.communicate()[1][-3000:]
        status = cluster.status()
        [hosting, *_] = [a["worker_id"] for a in status["actors"] if a["class_name"] == "EnvWorker"]
        [victim] = [w["pid"] for w in status["workers"] if w["worker_id"] == hosting]
        before = len(_rows_of(run_dir))
        os.kill(cluster.master.pid, signal.SIGKILL)
        cluster.master.stop()
        worker = psutil.Process(victim)
        for process in [worker, *worker.children(recursive=True)]:
            process.kill()
        time.sleep(3)  # the run finds its actor dead while the master is away
        cluster.start_master()  # the same port
        _, stderr = run.communicate(timeout=400)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
        cluster.stop()
    assert run.returncode == 0, stderr[-3000:]
    written = _rows_of(run_dir)
    steps = [int(r["env_step"]) for r in written]
    assert steps == sorted(set(steps)) and len(written) > before  # on past the faults
    assert int(written[-1]["actor_restarts"]) >= 1
    log = (run_dir / "log.log").read_text()
    took = [float(x) for x in re.findall(r"; replaced in ([\d.]+) s", log)]
    assert took and max(took) >= 2.0, log[-3000:]  # a replacement waited for the master
    done = log[log.rindex("done: RunResult(") :]
    reached = re.search(r"reached_at=(\w+)", done).group(1)
    assert reached != "None" and int(reached) <= 100_000, done  # 475 within the shipped budget


@pytest.mark.slow  # a cluster of its own, two actors killed: the default suite's budget is spent
def test_env_groups_replace_a_killed_group_and_name_its_new_episodes(caplog):
    """A multi-agent run's environments on two actors: one actor killed before a step is
    replaced; that step's rows of its environment are the new environment's first observations
    (from its own seed stream), named in `restarted`; the next death past max_restarts raises."""
    caplog.set_level(logging.WARNING, logger="parl_algos.samplers._group")
    env = load_config("maddpg/simple_spread").env
    parl.connect(cpu_num=3, log_to_driver=False)
    try:
        replacements = Replacements("MADDPG: actor {i}", 1, setting="train.max_restarts")
        groups = EnvGroups(env, 3, actors=2, replacements=replacements, seed=7)
        one = EnvGroup(env, 1)
        try:
            groups.reset([1, 2, 3])
            actions = np.zeros((3, 3), np.int64)
            groups.step(actions)
            assert groups.restarted == [] and groups.sizes == [2, 1]
            pid = groups.groups[1]._parl_ref.pid  # environment 2's actor
            os.kill(pid, signal.SIGKILL)
            obs, state, rewards, terminated, done = groups.step(actions)
            assert groups.restarted == [2] and groups.restarts == 1
            first_obs, first_state = one.reset([7 + 2 + 1_000_003])  # its first stream
            np.testing.assert_array_equal(obs[2], first_obs[0])
            np.testing.assert_array_equal(state[2], first_state[0])
            assert not rewards[2].any() and not terminated[2] and not done[2]
            assert obs.shape == (3, 3, 18) and rewards.shape == (3, 3)
            groups.step(actions)
            assert groups.restarted == []  # the new actor steps on
            os.kill(groups.groups[1]._parl_ref.pid, signal.SIGKILL)
            with pytest.raises(parl.RemoteActorDiedError, match="MADDPG: actor 1 died 2 times"):
                groups.step(actions)
        finally:
            groups.close()
            one.close()
    finally:
        parl.disconnect()
    # A set: where parl-train's main() ran in this process before, the library's records also
    # go to the `parl` logger, and the same record can reach the capture twice.
    [line] = {r.getMessage() for r in caplog.records if "replaced in" in r.getMessage()}
    assert line.startswith(f"MADDPG: actor 1 (pid {pid} on ") and "SIGKILL" in line, line


@pytest.mark.slow  # a cluster of its own and a multi-agent run: ~15 s on the loaded machine
def test_a_multi_agent_run_whose_env_actor_is_killed_goes_on(tmp_path):
    """MADDPG sync, its environments on two actors of a cluster: once the run has rows, one
    actor is killed with SIGKILL; the run replaces it and goes on to its budget."""
    cluster = make_cluster(tmp_path, workers=(3,))
    run_dir = tmp_path / "run"
    env = {**cluster.env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [
        PARL_TRAIN, "maddpg/simple_spread", "--mode", "sync", "--actors", "2",
        "--address", cluster.address, "--agent.num_envs", "2",
        "--agent.learning_starts", "100", "--agent.batch_size", "32",
        "--train.total_steps", "3000", "--train.log_every", "100",
        *["--train.eval_every", "0", "--train.checkpoint_every", "100000"],
        "--no-progress", "--logdir", str(run_dir),
    ]  # fmt: skip
    run = subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_until(
            lambda: len(_rows_of(run_dir)) >= 2 or run.poll() is not None,
            timeout=180,
            what="the run's rows",
        )
        assert run.poll() is None, run.communicate()[1][-3000:]
        [victim, *_] = [
            a["pid"] for a in cluster.status()["actors"] if a["class_name"] == "EnvGroup"
        ]
        os.kill(victim, signal.SIGKILL)
        _, stderr = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
        cluster.stop()
    assert run.returncode == 0, stderr[-3000:]
    written = _rows_of(run_dir)
    steps = [int(r["env_step"]) for r in written]
    assert steps == sorted(set(steps)) and steps[-1] >= 3000  # strictly increasing, to the end
    restarts = [int(r["actor_restarts"]) for r in written]
    assert restarts[0] == 0 and restarts[-1] == 1 and restarts == sorted(restarts)
    assert restarts.count(1) >= 2  # rows go on after the replacement
    log = (run_dir / "log.log").read_text()
    assert re.search(rf"MADDPG: actor \d \(pid {victim} on .*SIGKILL.*; replaced in", log), log

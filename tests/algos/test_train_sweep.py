"""`parl-train CONFIG --sweep SPACE.toml`: Optuna's study, trials as actors of a real cluster.

Every sweep here is PPO on CartPole with a budget of a few thousand env steps a trial, run by
the real command (forked from the test process's warm `parl-train`, or the executable itself
where the test kills it): the trials run as actors of the embedded cluster and their study
lives in a real SQLite file.
"""

from __future__ import annotations

import contextlib
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from parl_algos.train import ConfigError, load_config
from parl_algos.train._sweep import objective_of_rows, read_space
from tests.algos.train_cli import parl_train
from tests.remote.conftest import one_ray_at_a_time

ROOT = Path(__file__).resolve().parents[2]
PARL_TRAIN = str(Path(sys.executable).with_name("parl-train"))
TINY = [
    "--env.num_envs",
    "4",
    "--train.eval_every",
    "0",
    "--train.log_every",
    "256",
    "--no-progress",
]
"""Each trial: 4 CartPoles, no evaluations, a row every 256 env steps."""

SPACE = """
[space]
"agent.lr" = { log_uniform = [1e-4, 3e-3] }
"agent.clip_coef" = { uniform = [0.1, 0.3] }
"agent.update_epochs" = { int = [2, 6] }
"agent.n_steps" = { choice = [16, 32] }
[sweep]
objective = "auc"
sampler = "random"
pruner = "none"
"""


def _trials(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "trials.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _steps(run_dir: str | Path) -> list[int]:
    with open(Path(run_dir) / "progress.csv", newline="", encoding="utf-8") as f:
        return [int(row["env_step"]) for row in csv.DictReader(f)]


def _space(tmp_path: Path, text: str, name: str = "space.toml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_a_sweep_writes_its_trials_best_config_plot_and_storage(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = ["--sweep", _space(tmp_path, SPACE), "--trials", "4", "--parallel", "2"]
    proc = parl_train(
        "ppo/cartpole", *args, "--train.total_steps", "1536", *TINY, "--logdir", str(sweep_dir)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = _trials(sweep_dir)
    assert [t["number"] for t in trials] == ["0", "1", "2", "3"]
    assert {t["state"] for t in trials} == {"COMPLETE"}
    keys = ["agent.lr", "agent.clip_coef", "agent.update_epochs", "agent.n_steps"]
    assert list(trials[0]) == ["number", "state", "objective", *keys, "run_dir"]
    for t in trials:
        assert 1e-4 <= float(t["agent.lr"]) <= 3e-3 and t["agent.n_steps"] in ("16", "32")
        config = tomllib.loads((Path(t["run_dir"]) / "config.toml").read_text())
        assert config["agent"]["lr"] == float(t["agent.lr"])
        assert _steps(t["run_dir"])[-1] >= 1536  # a complete run directory, budget spent
        assert (Path(t["run_dir"]) / "agent.ckpt").is_file()
    best = max(trials, key=lambda t: float(t["objective"]))
    assert f"best trial {best['number']}" in proc.stdout
    assert (sweep_dir / "study.db").stat().st_size > 0
    assert (sweep_dir / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    best_config = tomllib.loads((sweep_dir / "best.toml").read_text())
    assert best_config["agent"]["lr"] == float(best["agent.lr"])
    assert best_config["agent"]["n_steps"] == int(best["agent.n_steps"])
    assert best_config["train"]["total_steps"] == 1536
    rerun = tmp_path / "best-run"
    proc = parl_train(str(sweep_dir / "best.toml"), "--logdir", str(rerun), "--no-progress")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _steps(rerun)[-1] >= 1536


@pytest.mark.slow  # two sweeps of several trials each
def test_a_sweep_killed_mid_trial_continues_with_the_same_command(tmp_path):
    sweep_dir = tmp_path / "sweep"
    argv = [
        "ppo/cartpole",
        "--sweep",
        _space(tmp_path, SPACE),
        "--trials",
        "2",
        "--parallel",
        "1",
        "--train.total_steps",
        "2048",
        *TINY,
        "--logdir",
        str(sweep_dir),
    ]
    second = sweep_dir / "trial-0001" / "progress.csv"
    with _command(argv, tmp_path) as child:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and child.poll() is None:
            if second.exists() and len(_steps(second.parent)) >= 3:
                break
            time.sleep(0.05)
        assert child.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert _steps(second.parent)[-1] < 2048  # killed mid-trial
    proc = parl_train(*argv)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 interrupted trial(s) run again" in proc.stdout
    trials = {t["number"]: t for t in _trials(sweep_dir)}
    assert [t["state"] for t in trials.values()] == ["COMPLETE", "FAIL", "COMPLETE"]
    keys = ["agent.lr", "agent.clip_coef", "agent.update_epochs", "agent.n_steps"]
    assert [trials["2"][k] for k in keys] == [trials["1"][k] for k in keys]  # run again
    for number in ("0", "2"):
        assert _steps(trials[number]["run_dir"])[-1] >= 2048


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def _command(
    argv: list[str], tmp_path: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """The real `parl-train ARGV`, its output in tmp_path's stdout and stderr, in a session of
    its own: on the way out, it and whatever it started are stopped by their ids."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(env or {})}
    with open(tmp_path / "stdout", "wb") as stdout, open(tmp_path / "stderr", "wb") as stderr:
        child = subprocess.Popen(
            [PARL_TRAIN, *argv], stdout=stdout, stderr=stderr, env=env, start_new_session=True
        )
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if _group_alive(child.pid):  # what the sweep started, if any outlived it
            os.killpg(child.pid, signal.SIGKILL)


PRUNED = """
[space]
"agent.lr" = { choice = [3e-3, 1e-9] }
"agent.clip_coef" = { choice = [0.1, 0.2] }
[sweep]
objective = "final"
sampler = "grid"
pruner = "median"
startup_trials = 1
"""


def _actors_holding(pid: int, paths: list[Path]) -> dict[Path, int]:
    """The pid of the actor process under `pid` that holds each of `paths` open, if any."""
    import psutil

    held = {}
    for p in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            opened = {f.path for f in p.open_files()}
            for path in paths:
                if str(path) in opened:
                    held[path] = p.pid
    return held


@pytest.mark.slow  # a sweep of 4 trials of 2 seeds each
def test_a_trials_seeds_run_side_by_side_and_pruned_trials_stop_before_their_budget(tmp_path):
    """A learning rate of 1e-9 does not learn: the median pruner stops such a trial, both of
    its seeds (they run side by side, each in an actor of its own)."""
    sweep_dir = tmp_path / "sweep"
    args = ["--sweep", _space(tmp_path, PRUNED), "--trials", "4", "--parallel", "1"]
    args += ["--seeds", "2", "--train.total_steps", "4096", "--train.checkpoint_every", "1024"]
    argv = ["ppo/cartpole", *args, *TINY, "--logdir", str(sweep_dir)]
    logs = [sweep_dir / "trial-0000" / f"seed-{seed}" / "log.log" for seed in (1, 2)]
    side_by_side: dict[Path, int] = {}
    with _command(argv, tmp_path) as child:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and child.poll() is None and len(side_by_side) < 2:
            side_by_side = _actors_holding(child.pid, logs)
            time.sleep(0.05)
        assert child.wait(timeout=300) == 0, (tmp_path / "stderr").read_text()[-3000:]
    assert len(set(side_by_side.values())) == 2, side_by_side  # two actors at once
    trials = _trials(sweep_dir)
    assert len(trials) == 4
    pruned = [t for t in trials if t["state"] == "PRUNED"]
    assert pruned and all(float(t["agent.lr"]) == 1e-9 for t in pruned)
    for t in pruned:  # each seed stopped at a checkpoint before the budget
        for seed in (1, 2):
            assert _steps(Path(t["run_dir"]) / f"seed-{seed}")[-1] in (1024, 2048, 3072)
    for t in trials:
        if t["state"] == "COMPLETE":
            for seed in (1, 2):
                assert _steps(Path(t["run_dir"]) / f"seed-{seed}")[-1] >= 4096


@pytest.mark.parametrize(
    ("space", "named"),
    [
        ('"agent.learning_rate" = { uniform = [0.1, 0.2] }', "agent.learning_rate"),
        ('"agnt.lr" = { uniform = [0.1, 0.2] }', "agnt.lr"),
        ('"agent.n_steps" = { uniform = [16.0, 64.0] }', "agent.n_steps"),
        ('"agent.lr" = { int = [1, 3] }', "agent.lr"),
        ('"agent.lr" = { choice = ["fast", "slow"] }', "agent.lr"),
        ('"agent.lr" = { log_uniform = [1e-2, 1e-4] }', "agent.lr"),
        ('"agent.update_epochs" = { int = [5, 5] }', "agent.update_epochs"),
        ('"agent.lr" = { log_uniform = [0.0, 1e-2] }', "agent.lr"),
        ('"agent.lr" = { choice = [] }', "agent.lr"),
        ('"agent.lr" = { normal = [0.0, 1.0] }', "agent.lr"),
        ('"train.seed" = { int = [1, 9] }', "train.seed"),
        ('"agent.lr" = { uniform = [1e-4, 1e-2] }\n[sweep]\nsampler = "grid"', "agent.lr"),
        ('"agent.lr" = { uniform = [1e-4, 1e-2] }\n[sweep]\npruner = "hyperband"', "pruner"),
        ('"agent.lr" = { uniform = [1e-4, 1e-2] }\n[sweep]\nobjective = "max"', "objective"),
        ('"agent.lr" = { uniform = [1e-4, 1e-2] }\n[sweep]\nstartup = 1', "sweep.startup"),
    ],
)
def test_a_bad_space_is_refused_naming_the_key(space, named, tmp_path):
    path = _space(tmp_path, f"[space]\n{space}\n")
    with pytest.raises(ConfigError, match=re.escape(named)) as raised:
        read_space(path, load_config("ppo/cartpole"))
    assert "\n" not in str(raised.value)


def test_a_bad_space_stops_the_command_before_any_trial(tmp_path):
    sweep_dir = tmp_path / "sweep"
    path = _space(tmp_path, '[space]\n"agent.n_steps" = { int = [64, 16] }\n')
    proc = parl_train("ppo/cartpole", "--sweep", path, "--trials", "2", "--logdir", str(sweep_dir))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [
        f"parl-train: error: {path}: agent.n_steps: the range [64, 16] is empty (LOW < HIGH)"
    ]
    assert not sweep_dir.exists()


def test_a_sweep_without_optuna_names_the_extra_to_install(tmp_path):
    code = (
        "import sys\n"
        "sys.modules['optuna'] = None  # not installed\n"
        "from parl_algos.train import main\n"
        "sys.exit(main())\n"
    )
    argv = ["ppo/cartpole", "--sweep", _space(tmp_path, SPACE), "--trials", "2"]
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv, "--logdir", str(tmp_path / "sweep")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "parl-train: error: --sweep needs optuna: pip install 'parl-algos[sweep]'"
    ]


def test_the_objectives_of_progress_rows():
    rows = [(256, None), (512, 20.0), (768, 60.0), (1024, 40.0)]
    assert objective_of_rows(rows, "final", target=None, budget=1024) == 40.0
    assert objective_of_rows(rows, "auc", target=None, budget=1024) == 40.0
    assert objective_of_rows(rows, "steps_to_target", target=50.0, budget=1024) == 768.0
    assert objective_of_rows(rows, "steps_to_target", target=90.0, budget=1024) == 1024.0
    assert objective_of_rows([(256, None)], "final", target=None, budget=1024) is None


def test_a_trial_whose_heartbeat_stopped_is_failed_and_asked_again(tmp_path):
    """A trial left running on another host: its driver's pid says nothing here, its heartbeat
    does (its actor, or the host, went)."""
    import optuna

    from parl_algos.train._sweep import _DRIVER, _experimental, _requeue_orphans, _storage

    storage = _storage(f"sqlite:///{tmp_path / 'study.db'}", grace_s=1)
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    lr = optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)
    with _experimental():
        running, beating = study.ask({"agent.lr": lr}), study.ask({"agent.lr": lr})
    study_id = storage.get_study_id_from_name("s")
    for trial in (running, beating):
        trial.set_user_attr(_DRIVER, {"host": "another-host", "pid": 1})
        storage.record_heartbeat(
            storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        )
    assert _requeue_orphans(study) == 0  # both beat within the grace period
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _requeue_orphans(study) == 0:
        storage.record_heartbeat(  # the other one's actor is still there
            storage.get_trial_id_from_study_id_trial_number(study_id, beating.number)
        )
        time.sleep(0.5)
    states = {t.number: t.state.name for t in study.get_trials()}
    assert states == {0: "FAIL", 1: "RUNNING", 2: "WAITING"}
    with _experimental():
        again = study.ask({"agent.lr": lr})
    assert again.number == 2 and again.params == running.params


@pytest.mark.slow  # a sweep whose actor is killed, and its trial run again
def test_a_trial_whose_actor_is_killed_runs_again(tmp_path):
    import psutil

    sweep_dir = tmp_path / "sweep"
    argv = ["ppo/cartpole", "--sweep", _space(tmp_path, SPACE), "--trials", "1"]
    argv += ["--parallel", "1", "--train.total_steps", "2048", *TINY, "--logdir", str(sweep_dir)]
    first = sweep_dir / "trial-0000" / "progress.csv"
    with _command(argv, tmp_path) as child:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and child.poll() is None:
            if first.exists() and len(_steps(first.parent)) >= 3:
                break
            time.sleep(0.05)
        assert child.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
        hosts = [  # the actor running trial 0: it holds its run's log.log open
            p
            for p in psutil.Process(child.pid).children(recursive=True)
            if "parl_remote.actor._host" in " ".join(p.cmdline())
            and any(f.path.startswith(str(first.parent)) for f in p.open_files())
        ]
        assert hosts, "no actor process found"
        for p in hosts:
            p.kill()
        assert child.wait(timeout=240) == 0, (tmp_path / "stderr").read_text()[-3000:]
    assert "sweep: trial 0's actor died" in (tmp_path / "stdout").read_text()
    trials = {t["number"]: t for t in _trials(sweep_dir)}
    assert [t["state"] for t in trials.values()] == ["FAIL", "COMPLETE"]
    keys = ["agent.lr", "agent.clip_coef", "agent.update_epochs", "agent.n_steps"]
    assert [trials["1"][k] for k in keys] == [trials["0"][k] for k in keys]  # run again
    assert _steps(trials["1"]["run_dir"])[-1] >= 2048


@pytest.mark.slow  # a Ray of its own starts, then two trials on it
@pytest.mark.xdist_group("ray")
def test_a_sweep_runs_its_trials_as_actors_of_ray(tmp_path, tmp_path_factory):
    """`--backend ray`: the embedded cluster is a local Ray of `--parallel` CPUs, each trial an
    actor in a Ray worker process (under the raylet), and the sweep ends as on xparl."""
    import psutil

    pytest.importorskip("ray", reason='Ray is not installed: pip install "parl-remote[ray]"')
    sweep_dir = tmp_path / "sweep"
    argv = ["ppo/cartpole", "--sweep", _space(tmp_path, SPACE), "--trials", "2"]
    argv += ["--parallel", "2", "--train.total_steps", "2048", *TINY, "--backend", "ray"]
    argv += ["--logdir", str(sweep_dir)]
    ray_tmp = tempfile.mkdtemp(prefix="pr", dir="/tmp")  # short: Ray's unix sockets are in it
    os.makedirs(f"{ray_tmp}/home")
    env = {"RAY_TMPDIR": ray_tmp, "HOME": f"{ray_tmp}/home", "RAY_USAGE_STATS_ENABLED": "0"}
    env["RAY_worker_niceness"] = "0"  # as the Ray tests' (tests/remote/test_ray.py)
    logs = [sweep_dir / f"trial-000{n}" / "log.log" for n in (0, 1)]
    hosts: dict[Path, int] = {}
    ancestors = set()
    try:
        with one_ray_at_a_time(tmp_path_factory), _command(argv, tmp_path, env) as child:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and child.poll() is None and not hosts:
                hosts = _actors_holding(child.pid, logs)
                time.sleep(0.05)
            for pid in hosts.values():
                with contextlib.suppress(psutil.Error):
                    ancestors |= {p.name() for p in psutil.Process(pid).parents()}
            assert child.wait(timeout=300) == 0, (tmp_path / "stderr").read_text()[-3000:]
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert hosts and "raylet" in ancestors, (hosts, ancestors)
    trials = _trials(sweep_dir)
    assert [t["state"] for t in trials] == ["COMPLETE", "COMPLETE"]
    for t in trials:
        assert _steps(t["run_dir"])[-1] >= 2048
    assert "best trial" in (tmp_path / "stdout").read_text()

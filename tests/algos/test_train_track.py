"""`parl-train --track mlflow` against a live MLflow server, `--track wandb` offline.

The MLflow server is the real `mlflow server`, started on 127.0.0.1 at a free port for the
module and stopped by its PID (its tests run in the slow suite: the server takes most of a
minute to start); what a run logged is read back with MLflow's own client. The
Weights & Biases run is written offline under the run directory and read back with wandb's
own reader of its transaction log (`wandb leet inspect --json`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import mlflow  # noqa: F401 (the test extras: parl-algos[mlflow,wandb])
import pytest
import wandb  # noqa: F401

from tests.algos.train_cli import parl_train

BIN = Path(sys.executable).parent
TINY = [
    "--train.total_steps",
    "1024",
    "--env.num_envs",
    "4",
    "--train.eval_every",
    "0",
    "--train.log_every",
    "256",
    "--no-progress",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    log = open(root / "server.log", "wb")  # noqa: SIM115 (closed below, after the server)
    server = subprocess.Popen(
        [
            *(str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port)),
            *("--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}"),
            *("--artifacts-destination", str(root / "artifacts"), "--workers", "1"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its workers in its group, stopped with it by its id
        # Without its job runner (GenAI evaluations, not used here), whose queue is a directory
        # in /dev/shm that the server leaves behind when it is stopped.
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, (root / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not answer within 240 s"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


@pytest.mark.slow  # a live mlflow server takes most of a minute to start
def test_a_run_tracked_on_a_live_mlflow_server(mlflow_server, tmp_path):
    from mlflow import MlflowClient

    logdir = tmp_path / "run"
    proc = parl_train(
        "ppo/cartpole", *TINY, "--logdir", str(logdir), "--track", "mlflow",
        "--track-uri", mlflow_server,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("ppo-cartpole")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.params["agent.lr"] == "0.001" and run.data.params["algorithm"] == "PPO"
    history = client.get_metric_history(run.info.run_id, "rollout/mean_return")
    with open(logdir / "progress.csv", encoding="utf-8") as f:
        rows = [r for line in f.read().splitlines()[1:] if (r := line.split(","))[2]]
    assert [(m.step, m.value) for m in history] == [(int(r[0]), float(r[2])) for r in rows]
    assert client.get_metric_history(run.info.run_id, "train/policy_loss")
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"learning_curve.png", "agent.ckpt", "progress.csv"} <= artifacts
    assert json.loads((logdir / "tracking.json").read_text())["run_id"] == run.info.run_id


@pytest.mark.slow  # a live mlflow server takes most of a minute to start
def test_a_sweep_tracks_each_trial_as_a_run_of_one_experiment(mlflow_server, tmp_path):
    from mlflow import MlflowClient

    space = tmp_path / "space.toml"
    space.write_text('[space]\n"agent.lr" = { log_uniform = [1e-4, 3e-3] }\n[sweep]\n'
                     'sampler = "random"\npruner = "none"\n')  # fmt: skip
    proc = parl_train(
        "ppo/cartpole", "--sweep", str(space), "--trials", "2", "--parallel", "2", *TINY,
        "--logdir", str(tmp_path / "sweep"), "--track", "mlflow", "--track-uri", mlflow_server,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("ppo-cartpole-sweep")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["trial-0000", "trial-0001"]
    assert len({r.data.params["agent.lr"] for r in runs}) == 2


# MLflow's SQLite store, read here with its client, asks SQLAlchemy 2.1 for a loader it
# deprecates; the run itself wrote the same store in its own process without it.
@pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")
def test_a_run_tracked_in_a_directory_of_its_own(tmp_path):
    """`--track mlflow` without a server: a database and the artifacts in ./mlruns."""
    from mlflow import MlflowClient

    logdir = tmp_path / "run"
    proc = parl_train("ppo/cartpole", *TINY, "--logdir", str(logdir), "--track", "mlflow",
                      "--track-uri", str(tmp_path / "mlruns"))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ppo-cartpole").experiment_id])
    assert run.info.status == "FINISHED"
    artifacts = tmp_path / "mlruns" / "artifacts" / run.info.run_id / "artifacts"
    assert (artifacts / "agent.ckpt").is_file()


def test_a_run_tracked_offline_with_wandb(tmp_path):
    logdir = tmp_path / "run"
    env = {
        "WANDB_MODE": "offline",
        "WANDB_DATA_DIR": str(tmp_path / "wandb-data"),
        "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
    }
    proc = parl_train("ppo/cartpole", *TINY, "--logdir", str(logdir), "--track", "wandb", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (log,) = logdir.glob("wandb/offline-run-*/run-*.wandb")
    read = subprocess.run(
        [str(BIN / "wandb"), "leet", "inspect", str(log), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert read.returncode == 0, read.stderr[-3000:]
    records = [json.loads(line) for line in read.stdout.splitlines() if line.strip()]
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    with open(logdir / "progress.csv", encoding="utf-8") as f:
        rows = [r for line in f.read().splitlines()[1:] if (r := line.split(","))[2]]
    assert [(h["_step"], h["rollout/mean_return"]) for h in history] == [
        (int(r[0]), float(r[2])) for r in rows
    ]
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    assert run["config"]["update"]["agent.lr"] == 0.001
    (artifact,) = [r["artifact"] for r in records if r["type"] == "artifact"]
    paths = {c["path"] for c in artifact["manifest"]["contents"]}
    assert {"learning_curve.png", "agent.ckpt", "progress.csv"} <= paths

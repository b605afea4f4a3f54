"""Experiment tracking of `parl-train` runs: MLflow or Weights & Biases beside TensorBoard.

`train.track = "mlflow"` (`--track mlflow`) or `"wandb"` makes the run skeleton open a
`Tracker` for the run: the config goes as parameters (by dotted key), every row of
`progress.csv` as metrics at its env step (`rollout/mean_return`, `time/seconds`,
`train/<stat>`), and at the end the learning curve and the final checkpoint as artifacts.
MLflow logs to `train.track_uri` (a tracking server's URL, or a directory for a database of
its own; none: `./mlruns`);
Weights & Biases to the project and mode its own settings say (`WANDB_MODE=offline` writes
the run under the run directory only). A tracked run of an experiment is named after its run
directory; `train.track_experiment` names the experiment (none: `<algorithm>-<env>`), and a
sweep puts all its trials in one. The tracked run's id is kept in the run directory
(`tracking.json`), so that `--resume` goes on logging to the same run. TensorBoard stays the
default and needs none of this.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from parl_algos.train._config import SECTIONS, Config, ConfigError
from parl_algos.train._run import env_name

__all__ = ["TRACKERS", "Tracker", "check_tracking", "open_tracker"]

TRACKERS = {"mlflow": "mlflow", "wandb": "wandb"}
"""The trackers, by `train.track`'s value, and the extra of parl-algos each needs."""

_ID_FILE = "tracking.json"
_ARTIFACTS = ("learning_curve.png", "agent.ckpt", "progress.csv")


def check_tracking(config: Config) -> None:
    """Raise ConfigError now for an unknown tracker or one whose package is missing."""
    import importlib.util

    track = config.train.track
    if track is None:
        return
    if track not in TRACKERS:
        raise ConfigError(f"train.track={track!r}; allowed: {', '.join(TRACKERS)} (or none)")
    if importlib.util.find_spec(track) is None:
        raise ConfigError(f"--track {track} needs {track}: pip install 'parl-algos[{track}]'")
    if track == "wandb" and config.train.track_uri is not None:
        raise ConfigError(
            "train.track_uri is MLflow's; Weights & Biases reads its own settings (wandb login, "
            "WANDB_MODE=offline)"
        )


def _params(config: Config) -> dict[str, Any]:
    params: dict[str, Any] = {"algorithm": config.algorithm}
    for section in SECTIONS:
        for key, value in dataclasses.asdict(config.section(section)).items():
            params[f"{section}.{key}"] = value
    return params


class Tracker:
    """One tracked run: parameters at the start, metrics by env step, artifacts at the end."""

    def log_row(self, env_step: int, metrics: dict[str, float]) -> None:
        """Log one row of progress.csv at `env_step`."""
        raise NotImplementedError

    def finish(self, logdir: str, *, failed: bool) -> None:
        """Log the run's artifacts (when it did not fail) and end the tracked run."""
        raise NotImplementedError


class _Mlflow(Tracker):
    def __init__(self, config: Config, logdir: str, experiment: str, run_id: str | None) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        uri, artifacts = _mlflow_uri(config.train.track_uri)
        self.client = MlflowClient(tracking_uri=uri)
        if run_id is None:
            experiment_id = self._experiment(experiment, artifacts)
            name = os.path.basename(os.path.normpath(logdir))
            self.run_id = self.client.create_run(experiment_id, run_name=name).info.run_id
            params = [Param(k, "none" if v is None else str(v)) for k, v in _params(config).items()]
            self.client.log_batch(self.run_id, params=params)
        else:
            self.run_id = run_id

    def _experiment(self, name: str, artifacts: str | None) -> str:
        """The id of experiment `name`, made if needed (a sweep's trials may race to it)."""
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is None:
            try:
                return str(self.client.create_experiment(name, artifact_location=artifacts))
            except MlflowException:
                found = self.client.get_experiment_by_name(name)
                if found is None:
                    raise
        return str(found.experiment_id)

    def log_row(self, env_step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, env_step) for k, v in metrics.items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def finish(self, logdir: str, *, failed: bool) -> None:
        if not failed:
            for name in _ARTIFACTS:
                if os.path.exists(path := os.path.join(logdir, name)):
                    self.client.log_artifact(self.run_id, path)
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def _mlflow_uri(uri: str | None) -> tuple[str, str | None]:
    """MLflow's tracking URI for `train.track_uri`, and where a new experiment's artifacts go.

    A URL is MLflow's own; a directory (none: `./mlruns`) holds an SQLite database,
    `mlflow.db`, and the artifacts, `artifacts/` (MLflow's file store is in maintenance).
    """
    if uri is not None and "://" in uri:
        return uri, None
    root = os.path.abspath(uri or "mlruns")
    os.makedirs(root, exist_ok=True)
    return f"sqlite:///{os.path.join(root, 'mlflow.db')}", Path(root, "artifacts").as_uri()


class _Wandb(Tracker):
    def __init__(self, config: Config, logdir: str, experiment: str, run_id: str | None) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=experiment,
            name=os.path.basename(os.path.normpath(logdir)),
            dir=logdir,
            config=_params(config),
            id=run_id,
            resume="allow",
        )
        self.run_id = self.run.id

    def log_row(self, env_step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=env_step)

    def finish(self, logdir: str, *, failed: bool) -> None:
        if not failed:
            artifact = self.wandb.Artifact(f"{self.run.id}-outputs", type="run-outputs")
            for name in _ARTIFACTS:
                if os.path.exists(path := os.path.join(logdir, name)):
                    artifact.add_file(path)
            self.run.log_artifact(artifact)
        self.run.finish(exit_code=1 if failed else 0)


def open_tracker(config: Config, logdir: str) -> Tracker | None:
    """The tracked run of the run in `logdir` (None without `train.track`), resumed if any."""
    track = config.train.track
    if track is None:
        return None
    path = os.path.join(logdir, _ID_FILE)
    run_id = None
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            kept = json.load(f)
        run_id = kept.get("run_id") if kept.get("track") == track else None
    experiment = config.train.track_experiment or (
        f"{config.algorithm.lower()}-{env_name(config.env.id)}"
    )
    cls = _Mlflow if track == "mlflow" else _Wandb
    tracker = cls(config, logdir, experiment, run_id)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"track": track, "run_id": tracker.run_id}, f)
    return tracker

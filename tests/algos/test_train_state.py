"""A Trainer's `state_dict` holds the whole state a run continues from: each family, in one process.

For one config of each Trainer family, in `single` mode with a budget of a few hundred steps:
the run's first checkpoint takes the Trainer's `state_dict` (pickled, as the checkpoint
writer does); the run trains on to its budget. Then a fresh Trainer of a fresh run loads that
state and trains to the same budget: its rows of progress.csv are the first run's past the
checkpoint (the timing column aside), and its parameters and optimizers end equal to the first
run's. A3C's own Trainer (`async` mode: gradients applied in the order they arrive) keeps the
base's state alone and cannot continue identically; in `single` mode A3C trains on the
on-policy Trainer, which is what runs here.
"""

from __future__ import annotations

import csv
import pickle
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch

from parl_algos.train import apply_override, get_spec, load_config
from parl_algos.train._skeleton import make_run, read_checkpoint
from parl_algos.train._spec import Trainer
from tests.algos.test_train_runs import small_args

FAMILIES = [
    pytest.param("ppo/cartpole", id="on_policy"),
    pytest.param("dqn/cartpole", id="off_policy-dqn"),
    pytest.param("sac/pendulum", id="off_policy-sac"),
    pytest.param("r2d2/cartpole-masked", id="recurrent"),
    pytest.param("mappo/simple_spread", id="multi_agent"),
    pytest.param("bc/pendulum", id="offline"),
    pytest.param("a3c/cartpole", id="a3c"),  # A3C's Trainer in single mode: the on-policy one
]


def _config(name: str) -> Any:
    config = load_config(name)
    args = [a for a in small_args(name) if a != "--no-progress"]
    args += ["--train.total_steps", "600", "--train.checkpoint_every", "300"]
    for key, text in zip(args[::2], args[1::2], strict=True):
        apply_override(config, key.removeprefix("--"), text)
    config.train.progress = False
    return config


def _rows(logdir: Path) -> list[dict[str, str]]:
    with open(logdir / "progress.csv", newline="") as f:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in csv.DictReader(f)]


def _train(
    config: Any, logdir: Path, prepared: Any, state: dict[str, Any] | None
) -> tuple[Trainer, bytes | None]:
    """Train `config` to its budget, from `state` when given; the first checkpoint's state."""
    spec = get_spec(config.algorithm)
    trainer: Trainer | None = None

    def save() -> None:
        assert trainer is not None
        if "first" not in kept:
            kept["first"] = cloudpickle.dumps(
                {"run": run.state_dict(), "trainer": trainer.state_dict(), "steps": run.env_steps}
            )

    kept: dict[str, bytes] = {}
    resume_step = None if state is None else state["steps"]
    logdir.mkdir(parents=True, exist_ok=True)
    run = make_run(config, spec, str(logdir), save, resume_step=resume_step)
    if state is not None:
        run.load_state_dict(state["run"])
    trainer = spec.trainer(config, spec, run, prepared)
    if state is not None:
        trainer.load_state_dict(state["trainer"], state["steps"])
    run.eval_env = trainer.eval_env
    try:
        trainer.train(run)
    finally:
        trainer.close()
    return trainer, kept.get("first")


def _tensors(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of a nested state dict, by its path."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    if isinstance(state, dict):
        items = state.items()
    elif isinstance(state, list | tuple):
        items = enumerate(state)
    else:
        return {}
    return {k: v for key, value in items for k, v in _tensors(value, f"{prefix}/{key}").items()}


@pytest.mark.parametrize("name", FAMILIES)
def test_a_fresh_trainer_loaded_with_the_state_dict_continues_identically(name, tmp_path):
    config = _config(name)
    spec = get_spec(config.algorithm)
    assert config.train.mode == "single"
    prepared = None if spec.prepare is None else spec.prepare(config, str(tmp_path / "first"))
    first, kept = _train(config, tmp_path / "first", prepared, None)
    assert kept is not None, "no checkpoint within the budget"
    state = pickle.loads(kept)
    assert {"agent", "rng_states"} <= state["trainer"].keys()
    assert 0 < state["steps"] < 600

    second, _ = _train(config, tmp_path / "second", prepared, state)

    whole, resumed = _rows(tmp_path / "first"), _rows(tmp_path / "second")
    after = [r for r in whole if int(r["env_step"]) > state["steps"]]
    assert after and resumed == after
    assert any(r["mean_return"] for r in whole)
    a, b = _tensors(first.agent.state_dict()), _tensors(second.agent.state_dict())
    assert a and a.keys() == b.keys()
    for key, tensor in a.items():
        assert torch.equal(tensor, b[key]), key
    # ... and training moved them since the checkpoint (the comparison can fail).
    before = _tensors(state["trainer"]["agent"])
    assert any(not torch.equal(before[k], a[k]) for k in before)


def test_the_first_checkpoint_layout_still_resumes(tmp_path):
    """A checkpoint of the first format (the generators apart from the Trainer's parts in
    `state.pkl`) is read into the one `state_dict` the Trainer loads."""
    name = "ppo/cartpole"
    config = _config(name)
    first, kept = _train(config, tmp_path / "first", None, None)
    assert kept is not None
    state = pickle.loads(kept)
    trainer_state = dict(state["trainer"])
    checkpoint = tmp_path / "old" / "checkpoints" / "step-0000000300"
    checkpoint.mkdir(parents=True)
    torch.save(trainer_state.pop("agent"), checkpoint / "agent.ckpt")
    rng = trainer_state.pop("rng_states")
    old = {"format": "parl-train/1", "env_steps": state["steps"], "run": state["run"]}
    old.update(rng=rng, objects=trainer_state)
    with open(checkpoint / "state.pkl", "wb") as f:
        pickle.dump(old, f)
    read = read_checkpoint(str(checkpoint))
    assert read["trainer"].keys() == state["trainer"].keys()
    second, _ = _train(config, tmp_path / "second", None, {**read, "steps": read["env_steps"]})
    after = [r for r in _rows(tmp_path / "first") if int(r["env_step"]) > state["steps"]]
    assert _rows(tmp_path / "second") == after
    for key, tensor in _tensors(first.agent.state_dict()).items():
        assert torch.equal(tensor, _tensors(second.agent.state_dict())[key]), key

"""`parl.utils.parse_args`: dataclass fields become flags, docstrings become help."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from parl.utils import parse_args


@dataclass
class Args:
    seed: int = 1
    """Seed of everything."""
    lr: float = 3e-4
    """Learning rate."""
    env_id: str = "CartPole-v1"
    """Gymnasium id."""
    capture_video: bool = False
    """Record videos."""
    target: float | None = None
    """Stop at this return."""


def test_defaults_and_flags():
    assert parse_args(Args, []) == Args()
    args = parse_args(
        Args,
        [
            "--seed",
            "3",
            "--lr",
            "0.01",
            "--env-id",
            "Pendulum-v1",
            "--capture-video",
            "--target",
            "475",
        ],
    )
    assert args == Args(seed=3, lr=0.01, env_id="Pendulum-v1", capture_video=True, target=475.0)
    assert parse_args(Args, ["--target", "none", "--no-capture-video"]).target is None


def test_help_shows_docstrings(capsys):
    with pytest.raises(SystemExit):
        parse_args(Args, ["--help"], description="demo")
    out = capsys.readouterr().out
    assert "Seed of everything. (default: 1)" in out and "--env-id" in out


def test_bad_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        parse_args(Args, ["--seed", "x"])
    assert "--seed" in capsys.readouterr().err


def test_rejects_non_dataclasses():
    with pytest.raises(TypeError, match="expects a dataclass"):
        parse_args(int, [])


@dataclass
class BaseArgs:
    seed: int = 1
    """Seed of everything."""
    logdir: str = "train_log/base"
    """Where outputs go."""


@dataclass
class DerivedArgs(BaseArgs):
    logdir: str = "train_log/derived"
    lr: float = 0.1
    """Learning rate."""


def test_inherited_fields_keep_their_docstrings(capsys):
    assert parse_args(DerivedArgs, ["--seed", "2"]) == DerivedArgs(seed=2)
    with pytest.raises(SystemExit):
        parse_args(DerivedArgs, ["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Seed of everything. (default: 1)" in out
    assert "Where outputs go. (default: train_log/derived)" in out
    assert "Learning rate. (default: 0.1)" in out

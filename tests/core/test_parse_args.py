"""`parl.utils.parse_args`: dataclass fields become flags, docstrings become help."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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


@dataclass
class Optim:
    lr: float = 1e-3
    """Adam learning rate."""
    clip: float | None = None
    """Gradient-norm clip."""


@dataclass
class RichArgs:
    variant: Literal["clip", "kl"] = "clip"
    """Which objective."""
    hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths."""
    optim: Optim = field(default_factory=Optim)
    """The optimizer."""
    render: bool = False
    """Show the environment."""
    seed: int = 1
    """Seed of everything."""


def test_literal_choices_are_checked(capsys):
    assert parse_args(RichArgs, ["--variant", "kl"]).variant == "kl"
    with pytest.raises(SystemExit):
        parse_args(RichArgs, ["--variant", "foo"])
    err = capsys.readouterr().err
    assert "foo" in err and "'clip'" in err and "'kl'" in err


def test_tuples_and_nested_dataclasses():
    args = parse_args(RichArgs, ["--hidden", "32", "16", "8", "--optim.lr", "0.5"])
    assert args.hidden == (32, 16, 8) and args.optim == Optim(lr=0.5)
    assert parse_args(RichArgs, ["--optim.clip", "none"]).optim.clip is None
    assert parse_args(RichArgs, ["--optim.clip=0.5"]).optim.clip == 0.5


def test_help_names_the_config_file_option(capsys):
    with pytest.raises(SystemExit):
        parse_args(RichArgs, ["--help"], description="demo")
    out = " ".join(capsys.readouterr().out.split())
    assert "--config FILE" in out and "--optim.lr" in out and "Which objective." in out


def test_config_file_then_flags_override_it(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(
        'variant = "kl"\nhidden = [8, 8]\nrender = true\nseed = 5\n[optim]\nlr = 0.25\n'
    )
    args = parse_args(RichArgs, ["--config", str(config), "--seed", "7"])
    assert args == RichArgs(variant="kl", hidden=(8, 8), optim=Optim(lr=0.25), render=True, seed=7)
    args = parse_args(RichArgs, ["--no-render", f"--config={config}", "--hidden", "4"])
    assert args.render is False and args.hidden == (4,) and args.optim.lr == 0.25


def test_config_file_errors_name_the_file(tmp_path, capsys):
    config = tmp_path / "bad.toml"
    config.write_text('variant = "foo"\n')
    with pytest.raises(SystemExit):
        parse_args(RichArgs, ["--config", str(config)])
    err = capsys.readouterr().err
    assert "foo" in err and str(config) in err

    config.write_text("sede = 3\n")
    with pytest.raises(SystemExit, match=r"bad.toml: unknown setting 'sede'.*seed"):
        parse_args(RichArgs, ["--config", str(config)])
    with pytest.raises(SystemExit, match=r"--config .*missing.toml"):
        parse_args(RichArgs, ["--config", str(tmp_path / "missing.toml")])
    with pytest.raises(SystemExit, match="--config needs a FILE"):
        parse_args(RichArgs, ["--config"])

"""Shared fixtures of the whole test suite."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The suite's clusters start no spare warm process beside each worker's slots (one more Python
# start-up a worker, hundreds of them in the suite); the tests of the spare ask for it.
os.environ.setdefault("PARL_WARM_SPARES", "0")


def run_python(code: str, *, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter of this environment; bounded in time."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kwargs,
    )


def python_without(
    root: str | os.PathLike, ours: Sequence[ModuleType], left_out: Sequence[str] = ()
) -> str:
    """A virtual environment under `root` with every third-party package of this one but those
    whose names start with one of `left_out`, and of the PARL distributions only those of the
    packages `ours`; its python's path.

    Made in a second or two: the third-party packages are links to this environment's own; each
    of `ours` is found as its install here finds it (a `.pth` line naming its source folder for
    an editable install, a link to its files otherwise), with its metadata linked beside it.
    """
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    python = Path(root) / "bin" / "python"
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    here = Path(sysconfig.get_paths()["purelib"])
    skipped = ("parl", "_editable", "__editable", *(name.lower() for name in left_out))
    for entry in here.iterdir():
        if not entry.name.endswith(".pth") and not entry.name.lower().startswith(skipped):
            (site / entry.name).symlink_to(entry)
    sources = set()
    for package in ours:
        folder = Path(package.__file__).parent
        distribution = "parl_core" if package.__name__ == "parl" else package.__name__
        for entry in here.glob(f"{distribution}-*.dist-info"):
            (site / entry.name).symlink_to(entry)
        if folder.parent == here:
            (site / folder.name).symlink_to(folder)
        else:
            sources.add(folder.parent)
    if sources:
        (site / "parl_sources.pth").write_text("".join(f"{path}\n" for path in sorted(sources)))
    return str(python)


@pytest.fixture
def repo_root() -> str:
    return REPO_ROOT

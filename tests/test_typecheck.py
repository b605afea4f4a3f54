"""The packages named in the root pyproject's `[tool.mypy]` type-check with `mypy --strict`."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_mypy_strict():
    assert importlib.util.find_spec("mypy"), "run the README's set-up command (mypy)"
    result = subprocess.run(
        [sys.executable, "-m", "mypy"],  # files and strictness: [tool.mypy] in pyproject.toml
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-2000:]
    assert "Success" in result.stdout

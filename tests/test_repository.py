"""Repository-wide rules: the tree is lint-clean and formatted."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO_ROOT


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]])
def test_ruff(command):
    ruff = shutil.which("ruff")
    assert ruff, "ruff is a test dependency of parl-core; run the README's set-up command"
    result = subprocess.run(
        [ruff, *command], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr

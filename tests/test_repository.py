"""Repository-wide rules: the tree is lint-clean and formatted."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]])
def test_ruff(command):
    beside = os.path.join(os.path.dirname(sys.executable), "ruff")
    ruff = beside if os.path.exists(beside) else shutil.which("ruff")
    assert ruff, "ruff is a test dependency of parl-core; run the README's set-up command"
    result = subprocess.run(
        [ruff, *command], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr

"""Shared fixtures of the whole test suite."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


@pytest.fixture
def repo_root() -> str:
    return REPO_ROOT

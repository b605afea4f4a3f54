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


def test_the_tests_marked_xdist_group_run_on_one_worker(request):
    """Under pytest-xdist's `--dist loadgroup` (pyproject.toml), each marked test's node ID
    carries its group: xdist's worker adds `@name`, by which its scheduler keeps a group on
    one worker. pytest 9.2 with xdist 3.8 drops the suffix, and then the Ray modules' tests
    spread over the workers, each starting a Ray and waiting for the other's lock."""
    config = request.config
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):
        pytest.skip("not a pytest-xdist worker under --dist loadgroup")
    lost = [
        item.nodeid
        for item in request.session.items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
    ]
    assert not lost, (
        f"{len(lost)} tests marked xdist_group lost their group (e.g. {lost[0]}) with pytest "
        f"{pytest.__version__}: install requirements-dev.txt's pytest pin"
    )

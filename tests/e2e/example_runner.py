"""Running an example's `main` the way a user would, from a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO_ROOT


def run_example(name: str, tmp_path, *flags: str, timeout: float) -> dict:
    """Run `examples/<name>/train.py`'s `main` in a fresh interpreter; return its result."""
    script = os.path.join(REPO_ROOT, "examples", name, "train.py")
    code = (
        "import json, runpy, sys\n"
        f"sys.argv = [{script!r}, *{list(flags)!r}]\n"
        f"mod = runpy.run_path({script!r}, run_name='example')\n"
        "print('RESULT', json.dumps(mod['main'](mod['parse_args'](mod['Args']))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))

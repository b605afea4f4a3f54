"""Every example's `--help` works, and its flags are checked before anything runs."""

from __future__ import annotations

import glob
import os

from tests.conftest import REPO_ROOT, run_python

SCRIPTS = sorted(glob.glob(os.path.join(REPO_ROOT, "examples", "*", "*.py")))


def test_every_example_has_a_help():
    # One interpreter loads every example (torch once) and asks each for its --help.
    code = (
        "import contextlib, io, runpy, sys\n"
        f"for script in {SCRIPTS!r}:\n"
        "    mod = runpy.run_path(script, run_name='example')\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        try:\n"
        "            mod['parse_args'](mod['Args'], ['--help'])\n"
        "        except SystemExit as exc:\n"
        "            assert exc.code == 0, (script, exc.code)\n"
        "    text = out.getvalue()\n"
        "    assert '--seed' in text and '--config FILE' in text, (script, text)\n"
        "    print('HELP OK', script)\n"
    )
    result = run_python(code, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("HELP OK") == len(SCRIPTS) > 0


def test_ppo_rejects_an_unknown_variant():
    script = os.path.join(REPO_ROOT, "examples", "ppo", "train.py")
    code = (
        "import runpy\n"
        f"mod = runpy.run_path({script!r}, run_name='example')\n"
        "mod['parse_args'](mod['Args'], ['--variant', 'foo'])\n"
    )
    result = run_python(code, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 2
    assert "foo" in result.stderr and "'clip'" in result.stderr and "'kl'" in result.stderr

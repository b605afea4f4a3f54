"""examples/es/cartpole.py runs on a local cluster of real actors, and (slow) solves CartPole-v1."""

from __future__ import annotations

import glob
import json
import os

import pytest

from tests.conftest import REPO_ROOT, run_python

SCRIPT = os.path.join(REPO_ROOT, "examples", "es", "cartpole.py")


def _run(tmp_path, runs: list[list[str]], *, cpu_num: int, timeout: float) -> list[dict]:
    """Run the example's `main` once per flag list, in one process with one local cluster."""
    code = (
        "import json, runpy, sys\n"
        "import parl\n"
        f"parl.connect(cpu_num={cpu_num}, log_to_driver=False)\n"
        f"mod = runpy.run_path({SCRIPT!r}, run_name='es_cartpole')\n"
        f"for flags in {runs!r}:\n"
        "    result = mod['main'](mod['parse_args'](mod['Args'], flags))\n"
        "    print('RESULT', json.dumps(result), flush=True)\n"
    )
    result = run_python(code, timeout=timeout, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    return [json.loads(line.removeprefix("RESULT ")) for line in lines]


def test_es_cartpole_smoke_is_the_same_run_on_1_or_2_actors(tmp_path):
    flags = [
        "--generations", "3", "--eval-every", "1", "--eval-episodes", "2",
        "--final-eval-episodes", "3", "--target-return", "none",
    ]  # fmt: skip
    one, two = _run(
        tmp_path,
        [
            [*flags, "--actors", "1", "--logdir", str(tmp_path / "one")],
            [*flags, "--actors", "2", "--logdir", str(tmp_path / "two")],
        ],
        cpu_num=3,
        timeout=180,
    )
    assert (one["actors"], two["actors"]) == (1, 2)
    assert one["generations"] == two["generations"] == 3
    assert one["env_steps"] > 3 * 32  # every candidate played at least one step
    # Which actor plays a candidate changes nothing: the same episodes, the same weights.
    for key in ("env_steps", "eval_env_steps", "best_eval_return", "final_eval_return"):
        assert one[key] == two[key], key
    assert one["weights_digest"] == two["weights_digest"]

    out = tmp_path / "two"
    assert glob.glob(str(out / "events.out.tfevents.*"))
    assert "evaluation mean return" in (out / "log.log").read_text()
    # The saved solver is the learner's: a fresh agent that loads it holds the same weights.
    check = (
        "import runpy, sys\n"
        f"mod = runpy.run_path({SCRIPT!r}, run_name='es_cartpole')\n"
        "agent, _ = mod['make_agent'](mod['Args']())\n"
        f"agent.load_solver({str(out / 'solver.npz')!r})\n"
        "print(agent.solver.version, mod['weights_digest'](agent))\n"
    )
    loaded = run_python(check, timeout=60)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert loaded.stdout.split() == ["3", str(two["weights_digest"])]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_es_cartpole_solves_cartpole_on_remote_actors(tmp_path, seed):
    # Measured with 2 actors over seeds 1-8: an evaluation first averages >= 475 after 10-40
    # generations, and the final 100-episode evaluation averages 485-500.
    [result] = _run(
        tmp_path,
        [
            [
                "--seed", str(seed), "--actors", "2", "--generations", "100",
                "--logdir", str(tmp_path / "out"),
            ]
        ],
        cpu_num=2,
        timeout=600,
    )  # fmt: skip
    assert result["actors"] == 2
    assert result["reached_target_at_generation"] is not None, result
    assert result["best_eval_return"] >= 475
    assert result["final_eval_return"] >= 475, result

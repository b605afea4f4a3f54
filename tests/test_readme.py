"""The README: small, its commands the ones CI runs, its tour runs, and every number of its
headline table is a result file's."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

from tests.conftest import REPO_ROOT

README = os.path.join(REPO_ROOT, "README.md")


def _text() -> str:
    with open(README, encoding="utf-8") as f:
        return f.read()


def _figure():
    path = os.path.join(REPO_ROOT, "docs", "hooks", "results.py")
    spec = importlib.util.spec_from_file_location("results_hook", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._figure


def test_the_readme_is_at_most_15_kb():
    assert len(_text().encode()) <= 15 * 1024


def test_the_ci_blocks_are_the_two_commands_and_the_slow_suite():
    blocks = dict(re.findall(r"<!-- ci:(\w+) -->\n```bash\n(.*?)```", _text(), re.S))
    assert blocks == {"run": "make run\n", "test": "make test\n", "slow": "make slow\n"}


def _headline_rows() -> list[list[str]]:
    section = _text().split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    assert lines[0].startswith("| claim | ours | peer | ratio | result |")
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]


def test_every_headline_number_comes_from_a_result_file():
    figure = _figure()
    rows = _headline_rows()
    assert len(rows) >= 5
    for claim, ours, peer, ratio, link in rows:
        path = re.fullmatch(r"\[[\w-]+\]\((benchmarks/results/[\w-]+\.json)\)", link)
        assert path, f"{claim}: the result column must link a result file, not {link!r}"
        with open(os.path.join(REPO_ROOT, path[1]), encoding="utf-8") as f:
            data = json.load(f)
        matches = [
            row
            for row in data["rows"]
            if claim == f"{row['task']}, {row['algorithm']}: {_short(row['metric'])}"
            and peer == f"{row['peer']}: {figure(row['peer_value'])}"
        ]
        assert matches, f"{path[1]} has no row for {claim!r} against {peer!r}"
        row = matches[0]
        assert ours == figure(row["ours"]), (claim, ours, row["ours"])
        assert ratio == f"{row['ratio']:.2f}x", (claim, ratio, row["ratio"])


def _short(metric: str) -> str:
    return metric.removesuffix(" (median of the seeds)")


def test_the_readme_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", _text()):
        if "://" not in target:
            assert os.path.exists(os.path.join(REPO_ROOT, target)), target


def test_the_tour_runs(tmp_path):
    tour = _text().split("\n## A tour\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "tour.py").write_text(tour)
    result = subprocess.run(
        [sys.executable, "tour.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[:3] == ["11", "[12, 13, 14]", "(32, 8)"], result.stdout

"""The documentation site builds with `mkdocs build --strict`, its snippets run, and its
Results pages, rendered from `benchmarks/results/`, show their tables and charts in Chromium.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import re
import subprocess
import sys
import threading

import pytest

from tests.conftest import REPO_ROOT

CHROMIUM = "/usr/bin/chromium"


def _hook():
    path = os.path.join(REPO_ROOT, "docs", "hooks", "results.py")
    spec = importlib.util.spec_from_file_location("results_hook", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once for the module's tests."""
    assert importlib.util.find_spec("mkdocs"), "run the set-up (make setup): mkdocs is missing"
    site = tmp_path_factory.mktemp("docs") / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return site


def test_site_builds_strict_and_offline(site):
    assert "xparl start" in (site / "cluster" / "index.html").read_text()
    assert (site / "dashboard.png").exists()
    reference = {
        "parl": "parl.Model.get_weights",
        "utils": "parl.utils.parse_args",
        "algorithms": "parl_algos.DQN",
        "evo": "parl_evo.ESAgent",
        "parl_remote": "parl_remote.remote_class",
    }
    for page, anchor in reference.items():
        html = (site / "api" / page / "index.html").read_text()
        assert f'id="{anchor}"' in html, (page, anchor)
    for page in ["getting-started", "remote", "samplers", "parl-train", "benchmarks"]:
        html = (site / page / "index.html").read_text()
        assert "https://fonts.g" not in html, page  # no web fonts: it reads offline


def test_results_pages_come_from_the_result_files(site):
    results_dir = os.path.join(REPO_ROOT, "benchmarks", "results")
    names = sorted(name[: -len(".json")] for name in os.listdir(results_dir))
    html = (site / "results" / "index.html").read_text()
    for name in names:
        svg = site / "results" / f"{name}-ratios.svg"
        page = (site / "results" / name / "index.html").read_text()
        if svg.exists():
            assert f"{name}-ratios.svg" in page
            assert svg.read_text().startswith("<svg")
        assert "Measurement history" in page, name
    assert "all-ratios.svg" in html and "<table>" in html
    dqn = (site / "algorithms" / "dqn" / "index.html").read_text()
    assert "Tianshou 2.0.1 Rainbow" in dqn  # an algorithm's page shows its rows


def test_a_page_naming_a_missing_result_file_stops_the_build():
    class File:
        src_uri = "results/x.md"

    class Page:
        file = File()

    config = {"config_file_path": os.path.join(REPO_ROOT, "mkdocs.yml")}
    with pytest.raises(ValueError, match="no result file benchmarks/results/nothing.json"):
        _hook().on_page_markdown("<!-- results: nothing -->\n", Page(), config, None)
    with pytest.raises(ValueError, match="learning.json has no row of"):
        _hook().on_page_markdown(
            "<!-- results: learning algorithms=NoSuch -->\n", Page(), config, None
        )


def test_the_charts_draw_ratios_and_curves():
    hook = _hook()
    row = {
        "task": "CartPole-v1",
        "algorithm": "PPO",
        "metric": "env steps",
        "better": "lower",
        "peer": "SB3",
        "ratio": 0.5,
        "curves": {"x": [0, 1000, 2000], "ours": [[0, 5, 9], [1, 6, 8]], "peer": [[0, 2, 4]]},
    }
    bars = hook.bar_chart([row, {**row, "ratio": 2.0}, {**row, "ratio": 1.02}], "t")
    assert bars.count("<rect") == 3
    assert [colour in bars for colour in ("#2e7d32", "#c62828", "#757575")] == [True] * 3
    curves = hook.curve_chart(row)
    assert curves.count("<polygon") == 2 and curves.count("<polyline") == 2  # a band, a median


RUN_PAGES = ["getting-started.md", "remote.md", "samplers.md"]


def test_the_guides_python_snippets_run(tmp_path):
    """Every ```python block of the guides in RUN_PAGES runs, page by page and in order, in one
    fresh process (one local cluster for all: what a block created ends with it); a block after
    an `<!-- excerpt -->` line is part of a larger program and is not run."""
    runner = (
        "import gc, re, sys\n"
        "for page in sys.argv[1:]:\n"
        "    text = open(page, encoding='utf-8').read()\n"
        "    blocks = re.findall(r'(<!-- excerpt -->\\n)?```python\\n(.*?)```', text, re.S)\n"
        "    for i, (excerpt, code) in enumerate(blocks):\n"
        "        if not excerpt:\n"
        "            exec(compile(code, f'{page}:{i}', 'exec'), {'__name__': '__main__'})\n"
        "            gc.collect()  # the block's actors end with it, freeing their slots\n"
        "    print('SNIPPETS RAN', page, sum(not e for e, _ in blocks))\n"
    )
    pages = [os.path.join(REPO_ROOT, "docs", page) for page in RUN_PAGES]
    result = subprocess.run(
        [sys.executable, "-c", runner, *pages],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    ran = dict(re.findall(r"SNIPPETS RAN \S+/(\S+) (\d+)", result.stdout))
    assert set(ran) == set(RUN_PAGES) and all(int(n) >= 1 for n in ran.values()), ran


@pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"no Chromium at {CHROMIUM}: install Debian's chromium package (.ci/run does)",
)
def test_the_results_page_renders_its_tables_and_charts_in_chromium(site, tmp_path):
    from tests.dashboard.conftest import chromium

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.set_default_timeout(30_000)
            problems: list[str] = []
            page.on("pageerror", lambda exc: problems.append(str(exc)))
            page.goto(f"http://127.0.0.1:{server.server_port}/results/")
            page.wait_for_load_state("load")
            page.screenshot(path=str(tmp_path / "results.png"), full_page=True)
            rows = page.locator("article table tbody tr")
            assert rows.count() >= 10
            assert "ratio" in page.locator("article table thead").first.inner_text()
            images = page.locator("article img")
            assert images.count() >= 1
            for i in range(images.count()):
                image = images.nth(i)
                image.scroll_into_view_if_needed()
                size = image.evaluate("img => [img.complete, img.naturalWidth, img.naturalHeight]")
                assert size[0] and size[1] > 100 and size[2] > 100, (
                    image.get_attribute("src"),
                    size,
                )
            assert not problems, problems
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
    assert (tmp_path / "results.png").stat().st_size > 10_000

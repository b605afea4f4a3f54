"""The documentation site builds with `mkdocs build --strict`: a broken reference fails here."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


def _hook():
    path = os.path.join(REPO_ROOT, "docs", "hooks", "readme_sections.py")
    spec = importlib.util.spec_from_file_location("readme_sections", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_site_builds_strict_and_offline(tmp_path):
    assert importlib.util.find_spec("mkdocs"), "run the README's set-up command (mkdocs)"
    site = tmp_path / "site"
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
    # The guides came from README.md, the reference from the docstrings.
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


def test_readme_sections_end_at_the_next_heading_outside_code():
    sections = _hook().readme_sections(
        "# Top\nintro\n## One\nfirst\n```bash\n# not a heading\n```\n### Two\nsecond\n"
    )
    assert sections["One"] == "first\n```bash\n# not a heading\n```\n"
    assert sections["Two"] == "second\n"
    assert "not a heading" not in sections


def test_a_page_naming_a_missing_readme_section_stops_the_build():
    class File:
        src_uri = "guide.md"

    class Page:
        file = File()

    config = {"config_file_path": os.path.join(REPO_ROOT, "mkdocs.yml")}
    with pytest.raises(ValueError, match="README.md has no section 'No such section'"):
        _hook().on_page_markdown("<!-- readme: No such section -->\n", Page(), config, None)

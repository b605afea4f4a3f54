"""The five distributions release together: one version, one licence, metadata for an index page."""

from __future__ import annotations

import os
import re
import tomllib

import pytest

import parl
from tests.conftest import REPO_ROOT

DISTRIBUTIONS = [
    "packages/parl-core",
    "packages/parl-remote",
    "packages/parl-algos",
    "packages/parl-evo",
    "apps/dashboard",
]


def _project(path: str) -> dict:
    with open(os.path.join(REPO_ROOT, path, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def test_one_version_for_every_distribution():
    versions = {path: _project(path)["version"] for path in DISTRIBUTIONS}
    assert len(set(versions.values())) == 1, versions
    assert parl.__version__ == versions["packages/parl-core"]


@pytest.mark.parametrize("path", DISTRIBUTIONS)
def test_metadata_for_an_index_page(path):
    project = _project(path)
    assert project["license"] == "Apache-2.0"
    assert "Typing :: Typed" in project["classifiers"]
    assert all(" :: " in classifier for classifier in project["classifiers"])
    assert project["keywords"]
    with open(os.path.join(REPO_ROOT, path, project["readme"]), encoding="utf-8") as f:
        readme = f.read()
    assert readme.startswith(f"# {project['name']}\n")
    assert "```" in readme, f"{path}'s README shows no example"
    assert "pip install" in readme, f"{path}'s README does not say how to install it"


def test_licence_file_is_apache_2():
    with open(os.path.join(REPO_ROOT, "LICENSE"), encoding="utf-8") as f:
        text = f.read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_the_set_up_command_installs_every_distribution_and_pins_the_linter():
    with open(os.path.join(REPO_ROOT, "requirements-dev.txt"), encoding="utf-8") as f:
        lines = [line.split("#")[0].strip() for line in f]
    editable = {re.sub(r"\[.*\]$", "", line.removeprefix("-e ")) for line in lines if line}
    assert set(DISTRIBUTIONS) <= editable
    assert "-c constraints.txt" in lines
    assert any(re.fullmatch(r"ruff==[\d.]+", line) for line in lines)
    assert any(re.fullmatch(r"mypy==[\d.]+", line) for line in lines)

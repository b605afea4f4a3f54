"""Optional packages: `require` fails early naming the install command; others degrade once."""

from __future__ import annotations

import logging
import sys

import pytest

from parl.utils import _optional, optional_import, progress_bar, require


def test_require_returns_the_module():
    assert require("json", "pip install nothing") is sys.modules["json"]


def test_require_names_the_install_command():
    with pytest.raises(ModuleNotFoundError, match=r"the plots needs 'no_such_mod_x'.*`pip inst"):
        require("no_such_mod_x.pyplot", "pip install no-such-mod-x", purpose="the plots")


def test_require_keeps_errors_of_the_modules_own_imports(tmp_path, monkeypatch):
    # A module that is installed but whose own import fails is not "missing": its error stays.
    (tmp_path / "broken_mod_x.py").write_text("import no_such_dependency_y\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_y") as info:
        require("broken_mod_x", "pip install broken-mod-x")
    assert "pip install" not in str(info.value)


def test_optional_import_warns_once(caplog, monkeypatch):
    monkeypatch.setattr(_optional, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="parl.utils._optional"):
        for _ in range(3):
            assert optional_import("no_such_mod_x", "pip install x", purpose="the widget") is None
    assert len(caplog.records) == 1
    assert "the widget is off" in caplog.text and "pip install x" in caplog.text


def test_progress_bar_without_tqdm_is_the_bare_iterable(caplog, monkeypatch):
    monkeypatch.setattr(_optional, "_warned", set())
    monkeypatch.setitem(sys.modules, "tqdm", None)  # what an absent package looks like to import
    with caplog.at_level(logging.WARNING, logger="parl.utils._optional"):
        bar = progress_bar(range(3), desc="episodes")
        seen = []
        for i in bar:
            bar.set_postfix(eval=f"{i}.0")
            seen.append(i)
        bar.close()
    assert seen == [0, 1, 2]
    assert "the progress bar is off" in caplog.text and "pip install tqdm" in caplog.text


def test_progress_bar_with_tqdm():
    tqdm = pytest.importorskip("tqdm")
    bar = progress_bar(range(2), desc="x", unit="ep")
    assert isinstance(bar, tqdm.tqdm)
    assert list(bar) == [0, 1]
    bar.close()

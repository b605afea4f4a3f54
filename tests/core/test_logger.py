"""`parl.utils.logger`: readable, timestamped lines on stdout, and a file with `set_dir`."""

from __future__ import annotations

import os
import re

import pytest

from parl.utils import logger

LINE = re.compile(r"^\[\d\d-\d\d \d\d:\d\d:\d\d test_logger\.py:(\d+)\]( WRN| ERR)? (.*)$")


def test_info_is_timestamped_and_names_the_caller(capsys):
    logger.info("hello %s", "world")
    out = capsys.readouterr().out.strip().splitlines()
    match = LINE.match(out[-1])
    assert match, out
    assert match.group(3) == "hello world"
    assert match.group(2) is None


def test_warnings_and_errors_are_marked(capsys):
    logger.warning("careful")
    logger.error("broken")
    lines = capsys.readouterr().out.strip().splitlines()[-2:]
    assert [LINE.match(line).group(2) for line in lines] == [" WRN", " ERR"]


def test_set_dir_also_writes_a_file(tmp_path, capsys):
    logger.set_dir(tmp_path / "run1")
    assert logger.get_dir() == os.fspath(tmp_path / "run1")
    logger.info("to the file, %d", 42)
    logger.set_dir(tmp_path / "run2")  # switching closes the first file
    logger.info("only in run2")
    first = (tmp_path / "run1" / "log.log").read_text().splitlines()
    second = (tmp_path / "run2" / "log.log").read_text().splitlines()
    assert LINE.match(first[-1]).group(3) == "to the file, 42"
    assert all("only in run2" not in line for line in first)
    assert LINE.match(second[-1]).group(3) == "only in run2"
    assert "\x1b[" not in "".join(first)  # no colour codes in files


def test_auto_set_dir_uses_the_script_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dirname = logger.auto_set_dir(action="d")
    assert os.path.isdir(dirname)
    assert dirname.startswith("train_log" + os.sep)
    with pytest.raises(ValueError, match="action='x' must be"):
        logger.auto_set_dir(action="x")


def test_exception_includes_the_traceback(capsys):
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logger.exception("failed")
    out = capsys.readouterr().out
    assert "failed" in out and "RuntimeError: boom" in out and "Traceback" in out

"""The two call drivers are twins: stripped of async, the pipelined one mirrors the blocking one.

The review check of the house style, automated: the blocking driver comes first, every public
method of it has an `a`-prefixed twin in the pipelined driver in the same order, and what their
bodies differ in is I/O. Run this file as a script to print the whole diff for review:

    python tests/remote/test_twins.py
"""

from __future__ import annotations

import ast
import difflib
import re
import sys
from pathlib import Path

import parl_remote.engines.xparl._drivers as drivers

SOURCE = Path(drivers.__file__).read_text()
TWINS = {
    "BlockingDriver": "PipelinedDriver",
    "request": "arequest",
}
# Pipelined only: how future-mode calls enter the event loop, with the arrays they hold.
EXTRA = {"hold", "submit", "submit_held"}


def _classes() -> dict[str, ast.ClassDef]:
    tree = ast.parse(SOURCE)
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _public_methods(cls: ast.ClassDef) -> list[str]:
    return [
        node.name
        for node in cls.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and not node.name.startswith("_")
    ]


def _unasync(text: str) -> str:
    """The pipelined code as the blocking one would read: no async, await or a-prefixes."""
    text = re.sub(r"\basync def\b", "def", text)
    text = re.sub(r"\bawait ", "", text)
    text = re.sub(r"\ba(create|call|request)\b", r"\1", text)
    return text.replace("PipelinedDriver", "BlockingDriver")


def _body(cls: ast.ClassDef, name: str) -> list[str]:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            doc = ast.get_docstring(node)
            lines = ast.get_source_segment(SOURCE, node).splitlines()
            skip = 1 + (len(doc.splitlines()) if doc else 0)  # the def line and the docstring
            return lines[skip:]
    raise AssertionError(f"{cls.name} has no method {name}")


def twin_diff() -> str:
    """The diff of the blocking driver against the unasynced pipelined one, method by method."""
    classes = _classes()
    blocking, pipelined = classes["BlockingDriver"], classes["PipelinedDriver"]
    out = []
    for name in _public_methods(blocking):
        twin = "a" + name if "a" + name in _public_methods(pipelined) else name
        ours = [_unasync(line) for line in _body(pipelined, twin)]
        out += difflib.unified_diff(
            _body(blocking, name),
            ours,
            f"BlockingDriver.{name}",
            f"PipelinedDriver.{twin}",
            lineterm="",
        )
    return "\n".join(out)


def test_the_blocking_driver_comes_first_and_every_method_has_its_twin_in_order():
    classes = list(_classes())
    assert classes.index("BlockingDriver") < classes.index("PipelinedDriver")
    by_name = _classes()
    sync = _public_methods(by_name["BlockingDriver"])
    pipelined = [n for n in _public_methods(by_name["PipelinedDriver"]) if n not in EXTRA]
    assert [n if n == "close" else "a" + n for n in sync] == pipelined
    assert {"create", "call", "request", "close"} <= set(sync)
    module_functions = [n.name for n in ast.parse(SOURCE).body if isinstance(n, ast.FunctionDef)]
    module_coroutines = [
        n.name for n in ast.parse(SOURCE).body if isinstance(n, ast.AsyncFunctionDef)
    ]
    assert module_functions == ["request"] and module_coroutines == ["arequest"]


def test_creating_differs_only_in_holding_the_arrays_that_leave_later():
    by_name = _classes()
    blocking = _body(by_name["BlockingDriver"], "create")
    pipelined = [_unasync(line) for line in _body(by_name["PipelinedDriver"], "acreate")]
    assert [line.replace("self.hold(buffers).buffers", "buffers") for line in pipelined] == blocking


def test_a_call_decides_nothing_of_its_own():
    # Both build the call and read its reply through the core; only the sending differs.
    by_name = _classes()
    for cls, name, held in (("BlockingDriver", "call", False), ("PipelinedDriver", "acall", True)):
        body = "\n".join(_body(by_name[cls], name))
        assert "self.core.call(kind, name, args, kwargs)" in body
        assert ("self.hold(buffers)" in body) == held  # sent later: the connection holds them
        assert "self.core.died_error()" in body and "m." not in body


if __name__ == "__main__":
    sys.stdout.write(twin_diff() + "\n")

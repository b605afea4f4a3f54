"""parl_remote's imports read one way: no circle between its modules, no folder importing upward.

The folders are layers, by the process that runs their code and by concern, listed bottom-up
in `LAYERS`: a module may import from its own layer and the layers below it, never from one
above. Every import counts, wherever it stands (at the top, inside a function, under
`TYPE_CHECKING`): a deferred import is still a dependency, and a circle broken only by
deferring one import is still a circle.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

from tests.conftest import REPO_ROOT

SRC = os.path.join(REPO_ROOT, "packages", "parl-remote", "src")
PACKAGE = "parl_remote"
# Bottom-up. A module belongs to the longest entry its name starts with: the root package
# (its `__init__`, the CLI) is the top, where the folders are put together.
LAYERS = [
    ("parl_remote._exceptions", "parl_remote._util", "parl_remote._loop", "parl_remote._config"),
    ("parl_remote.security",),
    ("parl_remote.wire",),
    ("parl_remote.actor",),
    ("parl_remote.worker",),
    ("parl_remote.master",),
    ("parl_remote.client",),
    ("parl_remote.engines",),
    ("parl_remote",),
]


def _modules() -> dict[str, str]:
    """Every module of the package: dotted name -> path."""
    found = {}
    root = os.path.join(SRC, PACKAGE)
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), SRC)[: -len(".py")]
                parts = rel.split(os.sep)
                if parts[-1] == "__init__":
                    parts.pop()
                found[".".join(parts)] = os.path.join(folder, name)
    return found


def _imports(name: str, path: str, modules: dict[str, str]) -> Iterator[tuple[str, int]]:
    """The package's modules that `name` imports, with the line of each import."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    is_package = path.endswith("__init__.py")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                origin = ".".join([*base, node.module] if node.module else base)
            else:
                origin = node.module or ""
            targets = [
                f"{origin}.{alias.name}" if f"{origin}.{alias.name}" in modules else origin
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            if target in modules and target != name:
                yield target, node.lineno


def _graph() -> dict[str, dict[str, int]]:
    modules = _modules()
    return {name: dict(_imports(name, path, modules)) for name, path in modules.items()}


def _layer(module: str) -> int:
    """The rank of `module`'s layer: of the longest entry of `LAYERS` that names it."""
    best, rank = -1, -1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    return rank


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_folder_is_a_layer():
    listed = {prefix for prefixes in LAYERS for prefix in prefixes}
    folders = {
        name
        for name, path in _modules().items()
        if path.endswith("__init__.py") and name.count(".") == 1
    }
    assert "parl_remote.wire" in folders
    assert folders <= listed, f"folders in no layer: {sorted(folders - listed)}; add to LAYERS"


def test_no_circle_between_modules():
    cycles = _cycles(_graph())
    assert not cycles, f"import circles in parl_remote: {cycles}"


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [
        f"{name}:{line} imports {target}"
        for name, targets in sorted(_graph().items())
        for target, line in sorted(targets.items())
        if _layer(target) > _layer(name)
    ]
    assert not upward, "imports against the layers (see LAYERS):\n" + "\n".join(upward)


def test_the_check_sees_deferred_and_relative_imports(tmp_path):
    """A circle closed by an import inside a function is found, as a top-level one is."""
    modules = {"pkg.a": str(tmp_path / "a.py"), "pkg.b": str(tmp_path / "b.py")}
    (tmp_path / "a.py").write_text("from pkg import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from . import a\n")
    graph = {name: dict(_imports(name, path, modules)) for name, path in modules.items()}
    assert graph == {"pkg.a": {"pkg.b": 1}, "pkg.b": {"pkg.a": 2}}
    assert _cycles(graph) == [["pkg.a", "pkg.b"]]

"""Code shipping: the user's own modules and `distributed_files`, zipped for actor processes.

A class defined in the user's script (`__main__`) travels by value inside its pickle
(cloudpickle). Classes and functions of the user's own modules -- anything imported from a
file that no installed distribution and no standard-library directory provides -- travel by
reference, so their source files are shipped: each lands at its path relative to the
`sys.path` entry it was imported from, in the actor's working directory, which is first on the
actor's `sys.path`. A package ships whole -- every `.py` file of its top-level package, imported
here or not -- as the shipped copy shadows any other on the actor's side: a module that the
client never imported (a lazy facade's, such as `parl.samplers` for a `parl` that comes from a
source checkout on `PYTHONPATH`) must be in it too. `distributed_files` (globs and folders,
recursively, relative to the current directory, empty sub-folders included) land at the same
relative paths, as they were when `parl.connect` returned: they are read then, once. The
modules' sources are read then too, and again when they change, so that the client's code
directory may go once it is connected: a file gone ships as it was when last read.
"""

from __future__ import annotations

import functools
import glob
import importlib.metadata
import io
import os
import sys
import sysconfig
import threading
import zipfile
from collections.abc import Iterable
from typing import Any

__all__ = ["Bundle", "expand_patterns", "read_files", "user_module_files"]


@functools.cache
def _system_dirs() -> tuple[str, ...]:
    paths = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        with_prefix = sysconfig.get_paths().get(key)
        if with_prefix:
            paths.add(os.path.realpath(with_prefix))
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        paths.add(os.path.realpath(os.path.join(prefix, "lib")))
    return tuple(sorted(paths))


@functools.cache
def _installed_top_levels() -> frozenset[str]:
    """Names provided by installed distributions, editable ones included."""
    names = set(importlib.metadata.packages_distributions())
    for finder in sys.meta_path:  # setuptools' editable installs map names to source folders
        mapping = getattr(finder, "MAPPING", None)
        if isinstance(mapping, dict) and type(finder).__module__.startswith("__editable__"):
            names.update(mapping)
    return frozenset(names)


@functools.cache
def _installed_roots() -> tuple[str, ...]:
    """Folders that `.pth` files of site-packages put on sys.path (editable installs)."""
    roots = set()
    for site_dir in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        try:
            names = os.listdir(site_dir)
        except OSError:
            continue
        for name in names:
            if not name.endswith(".pth"):
                continue
            try:
                with open(os.path.join(site_dir, name)) as f:
                    lines = f.read().splitlines()
            except OSError:
                continue
            for line in lines:
                line = line.strip()
                if line and not line.startswith(("#", "import ")) and os.path.isdir(line):
                    roots.add(os.path.realpath(line))
    return tuple(sorted(roots))


_NEVER_SHIPPED = frozenset(("__main__", "parl_remote"))
"""The script travels by value; the runtime is the actor's own (a copy would split its state)."""


def _is_installed_name(name: str) -> bool:
    """Whether a module's top-level name is an installed, standard or never-shipped one."""
    top = name.partition(".")[0]
    return top in _installed_top_levels() or top in sys.stdlib_module_names or top in _NEVER_SHIPPED


@functools.lru_cache(maxsize=8192)
def _is_user_path(path: str) -> bool:
    real = os.path.realpath(path)
    return not any(real.startswith(d + os.sep) for d in (*_system_dirs(), *_installed_roots()))


def _import_root(path: str, name: str) -> str | None:
    """The sys.path entry a module file was imported from (its top package's parent)."""
    real = os.path.realpath(path)
    depth = name.count(".") + (1 if os.path.basename(real) == "__init__.py" else 0)
    root = os.path.dirname(real)
    for _ in range(depth):
        root = os.path.dirname(root)
    return root


def _package_files(top: str, root: str) -> dict[str, str]:
    """Map archive path -> file for every `.py` file of the package folder `top`."""
    files = {}
    for dirpath, dirnames, names in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for fname in names:
            if fname.endswith(".py"):
                full = os.path.join(dirpath, fname)
                files[os.path.relpath(full, root)] = full
    return files


def user_module_files() -> dict[str, str]:
    """Map archive path -> file for the user's own code.

    That is each imported module's whole top-level package; a module of no package (or of a
    namespace package) alone, with the `__init__.py` files above it.
    """
    files: dict[str, str] = {}
    packages: dict[str, str] = {}
    _find_user_modules(list(sys.modules.items()), files, packages)
    for top, root in packages.items():
        files.update(_package_files(top, root))
    return files


def _find_user_modules(
    modules: Iterable[tuple[str, Any]], files: dict[str, str], packages: dict[str, str]
) -> None:
    """Add the user's modules among `modules` to `files` and their packages to `packages`.

    `files` maps archive path -> file; `packages` the folder of each top-level package -> the
    sys.path entry above it. The test of the name comes first: it passes over an installed
    module (most of them, with torch imported) without a look at its file.
    """
    for name, module in modules:
        if not isinstance(name, str) or _is_installed_name(name):
            continue
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or not path.endswith(".py") or not _is_user_path(path):
            continue
        if not os.path.isfile(path):
            continue
        root = _import_root(path, name)
        if root is None:
            continue
        top = os.path.join(root, name.partition(".")[0])
        if os.path.isfile(os.path.join(top, "__init__.py")):
            packages[top] = root
            continue
        rel = os.path.relpath(os.path.realpath(path), root)
        files[rel] = path
        # Parent packages' __init__.py files make the package importable.
        parts = rel.split(os.sep)[:-1]
        for i in range(1, len(parts) + 1):
            init = os.path.join(root, *parts[:i], "__init__.py")
            if os.path.isfile(init):
                files[os.path.join(*parts[:i], "__init__.py")] = init


def expand_patterns(patterns: Iterable[str], base: str | None = None) -> dict[str, str]:
    """Map archive path -> file for `distributed_files` patterns; each must match something.

    Folders are walked; each folder below one also gets an entry (its archive path ends with
    "/"), so that empty ones are reproduced.
    """
    base = os.path.realpath(base or os.getcwd())
    files: dict[str, str] = {}
    for pattern in patterns:
        if os.path.isabs(pattern):
            raise ValueError(
                f"distributed_files: {pattern!r} is absolute; give paths relative to the current "
                f"directory {base} (they land at the same relative paths beside the actor)"
            )
        matches = glob.glob(os.path.join(base, pattern), recursive=True)
        if not matches:
            raise ValueError(f"distributed_files: {pattern!r} matches no file under {base}")
        for match in matches:
            real = os.path.realpath(match)
            if real != base and not real.startswith(base + os.sep):
                raise ValueError(f"distributed_files: {pattern!r} reaches outside {base}")
            if os.path.isdir(real):
                for dirpath, dirnames, names in os.walk(real):
                    for dname in dirnames:
                        full = os.path.join(dirpath, dname)
                        files[os.path.relpath(full, base) + "/"] = full
                    for fname in names:
                        full = os.path.join(dirpath, fname)
                        files[os.path.relpath(full, base)] = full
            else:
                files[os.path.relpath(real, base)] = real
    return files


def read_files(files: dict[str, str]) -> dict[str, bytes]:
    """The contents of `expand_patterns`' files now (b"" for a folder's entry)."""
    contents = {}
    for rel, path in files.items():
        if rel.endswith("/"):
            contents[rel] = b""
            continue
        try:
            with open(path, "rb") as f:
                contents[rel] = f.read()
        except OSError as exc:
            raise ValueError(f"distributed_files: cannot read {rel!r}: {exc}") from None
    return contents


class Bundle:
    """The zip of code and files each new actor receives; rebuilt when imports change.

    `distributed_files` are read here, once: what actors receive is what the files held then.
    The user's modules are read here too, and again when their files change.
    """

    def __init__(self, distributed_files: Iterable[str] = ()) -> None:
        self.extra = read_files(expand_patterns(distributed_files))
        self._key: tuple[Any, ...] | None = None
        self._data = b""
        self._modules_seen = -1
        self._examined: dict[str, int] = {}  # module name -> the id of the module looked at
        self._packages: dict[str, str] = {}  # the user's package folders found, walked each look
        self._module_files: dict[str, str] = {}
        self._sources: dict[str, tuple[float, bytes]] = {}  # path -> its mtime and contents
        self._lock = threading.Lock()  # actors are created from many threads at once
        _system_dirs(), _installed_roots()  # read now, not at the first module of the user's
        self.data()

    def data(self) -> bytes:
        """The current zip (cached while the set of user modules and their mtimes is unchanged)."""
        with self._lock:
            if len(sys.modules) != self._modules_seen:  # something was imported: look again
                self._look_again()
            files = {rel: path for rel, path in self._module_files.items() if rel not in self.extra}
            key = tuple(sorted((rel, _mtime(path)) for rel, path in files.items()))
            if key != self._key:
                sources = {rel: self._source(path) for rel, path in files.items()}
                contents = {rel: data for rel, data in sources.items() if data is not None}
                contents.update(self.extra)
                self._data = _zip(contents) if contents else b""
                self._key = key
            return self._data

    def _look_again(self) -> None:
        """Find the user's modules imported since the last look (at the modules new to it).

        Files seen before stay: one whose directory went ships as it was last read. The
        packages' folders are walked again, for files added to them since.
        """
        modules = list(sys.modules.items())
        news = [(name, mod) for name, mod in modules if self._examined.get(name) != id(mod)]
        self._examined.update((name, id(mod)) for name, mod in news)
        _find_user_modules(news, self._module_files, self._packages)
        for top, root in self._packages.items():
            self._module_files.update(_package_files(top, root))
        self._modules_seen = len(modules)

    def _source(self, path: str) -> bytes | None:
        """The contents of a module's file: read again if it changed, as last read if gone."""
        mtime, known = _mtime(path), self._sources.get(path)
        if known is not None and known[0] == mtime:
            return known[1]
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None if known is None else known[1]
        self._sources[path] = (mtime, data)
        return data


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _zip(contents: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for rel, data in sorted(contents.items()):
            z.writestr(rel, data)
    return out.getvalue()

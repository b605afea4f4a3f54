"""Small helpers shared by the cluster's processes."""

from __future__ import annotations

import inspect
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from typing import Any

import psutil

__all__ = [
    "available_cpus",
    "describe_exit",
    "is_loopback",
    "kill_pid",
    "loaded_module",
    "method_entry",
    "outward_ip",
    "owner_alive",
    "pid_runs",
    "private_dir",
    "read_json",
    "sweep_dead_dirs",
    "write_json_atomic",
]


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write `data` as JSON to `path` so that readers see the old file or the new one, whole."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".parl-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file, or return None if it does not exist or is not complete JSON."""
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def loaded_module(name: str) -> Any:
    """Module `name` if it is imported completely, else None.

    A module that another thread is importing right now (an actor process's preloader) is
    already in `sys.modules`, half made: code that only uses a module when the user's code has
    imported it must not take it from there before its import ends.
    """
    module = sys.modules.get(name)
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


def available_cpus() -> int:
    """The CPU cores this process may run on (all cores where affinity is unknown, e.g. macOS)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    if getaffinity is not None:
        return len(getaffinity(0))
    return os.cpu_count() or 1


def outward_ip() -> str:
    """The address other machines reach this one by (127.0.0.1 when offline).

    No packet is sent: connecting a UDP socket only asks the kernel which interface routes out.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            address: str = s.getsockname()[0]
            return address
        except OSError:
            return "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether a listening address is reachable from this machine only (127.0.0.0/8, ``::1``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def describe_exit(code: int | None) -> str:
    """Say how a process ended from its return code (negative: killed by a signal)."""
    if code is None:
        return "ended"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


def owner_alive(pid: int | None) -> bool:
    """Whether the process that owns us (an embedded cluster's user process) still runs."""
    if not pid:
        return True
    try:
        alive: bool = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        return alive
    except psutil.Error:
        return False


def private_dir(kind: str) -> str:
    """A new directory of this process in the temp dir, mode 0700: `parl-KIND-PID-XXXXXXXX`.

    The pid in its name lets `sweep_dead_dirs` remove it once this process is gone, even when
    it was killed (SIGKILL, `ray.kill`) before it could remove the directory itself.
    """
    return tempfile.mkdtemp(prefix=f"parl-{kind}-{os.getpid()}-")


def sweep_dead_dirs(kind: str) -> int:
    """Remove this user's `private_dir(kind)` directories whose process no longer runs; how many.

    A directory goes only if its name is one `private_dir(kind)` makes, it is a directory (not
    a link) of this user, and the pid in its name runs no process (another user's counts as
    running, and so does a pid reused since: the directory then waits for the next sweep).
    """
    pattern = re.compile(rf"parl-{re.escape(kind)}-([0-9]{{1,10}})-[a-z0-9_]{{8}}")
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return 0
    uid, removed = os.getuid(), 0
    for name in names:
        match = pattern.fullmatch(name)
        if match is None or pid_runs(int(match[1])):
            continue
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid == uid and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed


def pid_runs(pid: int) -> bool:
    """Whether a process `pid` exists (pid 0 is never taken for gone)."""
    if pid == 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_pid(pid: int, *, timeout: float = 5.0, create_time: float | None = None) -> bool:
    """Stop process `pid`: SIGTERM, then SIGKILL after `timeout`. Return whether it is gone.

    With `create_time`, a process with that PID but another start time (the PID was reused) is
    left alone.
    """
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 1.0:
            return True
        proc.terminate()
        try:
            proc.wait(timeout)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False
    deadline = time.monotonic() + timeout
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not psutil.pid_exists(pid)


def method_entry(
    instance: Any, methods: dict[str, tuple[Any, bool]], name: str
) -> tuple[Any, bool] | None:
    """`(bound method, is async)` of `instance` named `name`, cached in `methods`; None if none."""
    entry = methods.get(name)
    if entry is None:
        static = inspect.getattr_static(type(instance), name, None)
        if not callable(static) and not isinstance(static, staticmethod | classmethod):
            return None
        fn = getattr(instance, name)
        entry = (fn, inspect.iscoroutinefunction(fn))
        methods[name] = entry
    return entry

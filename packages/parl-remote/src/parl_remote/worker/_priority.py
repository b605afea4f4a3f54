"""A warm process's CPU share while it preloads, lowered and given back from its worker.

A process's own nice value cannot be lowered again without privileges, and a niced preloading
thread stalls its process (it holds the GIL through a compiled module's import). What can be
given back is the nice value of a session's autogroup (Linux, `sched(7)`): the kernel shares
the CPUs between sessions by it, and any process of the same user may set it anywhere from 0 to
19. A warm process runs in a session of its own; its worker sets that session's autogroup nice
(`set_nice`) while it preloads, so that it takes only the CPU time that actors leave, and sets
it back to 0 before the process takes an actor. `lowers_here` says whether the autogroup is what
shares the CPUs here: autogroup on, and this process in the root CPU cgroup (in any other, as in
most containers, the kernel ignores the autogroup). Where it is not, the worker falls back to
holding the preload while its actors keep the CPUs busy.
"""

from __future__ import annotations

import os

__all__ = ["lowers_here", "nice_of", "set_nice"]

_CGROUP_ROOT = "/sys/fs/cgroup"


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _in_root_cpu_group(cgroups: str, root: str = _CGROUP_ROOT) -> bool:
    """Whether `cgroups` (a `/proc/PID/cgroup`) puts its process in the root CPU task group.

    cgroup v1: the line whose controllers include `cpu` has the path `/`. cgroup v2 alone (no
    v1 `cpu` line): the process's cgroup has no `cpu.weight`, which every cgroup has whose
    parent gives it the CPU controller, and the root never has (a container's cgroup namespace
    shows its own cgroup as `/`: its `cpu.weight` tells it apart from the real root).
    """
    unified = None
    for line in cgroups.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if "cpu" in controllers.split(","):
            return path == "/"
        if controllers == "" and line.startswith("0:"):
            unified = path
    if unified is None:
        return False
    own = os.path.join(root, *[p for p in unified.split("/") if p])
    return os.path.isdir(own) and not os.path.exists(os.path.join(own, "cpu.weight"))


def lowers_here() -> bool:
    """Whether a session's autogroup nice value shares the CPUs of this machine."""
    return (
        _read("/proc/sys/kernel/sched_autogroup_enabled").strip() == "1"
        and os.path.exists("/proc/self/autogroup")
        and _in_root_cpu_group(_read("/proc/self/cgroup"))
    )


def set_nice(pid: int, nice: int) -> bool:
    """Set the autogroup nice value of process `pid`'s session (0 to 19); whether it took.

    False where the process is gone, or within a tenth of a second of another change (the
    kernel's limit on unprivileged changes, EAGAIN): the caller tries again.

    Raises:
        OSError: the kernel refused it otherwise (e.g. EPERM): it never takes here.
    """
    if not 0 <= nice <= 19:
        raise ValueError(f"an autogroup nice value from 0 to 19, not {nice}")
    try:
        with open(f"/proc/{pid}/autogroup", "w", encoding="ascii") as f:
            f.write(str(nice))
    except (BlockingIOError, FileNotFoundError, ProcessLookupError):
        return False
    return True


def nice_of(pid: int) -> int | None:
    """The autogroup nice value of process `pid`'s session (None: unknown)."""
    text = _read(f"/proc/{pid}/autogroup").split()
    return int(text[-1]) if len(text) == 3 and text[1] == "nice" else None

"""Result rows: what a benchmark measured, written to `benchmarks/results/<name>.json`.

A result file holds a title, a list of rows and the measurement history. A row is one claim:
the task, the algorithm (or the component measured), the metric and which way is better, our
figure, the peer and its figure, the ratio ours / peer, the seeds, the machine (CPU model and
cores), the date and the command that measured it; `curves` optionally holds learning curves
(`{"x": [...], "ours": [[...] a seed], "peer": [[...] a seed]}`). A history entry is a titled,
dated piece of markdown: how a figure was measured, under what load, what was tried and not
kept. The documentation's Results page is rendered from these files, and the README's headline
table is checked against them.

The benchmark scripts call `record(name, rows)` where they print their tables; `--results
DIR` (or `PARL_BENCH_RESULTS`) moves the files elsewhere, and `PARL_BENCH_RESULTS=off` writes
none.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import shlex
import sys
from typing import Any

__all__ = ["RESULTS_DIR", "Row", "command_line", "load", "machine", "record", "validate"]

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
_BETTER = ("lower", "higher")
_ROW_KEYS = {
    "task": str,
    "algorithm": str,
    "metric": str,
    "better": str,
    "ours": (int, float, type(None)),
    "peer": str,
    "peer_value": (int, float, type(None)),
    "ratio": (int, float),
    "seeds": list,
    "machine": dict,
    "date": str,
    "command": str,
}


@dataclasses.dataclass
class Row:
    """One measured claim: our figure against a peer's on one task."""

    task: str
    """The environment or workload, e.g. `CartPole-v1`."""
    algorithm: str
    """The algorithm or component measured, e.g. `PPO` or `ParallelSampler 2x8`."""
    metric: str
    """What the figures count, with their unit, e.g. `env steps to a mean return of 475`."""
    better: str
    """`lower` or `higher`: which way the metric improves."""
    ours: float | None
    """Our figure (a median over `seeds` where there are several); None with `ratio` alone."""
    peer: str
    """What we are compared with, with its version, e.g. `Stable-Baselines3 2.9.2`."""
    peer_value: float | None
    """The peer's figure, measured the same way in the same run; None with `ratio` alone."""
    seeds: list[int]
    """The seeds the figures summarize (empty for measurements without one)."""
    command: str
    """The command that measured both figures."""
    machine: dict[str, Any] = dataclasses.field(default_factory=lambda: machine())
    """`{"cpu": model, "cores": n}` of the machine that measured it."""
    date: str = dataclasses.field(default_factory=lambda: datetime.date.today().isoformat())
    """The day it was measured, ISO 8601."""
    note: str = ""
    """A sentence of context: the load, the spread of the seeds, what differs."""
    curves: dict[str, Any] | None = None
    """Learning curves, `{"x": [...], "ours": [[...]], "peer": [[...]]}`, one list a seed."""
    ratio: float | None = None
    """Ours over the peer's figure: computed from the two, or given where only it was measured."""

    def __post_init__(self) -> None:
        if self.ours is not None and self.peer_value:
            self.ratio = round(self.ours / self.peer_value, 3)
        if self.ratio is None:
            raise ValueError(f"{self.task}, {self.algorithm}: give ours and peer_value, or ratio")

    def to_json(self) -> dict[str, Any]:
        """The row as its file stores it (empty optional fields left out)."""
        data = dataclasses.asdict(self)
        return {
            key: value for key, value in data.items() if key in _ROW_KEYS or value not in ("", None)
        }


def machine() -> dict[str, Any]:
    """This machine's CPU model (from /proc/cpuinfo where there is one) and core count."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count() or 1}


def _path(name: str, directory: str | None) -> str:
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"{name=} must be letters, digits, '-' and '_' (it names a file)")
    return os.path.join(directory or RESULTS_DIR, f"{name}.json")


def load(name: str, directory: str | None = None) -> dict[str, Any]:
    """The result file `name` (without `.json`), checked; an empty one if it does not exist."""
    path = _path(name, directory)
    if not os.path.exists(path):
        return {"title": name, "rows": [], "history": []}
    with open(path, encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    validate(data, path)
    return data


def validate(data: dict[str, Any], where: str = "result file") -> None:
    """Raise ValueError naming the first row or entry of `data` that breaks the format."""
    if not isinstance(data.get("title"), str):
        raise ValueError(f"{where}: needs a 'title' string")
    for i, row in enumerate(data.get("rows", [])):
        for key, kind in _ROW_KEYS.items():
            if not isinstance(row.get(key), kind):
                raise ValueError(
                    f"{where}: row {i} needs {key!r} ({kind}); it has {row.get(key)!r}"
                )
        if row["better"] not in _BETTER:
            raise ValueError(f"{where}: row {i}: better={row['better']!r}, not one of {_BETTER}")
        if not {"cpu", "cores"} <= set(row["machine"]):
            raise ValueError(f"{where}: row {i}: machine needs 'cpu' and 'cores'")
        if (row["ours"] is None) != (row["peer_value"] is None):
            raise ValueError(f"{where}: row {i}: give both figures, or neither with the ratio")
        if row["peer_value"] and abs(row["ours"] / row["peer_value"] / row["ratio"] - 1) > 0.03:
            raise ValueError(f"{where}: row {i}: ratio {row['ratio']} is not ours / peer_value")
    for i, entry in enumerate(data.get("history", [])):
        if not all(isinstance(entry.get(key), str) for key in ("title", "date", "text")):
            raise ValueError(f"{where}: history entry {i} needs 'title', 'date' and 'text'")


def record(
    name: str,
    rows: list[Row],
    *,
    title: str | None = None,
    directory: str | None = None,
) -> str | None:
    """Add `rows` to the result file `name` and return its path (None when turned off).

    A row replaces an earlier one of the same task, algorithm, metric and peer: the file keeps
    the latest measurement of each claim (the earlier figures stay in the git history).
    """
    directory = directory or os.environ.get("PARL_BENCH_RESULTS") or None
    if directory == "off" or not rows:
        return None
    data = load(name, directory)
    if title:
        data["title"] = title
    fresh = [row.to_json() for row in rows]

    def key(row: dict[str, Any]) -> tuple[str, ...]:
        return (row["task"], row["algorithm"], row["metric"], row["peer"])

    replaced = {key(row) for row in fresh}
    data["rows"] = [row for row in data["rows"] if key(row) not in replaced] + fresh
    validate(data, name)
    path = _path(name, directory)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(path + ".tmp", path)
    return path


def command_line() -> str:
    """The command this process was started with, as a shell would take it."""
    return shlex.join(["python", *sys.argv])

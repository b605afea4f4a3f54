"""One benchmark script on an earlier commit and on this tree, by turns, in one invocation.

    python benchmarks/before_after.py --base REV [--rounds 3] remote_bench.py --quick
    python benchmarks/before_after.py --base REV samplers.py --seconds 1 --tasks CartPole-v1

`REV`'s tree is exported (`git archive`) into a temporary directory, and this tree is copied
beside it as it is when the invocation starts (the files git tracks or would track, edits
included), so that an edit made while it runs moves neither side; then the script named runs
`--rounds` times on each side, alternating (the base first): from each copy with its own
packages on `PYTHONPATH`, each run its own processes, its result rows turned off
(`PARL_BENCH_RESULTS=off`). A run that fails (a non-zero exit, or past `--timeout`) is told
as it ends and left out of the table, with the other runs kept: the table ends with how many
runs of each side failed, and why. Each side runs its own copy of the script,
so an option that only one side has is refused by that side. A shared machine's load moves
within minutes: each run's figures are ratios to a baseline that the script measures in the
same run, and alternating gives both sides the same share of the machine's moods.

The rows of the tables the script prints (a name, then figures: `1.23x`, `456.7`) are
collected by name, and a table of both sides is printed: each column's figures of every run
of each side, and the ratio of their medians, new / base.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCES = (
    "packages/parl-core/src",
    "packages/parl-remote/src",
    "packages/parl-algos/src",
    "packages/parl-evo/src",
    "apps/dashboard/src",
)
_FIGURE = re.compile(r"^-?[\d,]*\.?\d+x?$")


def export(rev: str, into: str) -> str:
    """`rev`'s tree, written under `into`; its root."""
    archive = subprocess.run(
        ["git", "-C", ROOT, "archive", rev], capture_output=True, check=True
    ).stdout
    os.makedirs(into, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def snapshot(into: str) -> str:
    """This tree as it is now, written under `into`; its root.

    That is the files git tracks or would track (not those it ignores), edits included.
    """
    listed = subprocess.run(
        ["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    for rel in sorted({name.decode() for name in listed.split(b"\0") if name}):
        source = os.path.join(ROOT, rel)
        if not os.path.lexists(source) or (os.path.isdir(source) and not os.path.islink(source)):
            continue  # deleted and not yet committed, or a nested repository's folder
        os.makedirs(os.path.dirname(os.path.join(into, rel)), exist_ok=True)
        shutil.copy2(source, os.path.join(into, rel), follow_symlinks=False)
    return into


def run(root: str, script: list[str], timeout: float) -> tuple[str, str | None]:
    """The output of `script` run from the tree at `root`, its packages first on the path, and
    why it failed (None if it did not).

    It runs in a session of its own, whose processes are all stopped once it has exited (a
    run that failed may leave its baseline's servers behind).
    """
    env = dict(os.environ, PARL_BENCH_RESULTS="off")
    env["PYTHONPATH"] = os.pathsep.join(os.path.join(root, s) for s in SOURCES)
    command = [sys.executable, os.path.join(root, "benchmarks", script[0]), *script[1:]]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            command, cwd=root, env=env, stdout=out, stderr=err, start_new_session=True
        )
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = -9
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its session: the run and what it left
            proc.wait()
        out.seek(0)
        err.seek(0)
        output, errors = out.read(), err.read()
    if not code:
        return output, None
    if code == -9:
        failure = f"killed past its {timeout:g} s (--timeout)"
    else:
        why = [line for line in errors.splitlines() if "Error" in line or "error:" in line]
        failure = f"exit {code}: {(why or errors.splitlines() or [''])[-1].strip()}"
    print(f"  failed, {failure}", flush=True)
    return output, failure


def rows(output: str) -> dict[str, list[float]]:
    """The rows of the tables in `output`: name -> its figures (the cells that are numbers).

    A row's name is its cells before the first figure (a padded name may read as several).
    """
    found: dict[str, list[float]] = {}
    for line in output.splitlines():
        cells = [c.strip() for c in (line.split("|") if "|" in line else re.split(r"\s{2,}", line))]
        cells = [c for c in cells if c]
        first = next((i for i, c in enumerate(cells) if _FIGURE.match(c)), None)
        if not first:  # no figure, or no name before the first
            continue
        figures = [float(c.rstrip("x").replace(",", "")) for c in cells[first:] if _FIGURE.match(c)]
        found[" ".join(cells[:first])] = figures
    return found


def table(base: list[dict[str, list[float]]], new: list[dict[str, list[float]]]) -> list[str]:
    """Each row both sides have: per column, both sides' runs and new / base of the medians.

    The rows come in the order the base's runs printed them (the rows of any run, so that one
    that failed early loses none).
    """
    lines = []
    names = dict.fromkeys(name for r in base for name in r)
    for name in names:
        olds = [r[name] for r in base if name in r]
        news = [r[name] for r in new if name in r]
        if not news:
            continue
        cells = []
        for col in range(min(len(olds[0]), len(news[0]))):
            old = [r[col] for r in olds if len(r) > col]
            now = [r[col] for r in news if len(r) > col]
            ratio = statistics.median(now) / statistics.median(old) if statistics.median(old) else 0
            cells.append(
                f"{'/'.join(f'{v:g}' for v in old)} -> "
                f"{'/'.join(f'{v:g}' for v in now)} ({ratio:.2f})"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", required=True, help="the earlier commit")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    parser.add_argument("script", nargs=argparse.REMAINDER, help="a script of benchmarks/, args")
    args = parser.parse_args()
    if not args.script:
        parser.error("name the benchmark script to run, e.g. remote_bench.py --quick")
    with tempfile.TemporaryDirectory(prefix="parl-before-after-") as tmp:
        base_root = export(args.base, os.path.join(tmp, "base"))
        new_root = snapshot(os.path.join(tmp, "new"))
        runs: dict[str, list[dict[str, list[float]]]] = {"base": [], "new": []}
        failures: dict[str, list[str]] = {"base": [], "new": []}
        loads = []
        for i in range(args.rounds):
            for side, root in (("base", base_root), ("new", new_root)):
                load = f"{os.getloadavg()[0]:.1f}"
                print(
                    f"round {i + 1}: {side} ({args.base if side == 'base' else 'this tree'}), "
                    f"load {load}",
                    flush=True,
                )
                output, failure = run(root, args.script, args.timeout)
                loads.append(load)
                if failure is None:
                    runs[side].append(rows(output))
                else:
                    failures[side].append(f"round {i + 1}: {failure}")
    print(
        f"\n{' '.join(args.script)}: {args.base} -> this tree, {args.rounds} runs each "
        f"alternating, loads {', '.join(loads)} (each cell: base runs -> new runs (new / base "
        "of the medians))"
    )
    if runs["base"] and runs["new"]:
        print("\n".join(table(runs["base"], runs["new"])))
    else:
        print("no table: " + " and ".join(f"every {s} run failed" for s in runs if not runs[s]))
    for side, why in failures.items():
        if why:
            print(f"{side}: {len(why)} of {args.rounds} runs failed, left out: {'; '.join(why)}")


if __name__ == "__main__":
    main()

"""One benchmark script on an earlier commit and on this tree, by turns, in one invocation.

    python benchmarks/before_after.py --base REV [--rounds 3] remote_bench.py --quick
    python benchmarks/before_after.py --base REV samplers.py --seconds 1 --tasks CartPole-v1

`REV`'s tree is exported (`git archive`) into a temporary directory, and this tree is copied
beside it as it is when the invocation starts (the files git tracks or would track, edits
included), so that an edit made while it runs moves neither side; then the script named runs
`--rounds` times on each side, alternating (the base first), each run its own processes, its
result rows turned off (`PARL_BENCH_RESULTS=off`). Each side runs on an interpreter of its own
(`environment`): a virtual environment made for it, whose one `.pth` file puts that side's
packages first and then the third-party packages of the interpreter running this script, as an
installed copy of that tree would. Every process of a run, the cluster's actors included,
imports that side's code whatever the side does with `PYTHONPATH` and `sys.path` (a tree from
before parl-remote shipped a `parl` found on `PYTHONPATH` fails in its actors with it). A run
that fails (a non-zero exit, or past `--timeout`) is told as it ends and left out of the table,
with the other runs kept: the table ends with how many runs of each side failed, and why. Each
side runs its own copy of the script, so an option that only one side has is refused by that
side. A shared machine's load moves
within minutes: each run's figures are ratios to a baseline that the script measures in the
same run, and alternating gives both sides the same share of the machine's moods.

A base whose benchmark script has a bug of its own (one fixed later, in a commit that changed
the script and nothing it measures) can take the fixed file: `--take PATH@REV` writes `REV`'s
`PATH` over the base's, and the table's heading names it.

    python benchmarks/before_after.py --base de2d2c4 --take benchmarks/samplers.py@9537bee \\
        samplers.py --seconds 1 --tasks CartPole-v1

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
import site
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


def take(root: str, spec: str) -> None:
    """Write `REV`'s `PATH` (`spec` is `PATH@REV`) over the file of the tree at `root`."""
    path, sep, rev = spec.rpartition("@")
    if not sep or not path or not rev:
        raise SystemExit(f"before_after.py: --take {spec!r}: give it as PATH@REV")
    shown = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:{path}"], capture_output=True)
    if shown.returncode:
        raise SystemExit(f"before_after.py: --take {spec!r}: {shown.stderr.decode().strip()}")
    target = os.path.join(root, path)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as f:
        f.write(shown.stdout)


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


def environment(root: str, into: str) -> str:
    """A virtual environment at `into` for the tree at `root`; its interpreter.

    Its one `.pth` file lists the tree's packages, then the site-packages of the interpreter
    running this script (their third-party packages, not their own `.pth` files: the editable
    installs of the checkout this runs from stay out).
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", into], check=True)
    python = os.path.join(into, "bin", "python")
    site_dir = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    ours = [os.path.join(root, s) for s in SOURCES]
    theirs = [p for p in site.getsitepackages() if os.path.isdir(p)]
    with open(os.path.join(site_dir, "parl-before-after.pth"), "w", encoding="utf-8") as f:
        f.write("".join(f"{path}\n" for path in ours + theirs))
    return python


def run(python: str, root: str, script: list[str], timeout: float) -> tuple[str, str | None]:
    """The output of `script` run by `python` (the side's `environment`) from the tree at
    `root`, and why it failed (None if it did not).

    It runs in a session of its own, whose processes are all stopped once it has exited (a
    run that failed may leave its baseline's servers behind).
    """
    env = dict(os.environ, PARL_BENCH_RESULTS="off")
    env.pop("PYTHONPATH", None)  # the side's environment names its packages
    env.pop("VIRTUAL_ENV", None)
    command = [python, os.path.join(root, "benchmarks", script[0]), *script[1:]]
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
    parser.add_argument(
        "--take",
        action="append",
        default=[],
        metavar="PATH@REV",
        help="the base's PATH as REV has it (a later fix of the benchmark script itself)",
    )
    parser.add_argument("script", nargs=argparse.REMAINDER, help="a script of benchmarks/, args")
    args = parser.parse_args()
    if not args.script:
        parser.error("name the benchmark script to run, e.g. remote_bench.py --quick")
    with tempfile.TemporaryDirectory(prefix="parl-before-after-") as tmp:
        base_root = export(args.base, os.path.join(tmp, "base"))
        for spec in args.take:
            take(base_root, spec)
        new_root = snapshot(os.path.join(tmp, "new"))
        pythons = {
            "base": environment(base_root, os.path.join(tmp, "base-env")),
            "new": environment(new_root, os.path.join(tmp, "new-env")),
        }
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
                output, failure = run(pythons[side], root, args.script, args.timeout)
                loads.append(load)
                if failure is None:
                    runs[side].append(rows(output))
                else:
                    failures[side].append(f"round {i + 1}: {failure}")
    base_name = args.base + "".join(f" (with {spec})" for spec in args.take)
    print(
        f"\n{' '.join(args.script)}: {base_name} -> this tree, {args.rounds} runs each "
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

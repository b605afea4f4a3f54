"""An mkdocs hook: the Results pages are rendered from `benchmarks/results/*.json`.

A page line `<!-- results: NAME -->` becomes the result file NAME's rows as a table, a bar
chart of their ratios against the peers (an SVG the hook adds to the site as
`results/NAME-ratios.svg`), a chart of learning curves for each row that has some (the median
seed as a line, the spread of the seeds shaded) and the file's measurement history, an entry
a collapsible note. `<!-- results: * -->` renders the rows of every file in one table and one
chart, each row's task linking to its file's page `results/NAME.md`; `<!-- results: NAME
algorithms=PPO,A2C -->` the table of NAME's rows whose algorithm starts with one of those
names (an algorithm's page). A file that does not exist, a filter that matches no row, or a
file that breaks the format stops the build.
"""

from __future__ import annotations

import glob
import html
import importlib.util
import math
import os
import re
import statistics
import sys
from typing import Any

__all__ = ["bar_chart", "curve_chart", "on_files", "on_page_markdown", "render", "rows_table"]

_INCLUDE = re.compile(
    r"^<!-- results: (?P<name>[\w*-]+)(?: algorithms=(?P<algorithms>[^>]+?))? -->$", re.MULTILINE
)
_WIN, _LOSS, _LEVEL = "#2e7d32", "#c62828", "#757575"


def _results_module(root: str) -> Any:
    """`benchmarks/_results.py`, the format's one definition."""
    path = os.path.join(root, "benchmarks", "_results.py")
    if "_results" not in sys.modules:
        spec = importlib.util.spec_from_file_location("_results", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["_results"] = module
        spec.loader.exec_module(module)
    return sys.modules["_results"]


def _load_all(root: str) -> dict[str, dict[str, Any]]:
    results = _results_module(root)
    directory = os.path.join(root, "benchmarks", "results")
    names = sorted(os.path.basename(p)[: -len(".json")] for p in glob.glob(f"{directory}/*.json"))
    return {name: results.load(name, directory) for name in names}


def _figure(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 10_000:
        return f"{value / 1000:,.1f}k"
    return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"


def _verdict(row: dict[str, Any]) -> str:
    """`win`, `loss` or `level` (within 5%) for us, by the row's `better`."""
    ratio = row["ratio"]
    if abs(ratio - 1) <= 0.05:
        return "level"
    ahead = ratio < 1 if row["better"] == "lower" else ratio > 1
    return "win" if ahead else "loss"


def rows_table(rows: list[dict[str, Any]], link: dict[int, str] | None = None) -> str:
    """A markdown table of result rows (`link` maps a row's index to a page to name it by).

    The metric carries an arrow, ↓ where lower is better and ↑ where higher is; the machine
    and the command are in each page's notes below its table.
    """
    lines = [
        "| task | what | metric | ours | peer | peer's | ratio | seeds | date |",
        "|---|---|---|---:|---|---:|---:|---|---|",
    ]
    for i, row in enumerate(rows):
        seeds = row["seeds"]
        seed_text = (
            f"{seeds[0]}-{seeds[-1]}"
            if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1))
            else ", ".join(map(str, seeds)) or "-"
        )
        task = row["task"] if not link or i not in link else f"[{row['task']}]({link[i]})"
        arrow = "↓" if row["better"] == "lower" else "↑"
        cells = [
            task,
            row["algorithm"],
            f"{row['metric']} {arrow}",
            _figure(row["ours"]),
            row["peer"],
            _figure(row["peer_value"]),
            f"**{row['ratio']:.2f}x** ({_verdict(row)})",
            seed_text,
            row["date"],
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def bar_chart(rows: list[dict[str, Any]], title: str) -> str:
    """An SVG of each row's ratio on a log scale around 1 (green: ahead, red: behind)."""
    bar, gap, left, width = 18, 6, 330, 360
    height = 40 + len(rows) * (bar + gap) + 30
    span = max([2.0] + [max(r["ratio"], 1 / r["ratio"]) for r in rows if r["ratio"] > 0])
    half = math.log(span) * 1.1

    def x(ratio: float) -> float:
        return left + width / 2 + math.log(ratio) / half * width / 2

    colour = {"win": _WIN, "loss": _LOSS, "level": _LEVEL}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 70}" height="{height}" '
        f'font-family="sans-serif" font-size="12" role="img"><title>{html.escape(title)}</title>',
        f'<text x="10" y="20" font-size="14" font-weight="bold">{html.escape(title)}</text>',
    ]
    for i, row in enumerate(rows):
        y = 40 + i * (bar + gap)
        label = f"{row['task']} · {row['algorithm']} vs {row['peer']}"
        if len(label) > 52:
            label = label[:51] + "…"
        one, end = x(1.0), x(row["ratio"])
        parts.append(
            f'<text x="{left - 8}" y="{y + 13}" text-anchor="end">{html.escape(label)}</text>'
            f'<rect x="{min(one, end):.1f}" y="{y}" width="{abs(end - one):.1f}" height="{bar}" '
            f'fill="{colour[_verdict(row)]}"><title>{html.escape(row["metric"])}</title></rect>'
            f'<text x="{max(one, end) + 4:.1f}" y="{y + 13}">{row["ratio"]:.2f}x</text>'
        )
    bottom = 40 + len(rows) * (bar + gap)
    parts.append(
        f'<line x1="{x(1.0):.1f}" y1="32" x2="{x(1.0):.1f}" y2="{bottom}" stroke="#000"/>'
        f'<text x="{x(1.0):.1f}" y="{bottom + 16}" text-anchor="middle">'
        "ours / peer = 1 (log scale; green: ahead, red: behind, grey: within 5%)</text></svg>"
    )
    return "".join(parts) + "\n"


def curve_chart(row: dict[str, Any]) -> str:
    """An SVG of a row's learning curves: each side's median seed, its seeds' range shaded."""
    curves = row["curves"]
    xs = curves["x"]
    left, top, width, height = 60, 30, 680, 240
    values = [v for side in ("ours", "peer") for seed in curves.get(side, []) for v in seed]
    low, high = min(values), max(values)
    high = high if high > low else low + 1

    def point(i: int, v: float) -> str:
        px = left + (xs[i] - xs[0]) / ((xs[-1] - xs[0]) or 1) * width
        return f"{px:.1f},{top + height - (v - low) / (high - low) * height:.1f}"

    title = f"{row['task']} · {row['algorithm']} against {row['peer']}"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" '
        f'height="{top + height + 50}" font-family="sans-serif" font-size="12" role="img">'
        f"<title>{html.escape(title)}</title>"
        f'<text x="{left}" y="18" font-size="14" font-weight="bold">{html.escape(title)}</text>'
        f'<rect x="{left}" y="{top}" width="{width}" height="{height}" fill="none" stroke="#999"/>'
    ]
    for side, colour in (("ours", "#1565c0"), ("peer", "#ef6c00")):
        seeds = curves.get(side) or []
        if not seeds:
            continue
        columns = list(zip(*seeds, strict=True))
        lows = [min(c) for c in columns]
        highs = [max(c) for c in columns]
        medians = [statistics.median(c) for c in columns]
        band = [point(i, v) for i, v in enumerate(highs)]
        band += [point(i, v) for i, v in reversed(list(enumerate(lows)))]
        line = " ".join(point(i, v) for i, v in enumerate(medians))
        name = "ours" if side == "ours" else row["peer"]
        parts.append(
            f'<polygon points="{" ".join(band)}" fill="{colour}" fill-opacity="0.2"/>'
            f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2">'
            f"<title>{html.escape(name)}: {len(seeds)} seeds</title></polyline>"
        )
    parts.append(
        f'<text x="{left}" y="{top + height + 18}">{_figure(xs[0])}</text>'
        f'<text x="{left + width}" y="{top + height + 18}" text-anchor="end">'
        f"{_figure(xs[-1])} {html.escape(curves.get('x_label', 'env steps'))}</text>"
        f'<text x="{left + 6}" y="{top + 16}" fill="#555">'
        f"{html.escape(curves.get('y_label', 'return'))}</text>"
        f'<text x="{left - 6}" y="{top + 10}" text-anchor="end">{_figure(high)}</text>'
        f'<text x="{left - 6}" y="{top + height}" text-anchor="end">{_figure(low)}</text>'
        f'<text x="{left}" y="{top + height + 38}" fill="#1565c0">ours</text>'
        f'<text x="{left + 50}" y="{top + height + 38}" fill="#ef6c00">'
        f"{html.escape(row['peer'])} (median seed; the seeds' range shaded)</text></svg>"
    )
    return "".join(parts) + "\n"


def _indent(text: str) -> str:
    return "\n".join(("    " + line) if line.strip() else "" for line in text.splitlines())


def render(name: str, data: dict[str, Any], depth: int) -> tuple[str, dict[str, str]]:
    """The markdown of result file `name`, and the SVG files it links to (path: content)."""
    up = "../" * depth
    svgs: dict[str, str] = {}
    out = []
    if data.get("description"):
        out.append(data["description"] + "\n")
    rows = data["rows"]
    if rows:
        svgs[f"results/{name}-ratios.svg"] = bar_chart(rows, data["title"])
        out.append(f"![Ratios against the peers: {data['title']}]({up}results/{name}-ratios.svg)\n")
        out.append(rows_table(rows))
        out.append("Each row's command, machine and note:\n")
        for row in rows:
            note = f" {row['note']}" if row.get("note") else ""
            machine = f"{row['machine']['cpu']}, {row['machine']['cores']} cores"
            out.append(
                f"- **{row['task']}, {row['algorithm']}**: `{row['command']}` ({machine}).{note}"
            )
        out.append("")
        for i, row in enumerate(rows):
            if row.get("curves"):
                path = f"results/{name}-curves-{i}.svg"
                svgs[path] = curve_chart(row)
                out.append(f"![Learning curves: {row['task']}, {row['algorithm']}]({up}{path})\n")
    if data["history"]:
        out.append("## Measurement history\n")
        for entry in data["history"]:
            title = f"{entry['title']} ({entry['date']})".replace('"', "'")
            out.append(f'??? note "{title}"\n\n{_indent(entry["text"])}\n')
    return "\n".join(out), svgs


def _summary(everything: dict[str, dict[str, Any]], depth: int) -> tuple[str, dict[str, str]]:
    rows, link = [], {}
    for name, data in everything.items():
        for row in data["rows"]:
            link[len(rows)] = f"{'../' * depth}results/{name}.md"
            rows.append(row)
    svg = bar_chart(rows, "Every result row: ours against the peer")
    text = f"![Every result row's ratio]({'../' * depth}results/all-ratios.svg)\n\n"
    return text + rows_table(rows, link), {"results/all-ratios.svg": svg}


def _root(config: Any) -> str:
    return os.path.dirname(os.path.abspath(config["config_file_path"]))


def on_files(files: Any, config: Any) -> Any:
    """Add the charts every result file and the summary need to the site."""
    from mkdocs.structure.files import File

    everything = _load_all(_root(config))
    svgs: dict[str, str] = {}
    for name, data in everything.items():
        svgs.update(render(name, data, 0)[1])
    svgs.update(_summary(everything, 0)[1])
    for path, content in svgs.items():
        files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each `<!-- results: NAME -->` line with that result file, rendered."""
    if not _INCLUDE.search(markdown):
        return markdown
    everything = _load_all(_root(config))
    depth = page.file.src_uri.count("/")

    def include(match: re.Match[str]) -> str:
        name = match["name"]
        if name == "*":
            return _summary(everything, depth)[0]
        if name not in everything:
            raise ValueError(
                f"{page.file.src_uri}: no result file benchmarks/results/{name}.json; "
                f"there are: {', '.join(everything)}"
            )
        if match["algorithms"]:
            return _rows_of(name, everything[name], match["algorithms"].split(","), depth, page)
        return render(name, everything[name], depth)[0]

    return _INCLUDE.sub(include, markdown)


def _rows_of(name: str, data: dict[str, Any], algorithms: list[str], depth: int, page: Any) -> str:
    """The rows of result file `name` whose algorithm is one of `algorithms` (or starts so)."""
    rows = [r for r in data["rows"] if any(r["algorithm"].startswith(a) for a in algorithms)]
    if not rows:
        raise ValueError(f"{page.file.src_uri}: {name}.json has no row of {algorithms}")
    link = f"[{data['title']}]({'../' * depth}results/{name}.md)"
    more = f"\nThe whole file, with its history: {link}.\n"
    return rows_table(rows) + more

"""The dashboard's HTML: whole pages, and the fragments that live updates replace.

Every page is a frame around named fragments (`<div id="workers">`...). The same functions
render a fragment for the first page load and for each live update, which sends it over the
WebSocket for the browser to swap in: one renderer, so escaping happens in one place. Every
string that comes from users or remote peers (class names, host names, reasons, log lines)
goes through `esc`; numbers are formatted here. Pages carry no inline script or style, so the
Content-Security-Policy can forbid both.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from parl_dashboard._data import STATES

__all__ = [
    "actor_filters",
    "actor_fragments",
    "actors_body",
    "clients_body",
    "clients_fragments",
    "cluster_body",
    "cluster_fragments",
    "esc",
    "fmt_age",
    "fmt_bytes",
    "load_chart",
    "log_head_fragment",
    "log_lines",
    "login_page",
    "message_page",
    "page",
]

_NAV = (
    ("cluster", "/", "Cluster"),
    ("actors", "/actors", "Actors"),
    ("clients", "/clients", "Clients"),
)
_STREAMS = {"stdout": "out", "stderr": "err", "exception": "exc"}
CHART_WINDOW_S = 600.0
"""The load chart spans the last 10 minutes."""


def esc(value: Any) -> str:
    """`value` as text safe inside HTML content and quoted attributes."""
    return html.escape(str(value), quote=True)


def fmt_bytes(n: float) -> str:
    """Bytes for people: 512 B, 3.4 MB, 15.8 GB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_age(seconds: float) -> str:
    """A duration for people: 42s, 3m 05s, 2h 10m, 4d 01h."""
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h {s // 60 % 60:02d}m"
    return f"{s // 86400}d {s // 3600 % 24:02d}h"


def _clock(t: float, *, date: bool = False) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S", time.localtime(t))


def _table(head: Iterable[str], rows: list[str], empty: str) -> str:
    if not rows:
        return f'<p class="empty">{esc(empty)}</p>'
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _pager(info: Mapping[str, int], path: str, query: Mapping[str, str], noun: str) -> str:
    """Links to the previous and next pages of a table, and where this page is."""
    page, pages, total, per_page = info["page"], info["pages"], info["total"], info["per_page"]
    if pages <= 1 and page == 1:
        return ""

    def link(to: int, label: str, rel: str) -> str:
        href = f"{path}?{urlencode({**query, 'page': str(to)})}"
        return f'<a href="{esc(href)}" rel="{rel}" data-page="{to}">{label}</a>'

    first = (page - 1) * per_page + 1
    shown = f"{first:,}-{min(first + per_page - 1, total):,}" if first <= total else "none"
    parts = [link(page - 1, "&larr; previous", "prev")] if page > 1 else []
    parts.append(
        f'<span class="where">page {page:,} of {pages:,} · {noun} {shown} of {total:,}</span>'
    )
    if page < pages:
        parts.append(link(page + 1, "next &rarr;", "next"))
    return f'<nav class="pager" aria-label="pages">{" ".join(parts)}</nav>'


def _logs_href(actor_id: str) -> str:
    return f"/actors/{quote(actor_id, safe='')}/logs"


# -- frame ---------------------------------------------------------------------------------------
def page(title: str, active: str, body: str, *, live: Mapping[str, Any] | None = None) -> str:
    """A whole page: header, navigation, and `body`; `live` is the query of its live updates."""
    nav = "".join(
        f'<a href="{href}"{" class=on" if key == active else ""}>{label}</a>'
        for key, href, label in _NAV
    )
    live_attr = f' data-live="{esc(urlencode(live))}"' if live is not None else ""
    status = '<span id="live-status" class="live-status">connecting</span>' if live else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · PARL dashboard</title>"
        '<link rel="stylesheet" href="/static/style.css">'
        '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">'
        '<script src="/static/app.js" defer></script></head>'
        f'<body{live_attr}><header><a class="brand" href="/">PARL</a><nav>{nav}</nav>{status}'
        f"</header><main>{body}</main></body></html>"
    )


def message_page(title: str, message: str) -> str:
    """A page that only says something (an unknown actor, a refused request)."""
    return page(title, "", f'<h1>{esc(title)}</h1><p class="empty">{esc(message)}</p>')


def login_page(next_path: str, error: str = "") -> str:
    """The form that asks for the cluster token."""
    problem = f'<p class="error">{esc(error)}</p>' if error else ""
    return page(
        "Log in",
        "",
        '<section class="login"><h1>PARL dashboard</h1>'
        "<p>This cluster listens beyond this machine, so its dashboard asks for the cluster "
        "token: the value of <code>PARL_CLUSTER_TOKEN</code>, or the file "
        "<code>~/.parl/token</code> on the machine that ran <code>xparl start</code>.</p>"
        f'{problem}<form method="post" action="/login">'
        f'<input type="hidden" name="next" value="{esc(next_path)}">'
        '<label>Cluster token <input type="password" name="token" autocomplete="off" autofocus>'
        '</label><button type="submit">Log in</button></form></section>',
    )


# -- cluster ---------------------------------------------------------------------------------------
def load_chart(history: Sequence[Sequence[float]], mem_total: int, now: float) -> str:
    """An inline SVG of a worker's CPU and memory use over the last 10 minutes."""
    width, height = 300, 60
    start = now - CHART_WINDOW_S

    def points(values: list[tuple[float, float]]) -> str:
        out = []
        for t, fraction in values:
            if t < start:
                continue
            x = (t - start) / CHART_WINDOW_S * width
            y = height - 1 - min(max(fraction, 0.0), 1.0) * (height - 2)
            out.append(f"{x:.1f},{y:.1f}")
        return " ".join(out)

    cpu = points([(t, c / 100.0) for t, c, _ in history])
    mem = points([(t, m / mem_total if mem_total else 0.0) for t, _, m in history])
    recent = [c for t, c, _ in history if t >= start]
    peak = max(recent, default=0.0)
    summary = f"CPU peak {peak:.0f}% over the last 10 minutes"
    return (
        f'<svg class="chart" viewBox="0 0 {width} {height}" preserveAspectRatio="none" '
        f'role="img" aria-label="{summary}"><title>{summary}</title>'
        f'<line class="grid" x1="0" y1="{height / 2}" x2="{width}" y2="{height / 2}"/>'
        f'<polyline class="mem" points="{mem}"/><polyline class="cpu" points="{cpu}"/></svg>'
        '<div class="axis"><span>10 min ago</span><span>'
        '<i class="key cpu"></i>CPU <i class="key mem"></i>memory</span><span>now</span></div>'
    )


def _worker_row(w: dict[str, Any], now: float) -> str:
    mem_pct = 100.0 * w["mem_used"] / w["mem_total"] if w["mem_total"] else 0.0
    gpus = ", ".join(w["gpus"]) or "none"
    return (
        f'<tr id="worker-{esc(w["worker_id"])}">'
        f'<td><span class="mono">{esc(w["worker_id"])}</span>'
        f'<div class="sub">pid {w["pid"]} · GPUs {esc(gpus)}</div></td>'
        f'<td>{esc(w["hostname"])}<div class="sub">{esc(w["host"])}</div></td>'
        f'<td class="num"><span class="slots">{w["cpu_used"]}/{w["cpu_num"]}</span>'
        f'<meter min="0" max="{w["cpu_num"]}" value="{w["cpu_used"]}"></meter></td>'
        f'<td class="num">{w["cpu_percent"]:.0f}%'
        f'<div class="sub">load {w["load_avg"]:.2f}</div></td>'
        f'<td class="num">{fmt_bytes(w["mem_used"])} / {fmt_bytes(w["mem_total"])}'
        f'<div class="sub">{mem_pct:.0f}%</div></td>'
        f'<td class="num">{fmt_age(w["uptime_s"])}</td>'
        f'<td class="chart-cell">{load_chart(w["history"], w["mem_total"], now)}</td></tr>'
    )


def cluster_fragments(data: dict[str, Any]) -> dict[str, str]:
    """The cluster page's fragments: the master line, the totals and the workers."""
    now = time.time()
    t, master = data["totals"], data["master"]
    cards = [
        ("workers", "Workers", str(t["workers"]), ""),
        (
            "slots",
            "CPU slots used",
            f"{t['cpu_used']}/{t['cpu_total']}",
            f"{t['cpu_vacant']} vacant",
        ),
        ("actors", "Actors", str(t["actors"]), f"{t['ended_actors']} recently ended"),
        ("clients", "Clients", str(t["clients"]), ""),
        ("memory", "Memory used", fmt_bytes(t["mem_used"]), f"of {fmt_bytes(t['mem_total'])}"),
    ]
    totals = "".join(
        f'<div class="card"><div class="label">{label}</div>'
        f'<div class="value" id="total-{key}">{esc(value)}</div>'
        f'<div class="sub">{esc(sub)}</div></div>'
        for key, label, value, sub in cards
    )
    rows = [_worker_row(w, now) for w in data["workers"]]
    pager = _pager(data["page"], "/", {}, "workers")
    return {
        "master": (
            f'cluster <span class="mono">{esc(data["cluster_id"])}</span> · master '
            f"{esc(master.get('host'))}:{esc(master.get('port'))} (pid {esc(master.get('pid'))}) "
            f"· up {fmt_age(master.get('uptime_s', 0))}"
        ),
        "totals": totals,
        "workers": _table(
            ["Worker", "Host", "Slots used", "CPU", "Memory", "Uptime", "Load, last 10 minutes"],
            rows,
            "No worker has joined yet: add one with `xparl connect --address HOST:PORT`."
            if not t["workers"]
            else "No worker on this page.",
        )
        + pager,
    }


def cluster_body(f: dict[str, str]) -> str:
    """The cluster page around its fragments."""
    return (
        f'<h1>Cluster</h1><p class="sub" id="master">{f["master"]}</p>'
        f'<section class="cards" id="totals">{f["totals"]}</section>'
        f'<h2>Workers</h2><div id="workers">{f["workers"]}</div>'
    )


# -- actors ---------------------------------------------------------------------------------------
def _state(a: dict[str, Any]) -> str:
    why = f'<div class="why">{esc(a["reason"])}</div>' if a["state"] == "dead" else ""
    state = a["state"] if a["state"] in STATES else "unknown"
    return f'<span class="state s-{state}">{esc(a["state"])}</span>{why}'


def _replaces(a: dict[str, Any]) -> str:
    """Which dead actor `a` replaced, and why that one ended (nothing for a first actor)."""
    if not a.get("replaces"):
        return ""
    why = f": {esc(a['replaced_reason'])}" if a.get("replaced_reason") else ""
    href = esc(_logs_href(a["replaces"]))
    return (
        f'<div class="sub replaces">replaces <a class="mono" href="{href}">'
        f"{esc(a['replaces'])}</a>{why}</div>"
    )


def _actor_row(a: dict[str, Any]) -> str:
    href = esc(_logs_href(a["actor_id"]))
    worker = a["worker_hostname"] or a["host"]
    dead = ' class="ended"' if a["state"] == "dead" else ""
    return (
        f'<tr id="actor-{esc(a["actor_id"])}"{dead}>'
        f'<td><a class="mono" href="{href}">{esc(a["actor_id"])}</a></td>'
        f'<td class="cls">{esc(a["class_name"])}{_replaces(a)}</td>'
        f'<td><a class="mono" href="/actors?{esc(urlencode({"client": a["client_id"]}))}">'
        f"{esc(a['client_id'])}</a></td>"
        f'<td>{esc(worker)}<div class="sub mono">{esc(a["worker_id"])} · pid {a["pid"]}</div></td>'
        f"<td>{_state(a)}</td>"
        f'<td class="num">{a["calls"]}</td><td class="num">{a["errors"]}</td>'
        f'<td class="num">{a["cpu_percent"]:.0f}%</td>'
        f'<td class="num">{fmt_bytes(a["rss_bytes"])}</td>'
        f'<td class="num">{fmt_age(a["uptime_s"])}</td>'
        f'<td><a href="{href}">logs</a></td></tr>'
    )


def actor_fragments(data: dict[str, Any], client: str = "", state: str = "") -> dict[str, str]:
    """The actors page's fragments: the counts and a page of the table (`actors_data`'s)."""
    filters = {k: v for k, v in (("client", client), ("state", state)) if v}
    return {
        "actor-counts": f"{data['live']} live · {data['ended']} recently ended",
        "actors": _table(
            [
                "Actor",
                "Class",
                "Client",
                "Worker",
                "State",
                "Calls",
                "Errors",
                "CPU",
                "RSS",
                "Uptime",
                "",
            ],
            [_actor_row(a) for a in data["actors"]],
            "No actor on this page." if data["page"]["total"] else "No actor matches.",
        )
        + _pager(data["page"], "/actors", filters, "actors"),
    }


def actor_filters(clients: list[str], client: str, state: str) -> str:
    """The filter form above the actors table (it submits itself when a choice changes)."""

    def options(values: Iterable[str], chosen: str) -> str:
        return "".join(
            f'<option value="{esc(v)}"{" selected" if v == chosen else ""}>{esc(v or "all")}'
            "</option>"
            for v in values
        )

    return (
        '<form class="filters" method="get" action="/actors">'
        f'<label>Client <select name="client">{options(["", *clients], client)}</select></label>'
        f'<label>State <select name="state">{options(["", "live", *STATES], state)}</select>'
        '</label><button type="submit">Filter</button></form>'
    )


def actors_body(f: dict[str, str], filters: str) -> str:
    """The actors page around its fragments, below the filter form."""
    return (
        f'<h1>Actors</h1>{filters}<p class="sub" id="actor-counts">{f["actor-counts"]}</p>'
        f'<div id="actors">{f["actors"]}</div>'
    )


# -- clients --------------------------------------------------------------------------------------
def clients_fragments(data: dict[str, Any]) -> dict[str, str]:
    """The clients page's table (a page of `clients_data`'s)."""
    clients = data["clients"]
    now = time.time()
    rows = [
        f'<tr id="client-{esc(c["client_id"])}"><td class="mono">{esc(c["client_id"])}</td>'
        f'<td>{esc(c["hostname"])}</td><td class="num">{c["pid"]}</td>'
        f'<td class="num"><a href="/actors?{esc(urlencode({"client": c["client_id"]}))}">'
        f"{c['actors']}</a></td>"
        f'<td class="num">{c.get("restarts", 0)}</td>'
        f"<td>{_clock(c['connected_at'], date=True)}"
        f'<div class="sub">{fmt_age(now - c["connected_at"])} ago</div></td></tr>'
        for c in clients
    ]
    return {
        "clients": _table(
            ["Client", "Host", "PID", "Actors", "Replaced", "Connected since"],
            rows,
            "No client is connected." if data["page"]["page"] == 1 else "No client on this page.",
        )
        + _pager(data["page"], "/clients", {}, "clients")
    }


def clients_body(f: dict[str, str]) -> str:
    """The clients page around its fragment."""
    return f'<h1>Clients</h1><div id="clients">{f["clients"]}</div>'


# -- logs -----------------------------------------------------------------------------------------
def log_head_fragment(actor: dict[str, Any] | None, actor_id: str, retained: int) -> str:
    """What the log page says about its actor, with the download link."""
    download = (
        f'<a class="button" href="/api/actors/{esc(quote(actor_id, safe=""))}/logs.txt" '
        f"download>Download the whole log ({retained} lines)</a>"
    )
    if actor is None:
        return f'<p class="sub">The master no longer knows this actor.</p>{download}'
    fields = [
        ("Class", f'<span class="cls">{esc(actor["class_name"])}</span>'),
        ("State", _state(actor)),
        ("Client", f'<span class="mono">{esc(actor["client_id"])}</span>'),
        (
            "Worker",
            f"{esc(actor['worker_hostname'] or actor['host'])} "
            f'<span class="mono">{esc(actor["worker_id"])}</span> · pid {actor["pid"]}',
        ),
        ("Calls", f"{actor['calls']} ({actor['errors']} raised)"),
        ("Uptime", fmt_age(actor["uptime_s"])),
    ]
    items = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in fields)
    return f'<dl class="facts">{items}</dl>{download}'


def log_lines(lines: list[dict[str, Any]], *, gap: str = "") -> str:
    """Log entries as HTML, after a note `gap` on lines left out before them."""
    out = [f'<div class="gap">{esc(gap)}</div>'] if gap else []
    for line in lines:
        kind = _STREAMS.get(line["stream"], "out")
        head = f'<span class="n">{line["n"]}</span><span class="t">{_clock(line["time"])}</span>'
        if kind == "exc":
            out.append(f'<div class="ln exc">{head}<pre class="x">{esc(line["text"])}</pre></div>')
        else:
            text = f'<span class="x">{esc(line["text"])}</span>'
            out.append(f'<div class="ln {kind}">{head}{text}</div>')
    return "".join(out)

"""One run's report as a self-contained HTML page.

Inline CSS and inline SVG only (no scripts, fonts, images or links to fetch), so it can be
mailed, archived or opened offline years later and still show the same thing: throughput over
time, time per stage, failures with reasons, retries, documents.
"""

from __future__ import annotations

import html
import time
from typing import Any

from ..pipeline.types import STAGES
from .wording import failures_heading

_MAX_ROWS = 500  # table rows in the HTML; the JSON has everything


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:70em;color:#222;padding:0 1em}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.15em;margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.2em .8em;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
th{background:#f6f6f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#17693a}.bad{color:#b3261e}.muted{color:#777}.cards{display:flex;gap:1em;flex-wrap:wrap}
.card{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;min-width:8em}.card b{display:block;font-size:1.4em}
svg text{font:11px system-ui,sans-serif;fill:#444}
"""
_COLORS = {"render": "#7aa6c2", "vision": "#e3a34b", "prefill": "#9b7fc4", "decode": "#5aa469"}


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _table(headers: list[str], rows: list[list[Any]], numeric: set[int] = frozenset()) -> str:
    if not rows:
        return '<p class="muted">none</p>'
    more = f'<p class="muted">{len(rows) - _MAX_ROWS} more in the JSON report</p>' if len(rows) > _MAX_ROWS else ""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f'<td{" class=n" if i in numeric else ""}>{_e("" if v is None else v)}</td>' for i, v in enumerate(r)) + "</tr>"
        for r in rows[:_MAX_ROWS]
    )
    return f"<table><tr>{head}</tr>{body}</table>{more}"


def throughput_svg(timeline: list, seconds: float, width: int = 640, height: int = 200) -> str:
    """Page attempts finished over time (retries count: they are work done): a cumulative
    line, plus bars per time bucket. Time 0 is the start of the run, planning included."""
    if not timeline:
        return '<p class="muted">no pages ran in this run</p>'
    left, bottom, top, right = 44, 28, 10, 10
    w, h = width - left - right, height - top - bottom
    span = max(seconds, max(t for t, _, _ in timeline), 1e-6)
    n = len(timeline)
    buckets = min(30, max(1, n))
    counts = [0] * buckets
    for t, _, _ in timeline:
        counts[min(buckets - 1, int(t / span * buckets))] += 1
    peak = max(counts)
    parts = [f'<svg width="{width}" height="{height}" role="img" '
             f'aria-label="page attempts finished over time">']
    bw = w / buckets
    for i, c in enumerate(counts):
        bh = h * c / peak if peak else 0
        parts.append(f'<rect x="{left + i * bw + 1:.1f}" y="{top + h - bh:.1f}" width="{max(bw - 2, 1):.1f}" height="{bh:.1f}" '
                     f'fill="#cfe0ec"><title>{c} page attempt(s) in {span / buckets:.1f} s</title></rect>')
    pts = " ".join(f"{left + w * t / span:.1f},{top + h - h * k / n:.1f}" for t, k, _ in [(0.0, 0, "")] + list(timeline))
    parts.append(f'<polyline points="{pts}" fill="none" stroke="#2b6a99" stroke-width="2"/>')
    parts.append(f'<line x1="{left}" y1="{top + h}" x2="{left + w}" y2="{top + h}" stroke="#999"/>')
    parts.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + h}" stroke="#999"/>')
    parts.append(f'<text x="{left - 6}" y="{top + 4}" text-anchor="end">{n}</text>')
    parts.append(f'<text x="{left - 6}" y="{top + h}" text-anchor="end">0</text>')
    parts.append(f'<text x="{left}" y="{height - 8}">0 s</text>')
    parts.append(f'<text x="{left + w}" y="{height - 8}" text-anchor="end">{span:.1f} s</text>')
    parts.append(f'<text x="{left + w / 2}" y="{height - 8}" text-anchor="middle">line: page attempts finished (cumulative); '
                 f'bars: per {span / buckets:.1f} s (peak {peak})</text>')
    parts.append("</svg>")
    return "".join(parts)


def stages_svg(stage_seconds: dict, width: int = 640) -> str:
    """Total wall seconds per stage, summed over pages (stages overlap in time, so the sum can
    exceed the run's duration; decode counts every step a page took part in)."""
    total = sum(stage_seconds.values())
    if total <= 0:
        return '<p class="muted">no stage time recorded</p>'
    row, left, bar_w = 24, 70, width - 70 - 110
    peak = max(stage_seconds.values())
    parts = [f'<svg width="{width}" height="{row * len(STAGES) + 8}" role="img" '
             f'aria-label="seconds per stage">']
    for i, s in enumerate(STAGES):
        v = stage_seconds.get(s, 0.0)
        y = 4 + i * row
        bw = bar_w * v / peak if peak else 0
        parts.append(f'<text x="{left - 8}" y="{y + 15}" text-anchor="end">{s}</text>')
        parts.append(f'<rect x="{left}" y="{y + 3}" width="{bw:.1f}" height="{row - 8}" fill="{_COLORS[s]}"/>')
        parts.append(f'<text x="{left + bw + 6:.1f}" y="{y + 15}">{v:.2f} s ({100 * v / total:.0f}%)</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(s: dict) -> str:
    p = s["pages"]
    ok = s["exit_code"] == 0
    doc_failures = sum(f["page"] is None for f in s["failures"])
    cards = [
        ("status", f'{s["status"]} (exit {s["exit_code"]})'),
        ("duration", f'{s["seconds"]:.1f} s'),
        ("pages done", p["done"]),
        ("pages retried", p["retried"]),
        ("pages failed", p["failed"]),
        ("documents failed", doc_failures),
        ("pages/min", f'{p["pages_per_minute"]:.1f}'),
        ("tokens/s", f'{p["tokens_per_second"]:.1f}'),
    ]
    card_html = "".join(f'<div class="card"><span class="muted">{_e(k)}</span><b>{_e(v)}</b></div>' for k, v in cards)
    lists = s.get("document_lists", {})
    docs = [[k, v, "; ".join(lists.get(k, [])[:50]) + (" ..." if len(lists.get(k, [])) > 50 else "")]
            for k, v in s["documents"].items()]
    state = [[kind, st, n] for kind in ("documents", "pages") for st, n in sorted(s["state"][kind].items())]
    failures = [[f["path"], f["page"] or "(document)", f["reason"], f["attempts"] or ""] for f in s["failures"]]
    retries = [[r["path"], r["page"], r["attempt"], f'{r["temperature"]:g}', r["seed"], r["error"] or r["finish_reason"], r["outcome"]]
               for r in s["retries"]]
    notes = "".join(f"<li>{_e(n)}</li>" for n in s["notes"]) or '<li class="muted">none</li>'
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(s["job"])}: run {s["run"]}</title><style>{_CSS}</style></head>
<body>
<h1>Archive job <code>{_e(s["job"])}</code>, run {s["run"]}</h1>
<p class="muted">{_e(s["job_file"])} · {_e(s["host"])} · {_e(s["executor"])} · {_when(s["started"])} to {_when(s["finished"])}</p>
<p class="{'ok' if ok else 'bad'}">{'No failures.' if ok and not s["failures"] else failures_heading(s["failures"]) + '.'}</p>
<div class="cards">{card_html}</div>
<h2>Throughput over time</h2>{throughput_svg(s["timeline"], s["seconds"])}
<h2>Time per stage</h2>{stages_svg(s["stage_seconds"])}
<h2>Failures</h2>{_table(["document", "page", "reason", "attempts"], failures)}
<h2>Retries</h2>{_table(["document", "page", "attempt", "temperature", "seed", "why", "outcome"], retries, {1, 2, 4})}
<h2>Documents this run</h2>{_table(["what", "count", "which"], docs, {1})}
<h2>Job state after the run</h2>{_table(["of", "status", "count"], state, {2})}
<h2>Notes</h2><ul>{notes}</ul>
</body></html>
"""

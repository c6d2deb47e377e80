"""The whole status page (``render``) and ``status.json`` (``status_json``) from one summary.

The sections, each with an ``id`` a test or a script can find: ``now`` (who serves, since when,
the mode, a switch in progress), ``next``, ``week`` (the SVG of ``html.py`` and its legend),
``recent`` (the last switches, their outcome and phase timings), ``gpus`` and ``frontdoor``.  When
the daemon has not answered for a while the page says since when (``stale``) and shows what it
last heard.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpushift.statuspage.timeline import REFRESH_S, SCRIPT, STYLE, esc, legend, timeline, when, zone_of

#: The phases in the order a switch runs them (the columns of "last switches").
PHASE_ORDER = (
    "preflight",
    "drain",
    "stop",
    "release",
    "start",
    "ready",
    "warmup",
    "version",
    "hooks",
    "rollback",
)


def _serving(summary: Mapping[str, Any]) -> str:
    tz = zone_of(summary)
    serving = summary.get("serving") or {}
    backend = serving.get("backend")
    if backend is None:
        who = '<strong id="serving" data-backend="">unknown</strong>'
    elif backend == "off":
        who = '<strong id="serving" data-backend="off">nothing (off: the GPUs are free)</strong>'
    else:
        who = f'<strong id="serving" data-backend="{esc(backend)}">{esc(backend)}</strong>'
    since = f" since {when(serving['since'], tz)}" if serving.get("since") else ""
    lines = [f"<p>Serving: {who}{since}</p>"]
    mode = summary.get("mode") or "unknown"
    ov = summary.get("override") or {}
    if mode == "hold":
        lines.append(
            f'<p id="mode">Held on {esc(ov.get("backend"))} until a person resumes the schedule.</p>'
        )
    elif mode == "override":
        lines.append(
            f'<p id="mode">Override: {esc(ov.get("backend"))} until {when(ov.get("until"), tz)}, then the schedule.</p>'
        )
    elif mode == "manual":
        lines.append('<p id="mode">No schedule: switches happen only when asked.</p>')
    else:
        lines.append('<p id="mode">Following the schedule.</p>')
    sw = summary.get("switch")
    if sw:
        lines.append(
            f'<p id="switch" data-phase="{esc(sw.get("phase") or "")}" data-to="{esc(sw.get("to") or "")}">'
            f"Switching from {esc(sw.get('from') or 'nothing')} to {esc(sw.get('to') or '?')}: "
            f"phase <strong>{esc(sw.get('phase') or '?')}</strong>, {esc(sw.get('elapsed_s'))} s so far.</p>"
        )
    return '<section id="now">' + "".join(lines) + "</section>"


def _next(summary: Mapping[str, Any]) -> str:
    tz = zone_of(summary)
    items = [
        f'<li data-backend="{esc(n.get("backend") or "")}">{when(n.get("at"), tz)}: {esc(n.get("backend"))}'
        + (
            f' <span class="muted">({esc(n["source"])})</span>'
            if n.get("source") not in (None, "schedule")
            else ""
        )
        + "</li>"
        for n in summary.get("next") or ()
    ]
    body = f"<ol>{''.join(items)}</ol>" if items else '<p class="muted">None this week.</p>'
    return f'<section id="next"><h2>Next switches</h2>{body}</section>'


def _recent(summary: Mapping[str, Any]) -> str:
    tz = zone_of(summary)
    rows = summary.get("recent") or ()
    if not rows:
        return '<section id="recent"><h2>Last switches</h2><p class="muted">None yet.</p></section>'
    phases = [p for p in PHASE_ORDER if any(p in (r.get("durations_s") or {}) for r in rows)]
    head = "".join(f'<th class="num">{esc(p)}</th>' for p in phases)
    out = [f"<table><tr><th>started</th><th>from</th><th>to</th><th>trigger</th><th>outcome</th>{head}</tr>"]
    for r in rows:
        d = r.get("durations_s") or {}
        outcome = esc(r.get("outcome") or "?")
        if r.get("failed_phase"):
            outcome += f' <span class="muted">in {esc(r["failed_phase"])}</span>'
        cells = "".join(f'<td class="num">{esc(d[p]) + " s" if p in d else ""}</td>' for p in phases)
        out.append(
            f'<tr data-outcome="{esc(r.get("outcome") or "")}"><td>{when(r.get("started_at"), tz)}</td>'
            f"<td>{esc(r.get('from') or '-')}</td><td>{esc(r.get('to') or '-')}</td>"
            f"<td>{esc(r.get('trigger') or '')}</td><td>{outcome}</td>{cells}</tr>"
        )
    out.append("</table>")
    return '<section id="recent"><h2>Last switches</h2>' + "".join(out) + "</section>"


def _mib(v: Any) -> str:
    if not isinstance(v, (int, float)):
        return "unknown"
    return f"{v / 1024:.1f} GiB" if v >= 1024 else f"{v:.0f} MiB"


def _gpus(summary: Mapping[str, Any]) -> str:
    rows = []
    for g in summary.get("gpus") or ():
        rows.append(
            f"<tr><td>{esc(g.get('index'))}</td><td>{esc(g.get('name') or '')}</td>"
            f'<td class="num">{_mib(g.get("used_mib"))}</td><td class="num">{_mib(g.get("total_mib"))}</td>'
            f"<td>{esc(g.get('state'))}</td></tr>"
        )
    sim = ' <span class="warn">(simulated)</span>' if summary.get("simulated") else ""
    body = (
        "<table><tr><th>GPU</th><th>model</th><th>used</th><th>total</th><th>memory</th></tr>"
        + "".join(rows)
        + "</table>"
        if rows
        else '<p class="muted">No GPU read yet.</p>'
    )
    return f'<section id="gpus"><h2>GPU memory{sim}</h2>{body}</section>'


def _frontdoor(summary: Mapping[str, Any]) -> str:
    fd = summary.get("frontdoor")
    if not isinstance(fd, Mapping):
        return ""
    flights = fd.get("in_flight") or {}
    per = ", ".join(f"{esc(b)} {esc(n)}" for b, n in flights.items()) or "none"
    return (
        f'<section id="frontdoor"><h2>Requests</h2><p>Held (waiting for a switch): '
        f'<strong id="held">{esc(fd.get("held"))}</strong>. In flight: <span id="in-flight">{per}</span>.</p></section>'
    )


def render(summary: Mapping[str, Any], stale_since: str | None = None) -> str:
    """The page.  ``stale_since``: the daemon has not answered since then (UTC ISO; ``""``: never);
    what it last said is shown under a warning."""
    tz = zone_of(summary)
    serving = (summary.get("serving") or {}).get("backend")
    title = f"gpushift: {serving}" if serving else "gpushift"
    if stale_since == "":
        stale = '<p class="stale" id="stale">The gpushift daemon is not answering: nothing is known yet.</p>'
    elif stale_since:
        stale = (
            f'<p class="stale" id="stale">The gpushift daemon has not answered since {when(stale_since, tz)}: '
            "this is what it said then.</p>"
        )
    else:
        stale = ""
    zone = (summary.get("week") or {}).get("zone") or "UTC"
    main = "".join(
        [
            "<main>",
            f"<h1>{esc(title)}</h1>",
            stale,
            _serving(summary),
            _next(summary),
            f'<section id="week"><h2>The week <span class="muted">({esc(zone)})</span></h2>',
            timeline(summary),
            legend(summary),
            "</section>",
            _recent(summary),
            _gpus(summary),
            _frontdoor(summary),
            f'<footer class="muted"><p>As of {when(summary.get("generated_at"), tz, "%H:%M:%S")}; '
            f'refreshed every {REFRESH_S} s. The same as data: <a href="status.json">status.json</a>.</p></footer>',
            "</main>",
        ]
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{STYLE}</style></head>\n<body>\n{main}\n"
        f"<script>{SCRIPT}</script>\n</body></html>\n"
    )


def status_json(summary: Mapping[str, Any], stale_since: str | None = None) -> str:
    """``status.json``: the summary itself (plus ``stale_since`` when the daemon is not answering)."""
    doc: dict[str, Any] = dict(summary)
    doc["stale_since"] = stale_since
    return json.dumps(doc, indent=1, sort_keys=False)

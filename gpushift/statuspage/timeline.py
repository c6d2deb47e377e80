"""The status page's week as an inline SVG, its legend, and what the page's parts share (the style,
the refreshing script, escaping, times in the schedule's zone).

No framework: the server renders the whole page (``page.py``); a small script fetches the page
again every :data:`REFRESH_S` seconds and swaps its ``<main>`` (so the page follows a switch
without a reload, and still works, unrefreshed, without JavaScript).  Every value is escaped
(:func:`html.escape`), though the summary holds only names and numbers.

The SVG draws each day of the week as a row on a fixed 24-hour axis (wall-clock time, as
``gpushift schedule --week`` draws it): **one ``<g class="stretch">`` per stretch** of the summary,
with ``data-backend``, ``data-source``, ``data-from`` and ``data-until``, holding a ``<rect>`` per
piece of it (a stretch over several days, or across a skipped hour, has several); the skipped hour
of a spring-forward day is hatched, the repeated hour of a fall-back day outlined, now a red line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any
from zoneinfo import ZoneInfo

from gpushift.schedule.weektext import letters

#: How often the page's script fetches the page again, in seconds.
REFRESH_S = 2
DAY_S = 86_400
LABEL_W, HOUR_W, ROW_H, TOP = 76, 28, 24, 18
WIDTH = LABEL_W + 24 * HOUR_W + 8
#: The backends' fills, in the config's order (then again from the first); off is grey.
FILLS = ("#4db6c6", "#c774c9", "#e0b84a", "#6cbf6a", "#6b8fd6", "#e07a6a")
OFF_FILL = "#bdbdbd"

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:60em}
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.1em;margin:1.4em 0 .4em}
table{border-collapse:collapse}td,th{padding:.15em .7em .15em 0;text-align:left;vertical-align:top;white-space:nowrap}
th{font-weight:600}.num{text-align:right}.muted{color:#666}.warn{color:#a40}
#serving{font-size:1.3em}.stale{background:#fee;padding:.3em .6em}
svg text{font-size:11px;font-family:system-ui,sans-serif}
.swatch{display:inline-block;width:1em;height:1em;vertical-align:middle;margin-right:.3em;border:1px solid #888}
"""

SCRIPT = f"""
(function(){{
  function refresh(){{
    fetch(location.href, {{cache: "no-store"}}).then(function(r){{ return r.ok ? r.text() : null; }})
      .then(function(t){{
        if (!t) return;
        var doc = new DOMParser().parseFromString(t, "text/html");
        var fresh = doc.querySelector("main"), old = document.querySelector("main");
        if (fresh && old) {{ old.replaceWith(fresh); document.title = doc.title; }}
      }}).catch(function(){{}});
  }}
  setInterval(refresh, {REFRESH_S * 1000});
}})();
"""


def esc(v: Any) -> str:
    return escape(str(v), quote=True)


def zone_of(summary: Mapping[str, Any]) -> ZoneInfo | None:
    week = summary.get("week") or {}
    try:
        return ZoneInfo(week["zone"]) if week.get("zone") else None
    except (KeyError, ValueError, OSError):
        return None


def _instant(v: Any) -> datetime | None:
    if not isinstance(v, str):
        return None
    try:
        return datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        return None


def when(v: Any, tz: ZoneInfo | None, fmt: str = "%a %Y-%m-%d %H:%M") -> str:
    """``<time>`` of an instant, shown in the schedule's zone (UTC without one)."""
    t = _instant(v)
    if t is None:
        return '<span class="muted">unknown</span>'
    lt = t.astimezone(tz) if tz is not None else t
    return f'<time datetime="{esc(v)}">{esc(f"{lt:{fmt}} {lt.tzname()}")}</time>'


def fills(summary: Mapping[str, Any]) -> dict[str, str]:
    """Each configured backend's fill, and off's."""
    names = [b.get("name") for b in summary.get("backends") or () if isinstance(b, Mapping)]
    out = {str(n): FILLS[i % len(FILLS)] for i, n in enumerate(names) if n}
    out["off"] = OFF_FILL
    return out


# ------------------------------------------------------------------------------------ the SVG


def _x(sec: float) -> float:
    return LABEL_W + sec / 3600 * HOUR_W


def _now_x(day: Mapping[str, Any], now: datetime, tz: ZoneInfo) -> int:
    """Where ``now`` is drawn on ``day``'s axis: its wall-clock seconds (the second pass of a
    repeated hour at that hour's end, as the layout draws it)."""
    local = now.astimezone(tz)
    d = datetime.fromisoformat(str(day["date"]))
    x = int((local.replace(tzinfo=None) - d).total_seconds())
    if local.fold:
        for c in day.get("clock_changes") or ():
            if c.get("kind") == "repeat" and c["x0"] <= x < c["x1"]:
                return int(c["x1"])
    return max(0, min(DAY_S, x))


def _axis(n_days: int) -> list[str]:
    out = []
    bottom = TOP + n_days * ROW_H
    for h in range(0, 25, 2):
        x = _x(h * 3600)
        out.append(f'<line x1="{x:.1f}" y1="{TOP - 4}" x2="{x:.1f}" y2="{bottom}" stroke="#ddd"/>')
        if h < 24:
            out.append(f'<text x="{x + 2:.1f}" y="{TOP - 6}" fill="#666">{h:02d}</text>')
    return out


def _day_marks(i: int, day: Mapping[str, Any]) -> list[str]:
    y = TOP + i * ROW_H
    out = [
        f'<text x="4" y="{y + 16}">{esc(day.get("weekday", ""))} {esc(str(day.get("date", ""))[5:])}</text>'
    ]
    for c in day.get("clock_changes") or ():
        x0, x1 = _x(c["x0"]), _x(c["x1"])
        kind = "gap" if c.get("kind") == "gap" else "repeat"
        fill = 'fill="url(#hatch)"' if kind == "gap" else 'fill="none" stroke="#333" stroke-dasharray="3 2"'
        what = "skipped" if kind == "gap" else "happens twice"
        out.append(
            f'<rect class="clock-{kind}" x="{x0:.1f}" y="{y + 2}" width="{x1 - x0:.1f}" height="{ROW_H - 4}" '
            f"{fill}><title>{esc(c.get('before'))} to {esc(c.get('after'))}: this hour {what}</title></rect>"
        )
    return out


def _stretch_group(s: Mapping[str, Any], pieces: Sequence[tuple[int, Mapping[str, Any]]], paint: Mapping[str, str],
                   marks: Mapping[str, str], tz: ZoneInfo | None) -> str:  # fmt: skip
    """One stretch's ``<g>``: ``pieces`` are (day index, piece) of it."""
    backend = s.get("backend")
    source = str(s.get("source") or "schedule")
    fill = paint.get(str(backend), "#ffffff")
    marked = source != "schedule"
    rects = []
    for i, p in pieces:
        x0, x1, y = _x(p["x0"]), _x(p["x1"]), TOP + i * ROW_H
        edge = ' stroke="#222" stroke-width="1.5"' if marked else ""
        rects.append(
            f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(0.5, x1 - x0):.1f}" height="{ROW_H - 6}" fill="{fill}"{edge}/>'
        )
        letter = marks.get(str(backend), "-" if backend == "off" else "?")
        if p.get("begins") and x1 - x0 >= 9:
            rects.append(
                f'<text x="{x0 + 2:.1f}" y="{y + 16}">{esc(letter.upper() if marked else letter)}</text>'
            )
    label = s.get("exception") or source
    title = f"{backend or 'nothing'} ({label}): {_plain_time(s.get('from'), tz)} to {_plain_time(s.get('until'), tz)}"
    return (
        f'<g class="stretch" data-backend="{esc(backend or "")}" data-source="{esc(source)}" '
        f'data-from="{esc(s.get("from"))}" data-until="{esc(s.get("until"))}"><title>{esc(title)}</title>'
        + "".join(rects)
        + "</g>"
    )


def _plain_time(v: Any, tz: ZoneInfo | None) -> str:
    t = _instant(v)
    if t is None:
        return "?"
    lt = t.astimezone(tz) if tz is not None else t
    return f"{lt:%a %H:%M}"


def timeline(summary: Mapping[str, Any]) -> str:
    """The week as an inline ``<svg>`` (empty without a schedule)."""
    week = summary.get("week")
    if not isinstance(week, Mapping) or not week.get("days"):
        return '<p class="muted">No schedule: gpushift switches only when asked.</p>'
    days: list[Mapping[str, Any]] = list(week["days"])
    tz = zone_of(summary)
    paint = fills(summary)
    marks = letters([b["name"] for b in summary.get("backends") or ()])
    height = TOP + len(days) * ROW_H + 4
    parts = [
        f'<svg id="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="the week\'s schedule">',
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="#999" stroke-width="2"/>'
        "</pattern></defs>",
        *_axis(len(days)),
    ]
    by_stretch: dict[Any, list[tuple[int, Mapping[str, Any]]]] = {}
    for i, day in enumerate(days):
        for p in day.get("pieces") or ():
            by_stretch.setdefault(p.get("stretch"), []).append((i, p))
    for k, s in enumerate(week.get("stretches") or ()):
        parts.append(_stretch_group(s, by_stretch.get(k, []), paint, marks, tz))
    for i, day in enumerate(days):  # over the stretches: the clock's changes stay visible
        parts += _day_marks(i, day)
    now = _instant(summary.get("generated_at"))
    for i, day in enumerate(days):
        t0, t1 = _instant(day.get("from")), _instant(day.get("until"))
        if now is not None and tz is not None and t0 is not None and t1 is not None and t0 <= now < t1:
            x, y = _x(_now_x(day, now, tz)), TOP + i * ROW_H
            parts.append(
                f'<line id="now" x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + ROW_H}" stroke="#d00" stroke-width="2">'
                f"<title>now</title></line>"
            )
    parts.append("</svg>")
    return "\n".join(parts)


def legend(summary: Mapping[str, Any]) -> str:
    paint = fills(summary)
    marks = letters([b["name"] for b in summary.get("backends") or ()])
    items = [
        f'<span class="swatch" style="background:{paint[n]}"></span>{esc(marks.get(n, "-"))} {esc(n)}'
        for n in paint
    ]
    return (
        '<p id="legend">'
        + " &nbsp; ".join(items)
        + ' &nbsp; <span class="muted">outlined, upper case: a calendar exception, an override or a hold;'
        " hatched: an hour the clock skips; dashed: an hour that happens twice</span></p>"
    )

"""``gpushift schedule --week`` and ``gpushift schedule check FILE --week``: the days drawn as a
timeline (the layout is :mod:`gpushift.schedule.week`'s, the text :mod:`gpushift.schedule.weektext`'s).

The override or hold in effect is the daemon's when it answers (``GetStatus``, within
:data:`DAEMON_TIMEOUT_S`), else read from ``override.json`` in the state directory (the runtime
directory's copy first, as the daemon reads it); a note on stderr says which.  A file that is not
installed (``check FILE``) is drawn without one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import date, datetime, timezone
from typing import Any

import click

from gpushift.cli.output import colour_wanted, say, say_json
from gpushift.config import schema as config_mod
from gpushift.errors import GpushiftError
from gpushift.schedule import Schedule
from gpushift.schedule.week import Overlay, Stretch, Week, lay_out
from gpushift.schedule.weektext import Paint, letters, render

UTC = timezone.utc
#: How long ``--week`` waits for the daemon's answer before reading override.json itself.
DAEMON_TIMEOUT_S = 2.0
#: The backends' colours, in the config's order (then again from the first).
PALETTE = ("cyan", "magenta", "yellow", "green", "blue", "red")
#: Where the override came from when the daemon answered (``override_from`` in the JSON).
DAEMON = "the daemon"


def now() -> datetime:
    """The clock the drawing marks (a test sets its own)."""
    return datetime.now(UTC)


def painter(backends: Sequence[str]) -> Paint | None:
    """Colours for the grid's styles (``weektext``'s), None when colour is not wanted."""
    if not colour_wanted():
        return None
    order = {b: i for i, b in enumerate(backends)}

    def paint(text: str, style: str) -> str:
        marked = style.endswith("!")
        key = style.rstrip("!")
        if key.startswith("b:"):
            colour = PALETTE[order.get(key[2:], len(order)) % len(PALETTE)]
            return click.style(text, fg="black", bg=colour, bold=marked or None, underline=marked or None)
        if key == "off":
            return click.style(text, fg="bright_black", bold=marked or None, underline=marked or None)
        if key in ("note", "none"):
            return click.style(text, bold=True)
        if key == "axis":
            return click.style(text, dim=True)
        return text

    return paint


def overlay_of(d: Any) -> Overlay | None:
    """An override document (``Override.to_dict``) as the layout's overlay; None when it is none."""
    if not isinstance(d, dict) or d.get("mode") not in ("override", "hold") or not d.get("backend"):
        return None
    try:
        start = datetime.fromisoformat(str(d["set_at"]))
        until = datetime.fromisoformat(str(d["until"])) if d.get("until") else None
    except (KeyError, ValueError):
        return None
    if start.tzinfo is None or (until is not None and until.tzinfo is None):
        return None
    return Overlay(str(d["mode"]), str(d["backend"]), start, until if d["mode"] == "override" else None)


def overlay_now(cfg: config_mod.Config) -> tuple[Overlay | None, str]:
    """The override or hold in effect, and where it was read (for the note)."""
    from gpushift.bus.lightclient import get_status

    try:
        s = get_status(cfg.daemon.bus, timeout_s=DAEMON_TIMEOUT_S)
        return overlay_of(s.get("override")), DAEMON
    except GpushiftError:
        pass  # not running, not answering, not allowed: what it left on disk
    from gpushift.keeper.store import JsonOverrideStore

    path = os.path.join(cfg.daemon.state_dir, "override.json")
    store = JsonOverrideStore(
        path, backends=set(cfg.backends), fallback=os.path.join(cfg.daemon.runtime_dir, "override.json")
    )
    ov = store.load()
    where = path if not store.ignored else f"{path}, which is ignored: {store.ignored}"
    return (overlay_of(ov.to_dict()) if ov is not None else None), where


def _utc(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stretch_json(s: Stretch, tz: Any) -> dict[str, Any]:
    return {
        "from_utc": _utc(s.start),
        "from_local": s.start.astimezone(tz).isoformat(),
        "until_utc": _utc(s.end),
        "until_local": s.end.astimezone(tz).isoformat(),
        "backend": s.backend,
        "source": s.source,
        "exception": s.label,
        "line": s.line,
    }


def week_json(week: Week, sched: Schedule, overlay_from: str | None) -> dict[str, Any]:
    days = []
    for d in week.days:
        shifts = [
            {
                "kind": s.kind,
                "at_utc": _utc(s.at),
                "from": f"{s.x0 // 3600:02d}:{s.x0 % 3600 // 60:02d}",
                "until": f"{s.x1 // 3600:02d}:{s.x1 % 3600 // 60:02d}",
                "before": s.before_name,
                "after": s.after_name,
            }
            for s in d.shifts
        ]
        days.append(
            {
                "date": d.date.isoformat(),
                "from_utc": _utc(d.start),
                "until_utc": _utc(d.end),
                "hours": d.hours,
                "clock_changes": shifts,
            }
        )
    ov = week.overlay
    return {
        "schedule": sched.path,
        "tz": str(sched.tz),
        "now": _utc(week.now) if week.now else None,
        "days": days,
        "stretches": [stretch_json(s, sched.tz) for s in week.stretches],
        "exceptions": [
            {
                "line": s.line,
                "name": s.name,
                "target": s.target,
                "from_utc": _utc(s.start),
                "until_utc": _utc(s.end),
            }
            for s in week.spans
        ],
        "override": (
            {
                "mode": ov.mode,
                "backend": ov.backend,
                "from_utc": _utc(ov.start),
                "until_utc": _utc(ov.until) if ov.until else None,
            }
            if ov
            else None
        ),
        "override_from": overlay_from,
    }


def draw(
    sched: Schedule,
    backends: Sequence[str],
    first: date | None,
    days: int,
    overlay: Overlay | None,
    overlay_from: str | None,
    as_json: bool,
    zone_note: str,
) -> None:
    """Print the days from ``first`` (default: today in the schedule's zone) as text or JSON."""
    t = now()
    if first is None:
        first = t.astimezone(sched.tz).date()
    try:
        week = lay_out(sched, first, days, now=t, overlay=overlay)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--from") from None
    if as_json:
        say_json(json.dumps(week_json(week, sched, overlay_from), indent=2))
        return
    names = [*backends, *sorted(t for t in sched.targets if t not in backends and t != "off")]
    last = week.days[-1].date
    say(f"Schedule {sched.path} (time zone {sched.tz}, {zone_note})")
    say(f"{first:%a %Y-%m-%d} to {last:%a %Y-%m-%d}, 3 columns an hour (20 minutes each):")
    if not sched.entries and not sched.spans:
        say("The schedule has no entries: it never switches.")
    for line in render(week, letters(names), painter(names)):
        say(line)
    if overlay_from is not None and overlay_from != DAEMON:
        say(f"note: the daemon did not answer: override and hold read from {overlay_from}", err=True)

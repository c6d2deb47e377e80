"""The redacted summary: what the status page may show to anyone who can reach the front door.

:func:`build` is the one place it is made.  It copies fields from the daemon's status document,
its newest ledger rows and the week's layout **by name, from an allowlist**, and each value only
when it has the expected shape: a backend name only when it is a configured one (or ``off``), a
phase, outcome or trigger only when it is one of gpushift's own words, times re-written from a
parsed instant, numbers as numbers, a GPU's model name and a calendar exception's label only when
they are short plain words.  Nothing else passes: no command line (``argv``), environment, API
key or token, unit path, holder PID or command, user name, uid, reason, message, hook output or
error text — not because they are masked, but because no field of the summary can carry them.

The result is plain JSON data (:data:`VERSION` names its shape; ``docs/statuspage.md`` lists the
fields).  It is pure: the daemon calls it with what it holds in memory, at most every 2 s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from gpushift.schedule.week import Week
from gpushift.values import OFF, Outcome, Phase, Trigger

VERSION = 1
#: How many switches of the ledger the page lists, and how many coming switches.
RECENT = 10
COMING = 5
_PHASES = frozenset(p.value for p in Phase)
_OUTCOMES = frozenset(o.value for o in Outcome)
_TRIGGERS = frozenset(t.value for t in Trigger)
_MODES = frozenset({"schedule", "override", "hold", "manual"})
_SOURCES = frozenset({"schedule", "exception", "override", "hold"})
_UNIT_STATES = frozenset(
    {"active", "inactive", "activating", "deactivating", "failed", "reloading", "unknown"}
)
_HEALTH = frozenset({"ok", "failing", "unknown"})
_GPU_STATES = frozenset({"released", "held", "unknown"})
#: A GPU's model name or a calendar exception's label: short, plain (no path, no '=', no '@').
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._()+:-]{0,63}")
_ZONE = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*")
UTC = timezone.utc


def _utc(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(v: Any) -> str | None:
    """An instant (ISO 8601 with an offset, or a datetime) as UTC ``...Z``; None otherwise."""
    if isinstance(v, datetime):
        t = v
    elif isinstance(v, str) and len(v) <= 40:
        try:
            t = datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            return None
    else:
        return None
    return _utc(t) if t.tzinfo is not None and t.utcoffset() is not None else None


def _num(v: Any, digits: int = 1) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return round(float(v), digits)


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31 else None


def _one_of(v: Any, allowed: Collection[str]) -> str | None:
    return v if isinstance(v, str) and v in allowed else None


def _word(v: Any) -> str | None:
    return v if isinstance(v, str) and _WORD.fullmatch(v) else None


def _dict(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


class _Names:
    """The configured backend names (and ``off``): the only names the summary repeats."""

    def __init__(self, backends: Sequence[str]) -> None:
        self.order = [b for b in backends if isinstance(b, str)]
        self.known = frozenset(self.order) | {OFF}

    def __call__(self, v: Any) -> str | None:
        return _one_of(v, self.known)


def _backends(status: Mapping[str, Any], name: _Names) -> list[dict[str, Any]]:
    parts = _dict(status.get("backends"))
    out = []
    for b in name.order:
        entry = _dict(parts.get(b))
        flight = _dict(entry.get("in_flight"))
        out.append(
            {
                "name": b,
                "unit_state": _one_of(entry.get("active_state"), _UNIT_STATES) or "unknown",
                "health": _one_of(_dict(entry.get("health")).get("state"), _HEALTH) or "unknown",
                "in_flight": _count(flight.get("requests")),
            }
        )
    return out


def _mode(status: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """Who decides (schedule, override, hold, manual) and the override's document ({}: none)."""
    ov = _dict(status.get("override"))
    if ov.get("mode") in ("override", "hold"):
        return str(ov["mode"]), ov
    return ("manual" if status.get("schedule") is None else "schedule"), {}


def _switch(status: Mapping[str, Any], name: _Names) -> dict[str, Any] | None:
    cur = _dict(_dict(status.get("daemon")).get("switch"))
    if not cur:
        return None
    return {
        "from": name(cur.get("from")),
        "to": name(cur.get("to")),
        "phase": _one_of(cur.get("phase"), _PHASES),
        "trigger": _one_of(cur.get("trigger"), _TRIGGERS),
        "elapsed_s": _num(cur.get("elapsed_s")),
    }


def _recent(rows: Sequence[Mapping[str, Any]], name: _Names) -> list[dict[str, Any]]:
    out = []
    for r in rows[:RECENT]:
        r = _dict(r)
        durations = {
            p: _num(s, 2)
            for p, s in _dict(r.get("durations_s")).items()
            if p in _PHASES and _num(s) is not None
        }
        out.append(
            {
                "id": _count(r.get("id")),
                "from": name(r.get("from")),
                "to": name(r.get("to")),
                "trigger": _one_of(r.get("trigger"), _TRIGGERS),
                "outcome": _one_of(r.get("outcome"), _OUTCOMES),
                "failed_phase": _one_of(r.get("failed_phase"), _PHASES),
                "started_at": _time(r.get("started_at")),
                "finished_at": _time(r.get("finished_at")),
                "durations_s": durations,
            }
        )
    return out


def _gpus(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    out = []
    for g in status.get("gpus") or ():
        g = _dict(g)
        out.append(
            {
                "index": _count(g.get("index")),
                "name": _word(g.get("name")),
                "used_mib": _num(g.get("used_mib"), 0),
                "total_mib": _num(g.get("total_mib"), 0),
                "state": _one_of(g.get("state"), _GPU_STATES) or "unknown",
            }
        )
    return out


def _frontdoor(status: Mapping[str, Any], name: _Names) -> dict[str, Any] | None:
    fd = status.get("frontdoor")
    if not isinstance(fd, Mapping) or "held" not in fd:
        return None
    flights = _dict(fd.get("in_flight"))
    return {
        "held": _count(fd.get("held")),
        "in_flight": {
            b: n for b, n in ((name(k), _count(v)) for k, v in flights.items()) if b and n is not None
        },
    }


def week_part(week: Week | None, name: _Names) -> dict[str, Any] | None:
    """The layout as data: the stretches, and each day with its clock changes and the pieces of the
    stretches on its 24-hour axis (``x`` in wall-clock seconds), which the page draws as they are."""
    if week is None:
        return None
    stretches = [
        {
            "from": _utc(s.start),
            "until": _utc(s.end),
            "backend": name(s.backend),
            "source": _one_of(s.source, _SOURCES) or "schedule",
            "exception": _word(s.label) if s.source == "exception" else None,
        }
        for s in week.stretches
    ]
    days = []
    for d in week.days:
        days.append(
            {
                "date": d.date.isoformat(),
                "weekday": f"{d.date:%a}",
                "from": _utc(d.start),
                "until": _utc(d.end),
                "hours": _num(d.hours),
                "clock_changes": [
                    {
                        "kind": s.kind,
                        "x0": s.x0,
                        "x1": s.x1,
                        "before": _word(s.before_name),
                        "after": _word(s.after_name),
                    }
                    for s in d.shifts
                ],
                "pieces": [
                    {"x0": p.x0, "x1": p.x1, "stretch": p.stretch, "begins": p.begins} for p in d.pieces
                ],
            }
        )
    zone = str(week.tz)
    return {"zone": zone if _ZONE.fullmatch(zone) else "", "days": days, "stretches": stretches}


def _coming(week: Week | None, now: datetime, name: _Names) -> list[dict[str, Any]]:
    if week is None:
        return []
    out: list[dict[str, Any]] = []
    last = None
    for s in week.stretches:
        if s.start <= now:
            last = s.backend
            continue
        if s.backend != last:
            out.append({"backend": name(s.backend), "at": _utc(s.start), "source": s.source})
        last = s.backend
    return out[:COMING]


def build(
    status: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    week: Week | None,
    backends: Sequence[str],
    now: datetime,
) -> dict[str, Any]:
    """The summary, from the daemon's status document (``Daemon.status()``), its newest ledger rows
    (``SwitchRecord.to_dict()``, newest first), the week's layout (None: no schedule) and the
    configured backends in the config's order."""
    name = _Names(backends)
    mode, ov = _mode(status)
    active = status.get("active")
    return {
        "version": VERSION,
        "generated_at": _utc(now),
        "serving": {
            "backend": name(active),
            "since": _time(status.get("since")) if name(active) not in (None, OFF) else None,
        },
        "mode": _one_of(mode, _MODES),
        "override": (
            {"mode": mode, "backend": name(ov.get("backend")), "until": _time(ov.get("until"))}
            if ov
            else None
        ),
        "switch": _switch(status, name),
        "next": _coming(week, now, name),
        "backends": _backends(status, name),
        "gpus": _gpus(status),
        "simulated": status.get("simulated") is True,
        "recent": _recent(rows, name),
        "frontdoor": _frontdoor(status, name),
        "week": week_part(week, name),
    }


def with_live(
    summary: Mapping[str, Any],
    active: str | None = None,
    switching: bool | None = None,
    target: str = "",
    phase: str = "",
    frontdoor: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``summary`` with what the front door knows sooner laid over it, by the same rules: who serves
    and the switch in flight from the daemon's properties (``active`` None: not known; ``""``
    unknown), the held and in-flight requests from the front door itself."""
    names = [b.get("name") for b in summary.get("backends") or () if isinstance(b, Mapping)]
    name = _Names([n for n in names if isinstance(n, str)])
    out = dict(summary)
    serving = _dict(summary.get("serving"))
    if active is not None:
        backend = name(active)
        since = serving.get("since") if backend == serving.get("backend") else None
        out["serving"] = {"backend": backend, "since": since}
    if switching is not None:
        was = _dict(summary.get("switch"))
        out["switch"] = (
            {
                "from": was.get("from") if was else name(serving.get("backend")),
                "to": name(target),
                "phase": _one_of(phase, _PHASES),
                "trigger": was.get("trigger"),
                "elapsed_s": was.get("elapsed_s") if was.get("to") == name(target) else None,
            }
            if switching
            else None
        )
    if frontdoor is not None:
        out["frontdoor"] = _frontdoor({"frontdoor": frontdoor}, name)
    return out

"""The schedule laid out over days: the stretches of one backend, and where each falls on a day's
24-hour axis — what ``gpushift schedule --week`` draws as text and the status page as SVG.

A **stretch** is a half-open interval ``[start, end)`` of instants during which one backend is in
effect for one reason: the weekly entries (``schedule``), a calendar exception (``exception``), a
person's override until a time (``override``) or a hold until ``gpushift resume`` (``hold``).  The
schedule's own fires decide it (:meth:`Schedule.in_effect`, :meth:`Schedule.next`); an override
or hold in effect is laid over it from when it was set to when it ends.  Consecutive fires naming
the same backend for the same reason are one stretch.

A **day** is a calendar day of the schedule's zone, drawn on a fixed 24-hour axis of wall-clock
time (``x``: seconds since the day's 00:00, 0 to 86,400), whatever its length in hours:

* on a spring-forward day the skipped wall-clock times (``02:00``-``03:00`` in Europe/Berlin)
  exist on the axis but no stretch covers them (a :class:`Shift` of kind ``gap``);
* on a fall-back day the repeated wall-clock times are drawn once, for their first pass; what
  begins in the second pass is drawn at the end of the repeated range (a :class:`Shift` of kind
  ``repeat``) — the same rule that maps a wall-clock time to its first occurrence for the entries.

Each day holds the :class:`Piece` of every stretch that falls on it (a stretch over several days,
or across a gap, has several pieces).  Everything here is pure: aware datetimes in, values out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from gpushift.schedule.evaluate import Fire, Schedule, wall_to_utc
from gpushift.schedule.fires import UTC, as_utc
from gpushift.schedule.span import Span

#: The axis of one day, in wall-clock seconds.
DAY_S = 86_400
#: Most days one layout covers (``--days``).
DAYS_MAX = 31
#: The reasons a backend is in effect, as stretches and JSON name them.
SOURCES = ("schedule", "exception", "override", "hold")
_BATCH = 256  # fires asked of the schedule at a time
_SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class Overlay:
    """An override or hold in effect, laid over the schedule: ``mode`` is ``override`` (until
    ``until``) or ``hold`` (``until`` None: until ``gpushift resume``); ``start`` is when it was set."""

    mode: str
    backend: str
    start: datetime
    until: datetime | None = None


@dataclass(frozen=True)
class Stretch:
    """``backend`` (``off`` included; None: nothing in effect yet) from ``start`` to ``end`` (UTC)."""

    start: datetime
    end: datetime
    backend: str | None
    source: str = "schedule"
    label: str | None = None  # the calendar exception's NAME (else its dates)
    line: int | None = None  # the schedule line behind it (the first fire's)
    since: datetime | None = None  # when it began, if before ``start`` (the first of a layout)

    @property
    def marked(self) -> bool:
        """Not the weekly entries' choice: a calendar exception, an override or a hold."""
        return self.source != "schedule"


@dataclass(frozen=True)
class Shift:
    """The clock changing at instant ``at`` during a day: from UTC offset ``before`` (named
    ``before_name``) to ``after``.  ``x0``-``x1`` are the wall-clock seconds it skips (``gap``) or
    repeats (``repeat``), clipped to the day."""

    at: datetime
    before: timedelta
    after: timedelta
    before_name: str
    after_name: str
    x0: int
    x1: int

    @property
    def kind(self) -> str:
        return "gap" if self.after > self.before else "repeat"


@dataclass(frozen=True)
class Piece:
    """The part of stretch number ``stretch`` on a day's axis, ``[x0, x1)``; ``begins``: the
    stretch starts here (not carried over from the day before or across a gap)."""

    x0: int
    x1: int
    stretch: int
    begins: bool


@dataclass(frozen=True)
class Day:
    date: date
    start: datetime  # the instant of the day's first wall-clock time (UTC)
    end: datetime  # the next day's start
    shifts: tuple[Shift, ...] = ()
    pieces: tuple[Piece, ...] = ()

    @property
    def hours(self) -> float:
        """How long the day is: 24, or 23 and 25 on the days the clock changes."""
        return (self.end - self.start).total_seconds() / 3600

    @property
    def gaps(self) -> tuple[tuple[int, int], ...]:
        return tuple((s.x0, s.x1) for s in self.shifts if s.kind == "gap" and s.x1 > s.x0)


@dataclass(frozen=True)
class Week:
    """The layout of ``days`` (consecutive calendar days) of a schedule."""

    tz: ZoneInfo
    days: tuple[Day, ...]
    stretches: tuple[Stretch, ...]
    spans: tuple[Span, ...] = ()  # the calendar exceptions in force at some time of these days
    overlay: Overlay | None = None  # the override or hold laid over them, if any
    now: datetime | None = None

    @property
    def start(self) -> datetime:
        return self.days[0].start

    @property
    def end(self) -> datetime:
        return self.days[-1].end

    def x_of(self, u: datetime) -> tuple[int, int] | None:
        """(day index, x) where instant ``u`` is drawn; None outside the days."""
        for i, d in enumerate(self.days):
            if d.start <= u < d.end:
                return i, _x(u, d, self.tz)
        return None


# ------------------------------------------------------------------------------------ stretches


def _reason(f: Fire | None) -> tuple[str | None, str, str | None, int | None]:
    if f is None:
        return None, "schedule", None, None
    span = f.in_force
    if span is not None:
        return f.target, "exception", span.label, span.line
    return f.target, "schedule", None, f.entry.line


def schedule_stretches(schedule: Schedule, start: datetime, end: datetime) -> list[Stretch]:
    """The schedule's stretches over ``[start, end)`` (UTC), the first from ``start`` on."""
    first = schedule.in_effect(start)
    points = [(start, *_reason(first))]
    t = start
    while True:
        fires = schedule.next(t, _BATCH)
        inside = [f for f in fires if f.at < end]
        points += [(f.at, *_reason(f)) for f in inside]
        if len(inside) < _BATCH:
            break
        t = fires[-1].at
    out: list[Stretch] = []
    for at, backend, source, label, line in points:
        if out and (out[-1].backend, out[-1].source, out[-1].label) == (backend, source, label):
            continue
        if out:
            out[-1] = _ending(out[-1], at)
        since = first.at if not out and first is not None and first.at < start else None
        out.append(Stretch(at, end, backend, source, label, line, since))
    return out


def _ending(s: Stretch, end: datetime) -> Stretch:
    return Stretch(s.start, end, s.backend, s.source, s.label, s.line, s.since)


def overlaid(stretches: Sequence[Stretch], overlay: Overlay | None, now: datetime | None) -> list[Stretch]:
    """``stretches`` with an override or hold in effect laid over them, from when it was set to its
    end (a hold: to the end of the stretches).  An override already ended at ``now`` changes nothing."""
    if overlay is None or not stretches:
        return list(stretches)
    lo, hi = stretches[0].start, stretches[-1].end
    until = overlay.until if overlay.until is not None else hi
    if now is not None and overlay.until is not None and until <= now:
        return list(stretches)
    o0, o1 = max(as_utc(overlay.start), lo), min(as_utc(until), hi)
    if o0 >= o1:
        return list(stretches)
    out: list[Stretch] = []
    for s in stretches:
        if s.start < o0:
            out.append(_ending(s, min(s.end, o0)))
        if s.end > o1:
            since = s.since if s.start >= o1 else None  # resumed at the overlay's end: it begins there
            out.append(Stretch(max(s.start, o1), s.end, s.backend, s.source, s.label, s.line, since))
    source = "hold" if overlay.mode == "hold" else "override"
    set_at = as_utc(overlay.start)
    out.append(Stretch(o0, o1, overlay.backend, source, since=set_at if set_at < o0 else None))
    return sorted(out, key=lambda s: s.start)


# ------------------------------------------------------------------------------------ the days


def _x(u: datetime, day: Day, tz: ZoneInfo) -> int:
    """Where instant ``u`` (inside ``day``) is drawn on its axis: its wall-clock seconds since the
    day's 00:00; in the second pass of a repeated range, that range's end."""
    local = u.astimezone(tz)
    x = int((local.replace(tzinfo=None) - datetime.combine(day.date, time())).total_seconds())
    if local.fold:
        for s in day.shifts:
            if s.kind == "repeat" and s.x0 <= x < s.x1:
                return s.x1
    return max(0, min(DAY_S, x))


def _transition(lo: datetime, hi: datetime) -> datetime:
    """The first second in ``(lo, hi]`` with ``hi``'s UTC offset (zone changes fall on whole seconds)."""
    a, b = int(lo.timestamp()), int(hi.timestamp())
    tz = lo.tzinfo
    target = hi.utcoffset()
    while b - a > 1:
        mid = (a + b) // 2
        if datetime.fromtimestamp(mid, tz).utcoffset() == target:
            b = mid
        else:
            a = mid
    return datetime.fromtimestamp(b, UTC)


def _shifts(d: date, start: datetime, end: datetime, tz: ZoneInfo) -> tuple[Shift, ...]:
    """Every change of the zone's UTC offset at an instant ``start <= T < end``."""
    midnight = datetime.combine(d, time())
    probe = [start - _SECOND]
    t = start
    while t < end:
        probe.append(t)
        t += timedelta(minutes=30)
    probe.append(end - _SECOND)
    out: list[Shift] = []
    for a, b in zip(probe, probe[1:], strict=False):
        la, lb = a.astimezone(tz), b.astimezone(tz)
        if la.utcoffset() == lb.utcoffset():
            continue
        at = _transition(la, lb)
        before, after = la.utcoffset(), lb.utcoffset()
        assert before is not None and after is not None
        w0, w1 = sorted(((at + before).replace(tzinfo=None), (at + after).replace(tzinfo=None)))
        x0 = max(0, min(DAY_S, int((w0 - midnight).total_seconds())))
        x1 = max(0, min(DAY_S, int((w1 - midnight).total_seconds())))
        names = (str(la.tzname() or ""), str(lb.tzname() or ""))
        out.append(Shift(at, before, after, names[0], names[1], x0, x1))
    return tuple(out)


def _minus(x0: int, x1: int, holes: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    parts = [(x0, x1)]
    for h0, h1 in holes:
        nxt = []
        for a, b in parts:
            if b <= h0 or a >= h1:
                nxt.append((a, b))
                continue
            if a < h0:
                nxt.append((a, h0))
            if b > h1:
                nxt.append((h1, b))
        parts = nxt
    return [(a, b) for a, b in parts if b > a]


def _pieces(day: Day, stretches: Sequence[Stretch], tz: ZoneInfo) -> tuple[Piece, ...]:
    out: list[Piece] = []
    for i, s in enumerate(stretches):
        if s.end <= day.start or s.start >= day.end:
            continue
        begins = s.start >= day.start and (s.since is None or s.since >= day.start)
        x0 = _x(max(s.start, day.start), day, tz)
        x1 = DAY_S if s.end >= day.end else _x(s.end, day, tz)
        for j, (a, b) in enumerate(_minus(x0, x1, day.gaps)):
            out.append(Piece(a, b, i, begins and j == 0 and a == x0))
    return tuple(out)


def day_bounds(d: date, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """The instants (UTC) of day ``d``'s first wall-clock time and of the next day's."""
    return (
        wall_to_utc(datetime.combine(d, time()), tz),
        wall_to_utc(datetime.combine(d + timedelta(days=1), time()), tz),
    )


def lay_out(
    schedule: Schedule,
    first: date,
    days: int = 7,
    now: datetime | None = None,
    overlay: Overlay | None = None,
) -> Week:
    """The layout of ``days`` calendar days from ``first`` (a date of the schedule's zone).

    Raises:
        ValueError: ``days`` outside 1 to :data:`DAYS_MAX`, or a date too close to year 9999.
    """
    if not 1 <= days <= DAYS_MAX:
        raise ValueError(f"days: expected 1 to {DAYS_MAX}, got {days}")
    tz = schedule.tz
    try:
        bounds = [day_bounds(first + timedelta(days=i), tz) for i in range(days)]
    except OverflowError:
        raise ValueError(f"{first.isoformat()}: too close to the end of the calendar") from None
    start, end = bounds[0][0], bounds[-1][1]
    now_utc = as_utc(now) if now is not None else None
    stretches = tuple(overlaid(schedule_stretches(schedule, start, end), overlay, now_utc))
    out = []
    for i, (d0, d1) in enumerate(bounds):
        d = first + timedelta(days=i)
        bare = Day(d, d0, d1, _shifts(d, d0, d1, tz))
        out.append(Day(d, d0, d1, bare.shifts, _pieces(bare, stretches, tz)))
    spans = tuple(s for s in schedule.spans if s.start < end and s.end > start)
    return Week(tz, tuple(out), stretches, spans, overlay, now_utc)

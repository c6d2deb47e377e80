"""What a parsed schedule means: "which backend is in effect now" and "what comes next".

An entry is matched against local wall-clock times (naive datetimes, where the calendar is exact),
and each matching wall-clock time is mapped to ONE UTC instant by a single rule (:func:`_to_utc`):
the instant itself; the first occurrence when the time exists twice (fall-back night); the first
instant after the gap when it does not exist (spring-forward night).  That mapping never goes
backwards in time, so "the latest fire at or before T" and "the first fire after T" are both exact
searches over the calendar and always agree with each other.

Calendar exceptions (:class:`Span`) are laid over the weekly entries: while one is in force its
backend is in effect and the entries are silent; its start and its end are boundaries like a fire.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from gpushift.schedule.entry import Entry
from gpushift.schedule.span import Span

UTC = timezone.utc
_MINUTE = timedelta(minutes=1)
# Upper bound of a UTC-offset change at one transition (DST is 1 h, Lord Howe 0.5 h, historic
# "double summer time" 2 h): used to bound the search when a time falls in a repeated hour.
_MAX_SHIFT = timedelta(hours=3)
# Every (month, day) combination, Feb 29 included, falls on every weekday within one 400-year
# Gregorian cycle, so a feasible entry fires at least once in any 401 years.
_SEARCH_YEARS = 401
# next_change() gives up after this many schedule fires without a change of target (it only
# happens when every entry naming another backend is shadowed by a later line at the same instant).
_CHANGE_SEARCH_FIRES = 2000


@dataclass(frozen=True)
class Fire:
    """The schedule switching to ``target`` at instant ``at`` (aware, UTC) because ``entry`` fired.

    ``span`` is the calendar exception behind the fire, if any:

    * ``ends`` False: the exception begins at ``at`` (its start) and is in force; ``entry`` is the
      span's own (``span.entry``: its line, fields ``except 2026-12-24..2026-12-31``).
    * ``ends`` True: the exception ended at ``at`` (its end); ``entry`` is the weekly entry in effect
      again, the one that fired most recently at or before the end.
    """

    entry: Entry
    at: datetime
    target: str
    span: Span | None = None
    ends: bool = False

    @property
    def in_force(self) -> Span | None:
        """The calendar exception in force from this fire on (``None`` outside any, and at an end)."""
        return None if self.ends else self.span

    @property
    def exception(self) -> str | None:
        """The calendar exception in force: its NAME, else its dates; ``None`` outside any."""
        return self.in_force.label if self.in_force is not None else None

    def describe(self) -> str:
        """Why the schedule wants ``target``: one line for logs and the ledger's reason."""
        e, at = self.entry, self.at.isoformat()
        if self.span is None:
            return f"schedule line {e.line} ({e.fields}) fired at {at}"
        if not self.ends:
            return f"schedule line {e.line} ({e.fields}) fired at {at} (calendar exception {self.span.label})"
        return (
            f"schedule line {e.line} ({e.fields}) in effect again at {at} "
            f"(calendar exception {self.span.label} on line {self.span.line} ended)"
        )


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule file.

    ``tz`` is the zone every entry is read in (the file's ``TZ=`` line, else the host's zone);
    ``tz_line`` is that line's number, or ``None`` when the host's zone is used.  ``spans`` are the
    calendar exceptions (``except`` lines), in time order, never overlapping.
    """

    path: str
    tz: ZoneInfo
    entries: tuple[Entry, ...]
    tz_line: int | None = None
    spans: tuple[Span, ...] = ()

    @property
    def targets(self) -> frozenset[str]:
        """Every backend name (and ``off``) the schedule can switch to."""
        return frozenset(e.target for e in self.entries) | frozenset(s.target for s in self.spans)

    # ---------------------------------------------------------------- calendar exceptions

    def span_at(self, at: datetime) -> Span | None:
        """The calendar exception in force at ``at`` (``start <= at < end``), if any."""
        at_utc = _as_utc(at)
        i = bisect_right([s.start for s in self.spans], at_utc) - 1
        return self.spans[i] if i >= 0 and at_utc < self.spans[i].end else None

    def passed(self, at: datetime) -> tuple[Span, ...]:
        """The calendar exceptions that ended at or before ``at``: they change nothing any more."""
        at_utc = _as_utc(at)
        return tuple(s for s in self.spans if s.end <= at_utc)

    def _last_ended(self, at: datetime) -> Span | None:
        i = bisect_right([s.end for s in self.spans], at) - 1
        return self.spans[i] if i >= 0 else None

    def _next_start(self, after: datetime) -> Span | None:
        i = bisect_right([s.start for s in self.spans], after)
        return self.spans[i] if i < len(self.spans) else None

    # ---------------------------------------------------------------- the questions

    def in_effect(self, at: datetime) -> Fire | None:
        """The fire that decides what runs at ``at``: the latest one at or before ``at``.

        Inside a calendar exception, its start.  Otherwise the latest fire of any entry, however
        rarely it fires; when several entries fire at the same instant the later written time wins,
        then the later line (see :meth:`next`).  When an exception ended after that fire (at or
        before ``at``), the fire is the exception's end, naming that entry.  ``None`` when no entry
        has ever fired (an empty schedule).

        Args:
            at: an aware datetime (any zone; compared in UTC).
        """
        at_utc = _as_utc(at)
        span = self.span_at(at_utc)
        if span is not None:
            return Fire(span.entry, span.start, span.target, span)
        fire = self._weekly_in_effect(at_utc)
        ended = self._last_ended(at_utc)
        if fire is not None and ended is not None and fire.at <= ended.end:
            return Fire(fire.entry, ended.end, fire.target, ended, ends=True)
        return fire

    def next(self, after: datetime, n: int) -> list[Fire]:
        """The next ``n`` fires strictly after ``after``, in time order, one per instant.

        When several entries fire at the same instant only one fire is listed: the entry whose
        written time is later wins (this only differs on a spring-forward night, where several
        written times collapse onto the first instant after the gap), and among equal written times
        the later line in the file wins.  A calendar exception's start beats any entry at that
        instant; entries firing inside it are not listed; its end is listed (as the fire of the
        entry in effect again).  A fire may name the backend that is already in effect.

        Args:
            after: an aware datetime (any zone; compared in UTC).
            n: how many fires to return (fewer only if the calendar ends, i.e. year 9999).
        """
        t = _as_utc(after)
        heads: list[datetime | None] = [_next_fire(e, self.tz, t) for e in self.entries]
        out: list[Fire] = []
        while len(out) < n:
            span = self.span_at(t)
            if span is not None:  # nothing happens until its end
                t = span.end
                heads = [_next_fire(e, self.tz, t) for e in self.entries]
                fire = self.in_effect(t)  # the entry in effect again, or an exception starting there
                if fire is not None:
                    out.append(fire)
                continue
            live = [u for u in heads if u is not None]
            u = min(live) if live else None
            coming = self._next_start(t)
            if coming is not None and (u is None or coming.start <= u):
                out.append(Fire(coming.entry, coming.start, coming.target, coming))
                t = coming.start
                continue
            if u is None:
                break
            group = [i for i, h in enumerate(heads) if h == u]
            out.append(self._winner(group, u))
            for i in group:
                heads[i] = _next_fire(self.entries[i], self.tz, u)
            t = u
        return out

    def next_boundary(self, after: datetime) -> Fire | None:
        """The next instant strictly after ``after`` at which the schedule speaks (any entry fires, a
        calendar exception begins or ends).

        This is where a default manual override ends, and where the daemon's timer should be armed,
        even if the fire names the backend that already runs.
        """
        fires = self.next(after, 1)
        return fires[0] if fires else None

    def next_change(self, after: datetime) -> Fire | None:
        """The next fire strictly after ``after`` whose target differs from the one in effect then.

        What ``status`` calls "the next switch".  ``None`` when no such fire exists (every entry
        names the same backend, or entries naming others are always shadowed by later lines).
        """
        t = _as_utc(after)
        current = self.in_effect(t)
        target = current.target if current else None
        while True:
            span = self.span_at(t)
            if span is not None:
                t = span.end
                fire = self.in_effect(t)
                if fire is not None and fire.target != target:
                    return fire
                continue
            coming = self._next_start(t)
            fire = self._weekly_change(t, target, coming.start if coming else None)
            if fire is not None or coming is None:
                return fire
            if coming.target != target:
                return Fire(coming.entry, coming.start, coming.target, coming)
            t = coming.start

    # ---------------------------------------------------------------- the weekly entries alone

    def _weekly_in_effect(self, at_utc: datetime) -> Fire | None:
        best: tuple[datetime, datetime, int] | None = None
        winner: Entry | None = None
        for e in self.entries:
            p = _prev_fire(e, self.tz, at_utc)
            if p is None:
                continue
            key = (p[0], p[1], e.line)
            if best is None or key > best:
                best, winner = key, e
        if best is None or winner is None:
            return None
        return Fire(winner, best[0], winner.target)

    def _weekly_change(self, after: datetime, target: str | None, before: datetime | None) -> Fire | None:
        """The first entry fire in ``(after, before)`` whose winner names another target than ``target``."""
        others = [e for e in self.entries if e.target != target]
        t = after
        for _ in range(_CHANGE_SEARCH_FIRES):
            times = [u for u in (_next_fire(e, self.tz, t) for e in others) if u is not None]
            if not times:
                return None
            t = min(times)
            if before is not None and t >= before:
                return None
            # A later line firing at the same instant may name the current target again.
            won = self._weekly_in_effect(t)
            if won is not None and won.target != target:
                return won
        return None

    def _winner(self, group: list[int], t: datetime) -> Fire:
        if len(group) == 1:
            e = self.entries[group[0]]
            return Fire(e, t, e.target)

        def key(i: int) -> tuple[datetime, int]:
            e = self.entries[i]
            p = _prev_fire(e, self.tz, t)
            assert p is not None and p[0] == t  # e fires at t, so its latest fire at or before t is t
            return (p[1], e.line)

        e = self.entries[max(group, key=key)]
        return Fire(e, t, e.target)


# --------------------------------------------------------------------------------------------------
# Fire times.  Wall-clock times are naive datetimes in the schedule's zone, minute-aligned.


def _as_utc(t: datetime) -> datetime:
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"expected an aware datetime, got naive {t!r}")
    return t.astimezone(UTC)


def _to_utc(wall: datetime, tz: ZoneInfo) -> datetime:
    """The one instant a matching wall-clock time fires at (the DST rule lives here).

    * exists once → that instant;
    * exists twice (fall-back night) → the first occurrence (PEP 495 ``fold=0``);
    * does not exist (spring-forward night) → the first instant after the gap.

    The mapping never goes backwards, which keeps :func:`_prev_fire` and :func:`_next_fire` exact.
    """
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if _wall(first, tz) == wall:
        return first
    # In a gap: fold=0 maps with the offset before the transition, fold=1 with the one after, so the
    # transition lies between the two.  Zone transitions fall on whole seconds: bisect for the first
    # second whose local time is at or past ``wall``.
    other = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    lo, hi = int(min(first, other).timestamp()), int(max(first, other).timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _wall(datetime.fromtimestamp(mid, UTC), tz) >= wall:
            hi = mid
        else:
            lo = mid
    return datetime.fromtimestamp(hi, UTC)


def wall_to_utc(wall: datetime, tz: ZoneInfo) -> datetime:
    """The instant (UTC) a naive wall-clock time of zone ``tz`` stands for, under the one DST rule of
    :func:`_to_utc`: a calendar exception's FROM and UNTIL are mapped exactly as entries are.

    Raises:
        OverflowError: the time is too close to year 1 or 9999 to be mapped.
    """
    return _to_utc(wall.replace(second=0, microsecond=0), tz)


def _wall(u: datetime, tz: ZoneInfo) -> datetime:
    return u.astimezone(tz).replace(tzinfo=None, fold=0)


def _prev_fire(e: Entry, tz: ZoneInfo, at: datetime) -> tuple[datetime, datetime] | None:
    """(instant, wall-clock time) of ``e``'s latest fire at or before ``at`` (UTC).

    Of several wall-clock times firing at one instant (a gap), the latest is returned.  None near
    the ends of what a datetime holds (year 1, year 9999) rather than an OverflowError.
    """
    try:
        return _prev_fire_within_range(e, tz, at)
    except OverflowError:
        return None


def _prev_fire_within_range(e: Entry, tz: ZoneInfo, at: datetime) -> tuple[datetime, datetime] | None:
    local = at.astimezone(tz)
    wall = local.replace(tzinfo=None, second=0, microsecond=0, fold=0)
    # In the second pass of a repeated hour, wall-clock times later than now already fired (at their
    # first occurrence): start beyond them and step back.
    start = wall + _MAX_SHIFT if local.fold else wall
    w = _nearest_wall(e, start, forward=False)
    while w is not None:
        try:
            u = _to_utc(w, tz)
        except OverflowError:
            u = None
        if u is not None and u <= at:
            return u, w
        w = _nearest_wall(e, w - _MINUTE, forward=False)
    return None


def _next_fire(e: Entry, tz: ZoneInfo, after: datetime) -> datetime | None:
    """The instant of ``e``'s first fire strictly after ``after`` (UTC); None when there is none
    before the end of year 9999 (never an OverflowError)."""
    try:
        wall = after.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0, fold=0)
        w = _nearest_wall(e, wall + _MINUTE, forward=True)
        while w is not None:
            u = _to_utc(w, tz)
            # Skips times whose first occurrence is already past (``after`` in a repeated hour).
            if u > after:
                return u
            w = _nearest_wall(e, w + _MINUTE, forward=True)
    except OverflowError:
        return None
    return None


# --------------------------------------------------------------------------------------------------
# The calendar search, in either direction: ``forward`` looks for the earliest match at or after a
# point, otherwise for the latest match at or before it.


def _nearest_wall(e: Entry, t: datetime, forward: bool) -> datetime | None:
    """The earliest matching wall-clock minute at or after ``t`` (``forward``), else the latest at or
    before ``t``."""
    d = t.date()
    if e.day_matches(d):
        hm = _nearest_time(e, t.hour, t.minute, forward)
        if hm is not None:
            return datetime(d.year, d.month, d.day, *hm)
    day = _nearest_day(e, d, forward)
    if day is None:
        return None
    edge = 0 if forward else -1  # that day's first (last) matching time
    return datetime(day.year, day.month, day.day, e.hours[edge], e.minutes[edge])


def _index(values: tuple[int, ...], x: int, forward: bool) -> int:
    """The index of the first value >= ``x`` (``forward``) or of the last value <= ``x``; out of
    range when there is none."""
    return bisect_left(values, x) if forward else bisect_right(values, x) - 1


def _nearest_time(e: Entry, h: int, m: int, forward: bool) -> tuple[int, int] | None:
    """The entry's first (hour, minute) at or after ``h:m`` of a day (``forward``), else its last at
    or before ``h:m``; ``None`` when the day has none left."""
    i = _index(e.hours, h, forward)
    if 0 <= i < len(e.hours) and e.hours[i] == h:
        j = _index(e.minutes, m, forward)
        if 0 <= j < len(e.minutes):
            return h, e.minutes[j]
        i += 1 if forward else -1
    edge = 0 if forward else -1
    return (e.hours[i], e.minutes[edge]) if 0 <= i < len(e.hours) else None


def _nearest_day(e: Entry, d: date, forward: bool) -> date | None:
    """The first day after ``d`` (``forward``), else the last day before ``d``, the entry fires on."""
    step = timedelta(days=1 if forward else -1)
    start = d.year
    try:
        d += step
        while abs(d.year - start) <= _SEARCH_YEARS:
            if d.month not in e.months:  # skip the rest of the month: to the next's 1st (previous's last)
                first = d.replace(day=1)
                d = (first + timedelta(days=32)).replace(day=1) if forward else first - timedelta(days=1)
            elif e.day_matches(d):
                return d
            else:
                d += step
    except OverflowError:  # past year 9999, or before year 1
        pass
    return None

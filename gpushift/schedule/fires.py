"""One entry's fire times: its latest fire at or before an instant, its first fire after one.

Wall-clock times are naive datetimes in the schedule's zone, minute-aligned; each matching wall-clock
time is mapped to ONE UTC instant by :func:`to_utc` (the DST rule).  The calendar search jumps: from
month to month among the entry's months, and inside a month from one of its days to the next, so
even an entry that fires once in decades (``0 8 29 2 */7``: a 29 February that is a Sunday) is found
in a few hundred steps, never by walking the calendar day by day.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from gpushift.schedule.entry import Entry

UTC = timezone.utc
MINUTE = timedelta(minutes=1)
# Upper bound of a UTC-offset change at one transition (DST is 1 h, Lord Howe 0.5 h, historic
# "double summer time" 2 h): used to bound the search when a time falls in a repeated hour.
_MAX_SHIFT = timedelta(hours=3)
# Every (month, day) combination, Feb 29 included, falls on every weekday within one 400-year
# Gregorian cycle, so a feasible entry fires at least once in any 401 years.
SEARCH_YEARS = 401
_MONTH_DAYS = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # February: see _day_in_month


def as_utc(t: datetime) -> datetime:
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"expected an aware datetime, got naive {t!r}")
    return t.astimezone(UTC)


def to_utc(wall: datetime, tz: ZoneInfo) -> datetime:
    """The one instant a matching wall-clock time fires at (the DST rule lives here).

    * exists once → that instant;
    * exists twice (fall-back night) → the first occurrence (PEP 495 ``fold=0``);
    * does not exist (spring-forward night) → the first instant after the gap.

    The mapping never goes backwards, which keeps :func:`prev_fire` and :func:`next_fire` exact.
    """
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if wall_of(first, tz) == wall:
        return first
    # In a gap: fold=0 maps with the offset before the transition, fold=1 with the one after, so the
    # transition lies between the two.  Zone transitions fall on whole seconds: bisect for the first
    # second whose local time is at or past ``wall``.
    other = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    lo, hi = int(min(first, other).timestamp()), int(max(first, other).timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if wall_of(datetime.fromtimestamp(mid, UTC), tz) >= wall:
            hi = mid
        else:
            lo = mid
    return datetime.fromtimestamp(hi, UTC)


def wall_of(u: datetime, tz: ZoneInfo) -> datetime:
    """The naive wall-clock time of instant ``u`` in ``tz`` (``fold`` cleared)."""
    return u.astimezone(tz).replace(tzinfo=None, fold=0)


def after_gap(u: datetime, tz: ZoneInfo) -> bool:
    """Whether the clock jumped forward at ``u``: wall-clock times of the gap fire at ``u`` too."""
    before = (u - timedelta(seconds=1)).astimezone(tz).utcoffset()
    now = u.astimezone(tz).utcoffset()
    return before is not None and now is not None and now > before


def prev_fire(e: Entry, tz: ZoneInfo, at: datetime) -> tuple[datetime, datetime] | None:
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
            u: datetime | None = to_utc(w, tz)
        except OverflowError:
            u = None
        if u is not None and u <= at:
            return u, w
        w = _nearest_wall(e, w - MINUTE, forward=False)
    return None


def next_fire(e: Entry, tz: ZoneInfo, after: datetime) -> datetime | None:
    """The instant of ``e``'s first fire strictly after ``after`` (UTC); None when there is none
    before the end of year 9999 (never an OverflowError)."""
    try:
        wall = after.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0, fold=0)
        w = _nearest_wall(e, wall + MINUTE, forward=True)
        while w is not None:
            u = to_utc(w, tz)
            # Skips times whose first occurrence is already past (``after`` in a repeated hour).
            if u > after:
                return u
            w = _nearest_wall(e, w + MINUTE, forward=True)
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
    """The first day after ``d`` (``forward``), else the last day before ``d``, the entry fires on;
    ``None`` beyond :data:`SEARCH_YEARS` years or the ends of the calendar."""
    months = e.month_list
    if not months or not (e.days or e.weekdays):
        return None
    start_year = d.year
    try:
        d += timedelta(days=1 if forward else -1)
    except OverflowError:
        return None
    y, m, day = d.year, d.month, d.day
    while abs(y - start_year) <= SEARCH_YEARS and 1 <= y <= 9999:
        if m in e.months:
            found = _day_in_month(e, y, m, day, forward)
            if found is not None:
                return date(y, m, found)
        if forward:  # on to the 1st of the entry's next month
            i = bisect_right(months, m)
            y, m, day = (y, months[i], 1) if i < len(months) else (y + 1, months[0], 1)
        else:  # back to the last day of the entry's previous month
            i = bisect_left(months, m) - 1
            y, m, day = (y, months[i], 31) if i >= 0 else (y - 1, months[-1], 31)
    return None


def _day_in_month(e: Entry, y: int, m: int, start: int, forward: bool) -> int | None:
    """The entry's first day >= ``start`` of month ``m`` of year ``y`` (``forward``), else its last
    day <= ``start``; ``None`` when the month has none there (crontab(5)'s two day fields)."""
    length = _MONTH_DAYS[m] if m != 2 else (29 if y % 4 == 0 and (y % 100 != 0 or y % 400 == 0) else 28)
    start = max(1, min(start, length))
    days, weekdays = e.day_list, e.weekdays
    i = _index(days, start, forward)
    if forward and (i >= len(days) or days[i] > length) and not (e.dom_restricted and e.dow_restricted):
        return None  # the common case of a month without the entry's days: no weekday to compute
    # The weekday of day 0 of the month (Sunday 0 … Saturday 6): day x falls on (base + x) % 7.
    base = (date(y, m, 1).toordinal() - 1) % 7
    step = 1 if forward else -1
    if e.dom_restricted and e.dow_restricted:  # either field matches
        by_dom = days[i] if 0 <= i < len(days) and days[i] <= length else None
        end = min(start + 7, length + 1) if forward else max(start - 7, 0)
        by_dow = next((x for x in range(start, end, step) if (base + x) % 7 in weekdays), None)
        found = [x for x in (by_dom, by_dow) if x is not None]
        return (min(found) if forward else max(found)) if found else None
    while 0 <= i < len(days) and days[i] <= length:
        if (base + days[i]) % 7 in weekdays:
            return days[i]
        i += step
    return None

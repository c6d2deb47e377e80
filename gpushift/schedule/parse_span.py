"""Reading one calendar exception line, ``except FROM .. UNTIL backend [NAME]``, and checking it
against the exceptions read before it (they must not overlap).

FROM and UNTIL are ``YYYY-MM-DD`` or ``YYYY-MM-DD HH:MM`` (also ``YYYY-MM-DDTHH:MM``) in the
schedule's zone.  A date alone as FROM is that day's 00:00; a date alone as UNTIL includes that whole
day (the exception ends at the next day's 00:00), so ``2026-12-24 .. 2026-12-31`` reads as on a
calendar: the 24th to the 31st, both included.  With a time, UNTIL is the first moment NOT in the
exception: ``.. 2027-01-04 08:00`` hands back to the weekly entries at 08:00.
"""

from __future__ import annotations

import re
from bisect import bisect_left, insort
from collections.abc import Callable
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

from gpushift.errors import ConfigError
from gpushift.schedule.evaluate import wall_to_utc
from gpushift.schedule.span import Span

KEYWORD = "except"
FORMAT = "except FROM .. UNTIL backend [name]"
EXAMPLE = "except 2026-12-24 .. 2026-12-31 llama holidays"

_DATE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})")
_TIME = re.compile(r"([0-9]{1,2}):([0-9]{2})")
_NAME = re.compile(r"\w[\w-]{0,63}")
_DATE_EXPECTED = "expected YYYY-MM-DD, optionally followed by HH:MM, e.g. 2026-12-24 or 2026-12-24 18:00"

_ErrFactory = Callable[[str, str], ConfigError]


class SpanSet:
    """The exceptions read so far: in file order (``spans``), and by start, for a check of a new one
    against all of them in O(log n) (they never overlap, so their ends are in order too)."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._by_start: list[Span] = []

    def add(self, span: Span) -> None:
        self.spans.append(span)
        insort(self._by_start, span, key=lambda s: s.start)

    def first_overlap(self, span: Span) -> Span | None:
        """The earliest line's exception that overlaps ``span``, if any."""
        i = bisect_left(self._by_start, span.end, key=lambda s: s.start)  # those starting before its end
        if i == 0 or self._by_start[i - 1].end <= span.start:  # the latest of them ends before it starts
            return None
        return next(o for o in self.spans if span.start < o.end and o.start < span.end)


def is_except_line(line: str) -> bool:
    """Whether a (stripped, non-comment) schedule line is a calendar exception."""
    return line.split(maxsplit=1)[0].lower() == KEYWORD


def parse_span(
    line: str,
    lineno: int,
    tz: ZoneInfo,
    check_target: Callable[[str], None],
    err: _ErrFactory,
    earlier: SpanSet,
) -> Span:
    """One ``except`` line → a :class:`Span`.

    Args:
        line: the stripped line (:func:`is_except_line` is true for it).
        lineno: its line number.
        tz: the schedule's zone.
        check_target: raises the error for a backend name that is not valid (as for entries).
        err: the line's error factory (field, what was expected → ConfigError naming file:line).
        earlier: the exceptions of the lines above; the new one must overlap none of them (it is
            not added).

    Raises:
        ConfigError: naming the field (from, until, backend, name, except) and what was expected.
    """
    parts = line.split(maxsplit=1)
    body = parts[1] if len(parts) > 1 else ""
    left, sep, right = body.partition("..")
    if not sep:
        raise err(KEYWORD, f"missing '..' between FROM and UNTIL (expected: {FORMAT}, e.g. {EXAMPLE})")
    start_wall, start_text, _ = _moment(left.split(), "from", err)
    tokens = right.split()
    n_time = 2 if len(tokens) >= 2 and _TIME.fullmatch(tokens[1]) and "T" not in tokens[0] else 1
    end_wall, end_text, whole_day = _moment(tokens[:n_time], "until", err)
    if whole_day:
        try:
            end_wall += timedelta(days=1)  # a date alone as UNTIL: that whole day is included
        except OverflowError:
            raise err("until", f"{end_text!r} is out of range") from None
    rest = tokens[n_time:]
    if not rest:
        raise err("backend", f"missing (expected: {FORMAT}, e.g. {EXAMPLE})")
    target, name = rest[0], (rest[1] if len(rest) > 1 else None)
    check_target(target)
    if name is not None and name.startswith("#"):
        raise err(
            "name",
            "a comment cannot follow on the same line (comments go on their own line, starting with '#')",
        )
    if name is not None and not _NAME.fullmatch(name):
        raise err("name", f"{name!r} is not a name (one word of letters, digits, '-' and '_', e.g. holidays)")
    if len(rest) > 2:
        raise err(
            "name", f"unexpected text {rest[2]!r} after the name (the name is one word, e.g. christmas-2026)"
        )
    written = f"{start_text}..{end_text}"
    if end_wall <= start_wall:
        raise err("until", f"{end_text!r} is not after {start_text!r}: the exception would be empty")
    try:
        start, end = wall_to_utc(start_wall, tz), wall_to_utc(end_wall, tz)
    except OverflowError:
        raise err(KEYWORD, f"{written} is out of range") from None
    if end <= start:  # both in the hour skipped when the clocks go forward
        raise err(
            "until",
            f"{written} is empty in {tz}: FROM and UNTIL fall in the hour the clocks skip at the "
            f"change to summer time, both meaning {start:%Y-%m-%d %H:%M} UTC",
        )
    span = Span(lineno, written, target, name, start_wall, end_wall, start, end)
    other = earlier.first_overlap(span)
    if other is not None:
        raise err(
            KEYWORD,
            f"{written} overlaps line {other.line} ({other.written}): calendar exceptions must not "
            "overlap (one may end where the next begins)",
        )
    return span


def _moment(tokens: list[str], fld: str, err: _ErrFactory) -> tuple[datetime, str, bool]:
    """FROM or UNTIL → (wall-clock time, as printed, whether it was a date alone)."""
    if not tokens:
        raise err(fld, f"missing ({_DATE_EXPECTED})")
    if len(tokens) > 2:
        raise err(fld, f"unexpected text {tokens[2]!r} ({_DATE_EXPECTED})")
    day_text, t_sep, time_text = tokens[0].partition("T")
    if len(tokens) == 2:
        if t_sep:
            raise err(fld, f"unexpected text {tokens[1]!r} after {tokens[0]!r} ({_DATE_EXPECTED})")
        time_text = tokens[1]
    day = _date(day_text, fld, err)
    if not t_sep and len(tokens) == 1:
        return datetime(day.year, day.month, day.day), day.isoformat(), True
    m = _TIME.fullmatch(time_text)
    if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
        raise err(fld, f"{time_text!r} is not a time of day (expected HH:MM, 00:00 to 23:59)")
    wall = datetime(day.year, day.month, day.day, int(m.group(1)), int(m.group(2)))
    return wall, f"{wall:%Y-%m-%dT%H:%M}", False


def _date(text: str, fld: str, err: _ErrFactory) -> date:
    m = _DATE.fullmatch(text)
    try:
        if m:
            return date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    except ValueError:
        raise err(fld, f"{text!r} is not a date of the calendar ({_DATE_EXPECTED})") from None
    raise err(fld, f"{text!r} is not a date ({_DATE_EXPECTED})")

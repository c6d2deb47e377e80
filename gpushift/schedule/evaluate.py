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

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from gpushift.schedule.entry import Entry
from gpushift.schedule.fires import UTC
from gpushift.schedule.fires import as_utc as _as_utc
from gpushift.schedule.fires import to_utc as _to_utc
from gpushift.schedule.index import EntryIndex
from gpushift.schedule.span import Span

__all__ = ["UTC", "Fire", "Schedule", "wall_to_utc"]


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
    calendar exceptions (``except`` lines), in time order, never overlapping.  ``offset_s``: every
    instant the schedule speaks at comes this many seconds later than the file says (``[daemon]
    stagger_s``, :meth:`staggered`); the spans hold their shifted instants.
    """

    path: str
    tz: ZoneInfo
    entries: tuple[Entry, ...]
    tz_line: int | None = None
    spans: tuple[Span, ...] = ()
    offset_s: int = 0
    # The entries that can win, with their fires around the instant last asked (``index.py``), and
    # the last answer of next_change() with the instants it holds for: caches, not part of the value.
    _index: EntryIndex | _ShiftedIndex = field(init=False, repr=False, compare=False)
    _change: tuple[datetime, datetime | None, Fire | None] | None = field(
        init=False, repr=False, compare=False, default=None
    )

    def __post_init__(self) -> None:
        index = EntryIndex(self.entries, self.tz)
        shifted = _ShiftedIndex(index, timedelta(seconds=self.offset_s)) if self.offset_s else index
        object.__setattr__(self, "_index", shifted)

    def staggered(self, offset_s: int) -> Schedule:
        """This schedule with every boundary ``offset_s`` seconds after the file's (fires of its
        entries and the starts and ends of its calendar exceptions alike): a host's stagger."""
        delta = timedelta(seconds=offset_s - self.offset_s)
        spans = tuple(replace(s, start=s.start + delta, end=s.end + delta) for s in self.spans)
        return Schedule(self.path, self.tz, self.entries, self.tz_line, spans, offset_s)

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
        fires = self._index.fires_after(t)
        head = next(fires, None)
        out: list[Fire] = []
        while len(out) < n:
            span = self.span_at(t)
            if span is not None:  # nothing happens until its end
                t = span.end
                fires = self._index.fires_after(t)
                head = next(fires, None)
                fire = self.in_effect(t)  # the entry in effect again, or an exception starting there
                if fire is not None:
                    out.append(fire)
                continue
            coming = self._next_start(t)
            if coming is not None and (head is None or coming.start <= head[0]):
                out.append(Fire(coming.entry, coming.start, coming.target, coming))
                t = coming.start
                continue
            if head is None:
                break
            u, group = head
            e = self._index.winner(group, u)
            out.append(Fire(e, u, e.target))
            t = u
            head = next(fires, None) if len(out) < n else None  # the heap moves on only if asked
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
        memo = self._change
        if memo is not None and memo[0] <= t and (memo[1] is None or t < memo[1]):
            return memo[2]  # nothing changes between the instant asked then and that answer
        fire, until = self._change_after(t)
        object.__setattr__(self, "_change", (t, until, fire))
        return fire

    def _change_after(self, t: datetime) -> tuple[Fire | None, datetime | None]:
        """next_change(t), and until when that answer holds: for every instant from ``t`` to that
        fire nothing else changes (``None``: for ever).  A search given up (``index.change_after``)
        holds until the last instant it looked at; an exception in effect with no entry having fired
        before it, for no other instant (at its end nothing is in effect, which is no fire)."""
        current = self.in_effect(t)
        target = current.target if current else None
        horizon: datetime | None = None if current is None or self._index.latest(t) is not None else t

        def held(fire: Fire | None) -> tuple[Fire | None, datetime | None]:
            ends = [x for x in (horizon, fire.at if fire else None) if x is not None]
            return fire, min(ends) if ends else None

        while True:
            span = self.span_at(t)
            if span is not None:
                t = span.end
                fire = self.in_effect(t)
                if fire is not None and fire.target != target:
                    return held(fire)
                continue
            coming = self._next_start(t)
            found, reach = self._index.change_after(t, target, coming.start if coming else None)
            if reach is not None:
                horizon = reach if horizon is None else min(horizon, reach)
            if found is not None:
                return held(Fire(found[0], found[1], found[0].target))
            if coming is None:
                return held(None)
            if coming.target != target:
                return held(Fire(coming.entry, coming.start, coming.target, coming))
            t = coming.start

    # ---------------------------------------------------------------- the weekly entries alone

    def _weekly_in_effect(self, at_utc: datetime) -> Fire | None:
        latest = self._index.latest(at_utc)
        if latest is None:
            return None
        e, at = latest
        return Fire(e, at, e.target)


class _ShiftedIndex:
    """The entry index of a staggered schedule: every instant ``delta`` later (asked earlier)."""

    def __init__(self, inner: EntryIndex, delta: timedelta) -> None:
        self.inner = inner
        self.delta = delta

    def latest(self, t: datetime) -> tuple[Entry, datetime] | None:
        got = self.inner.latest(t - self.delta)
        return (got[0], got[1] + self.delta) if got is not None else None

    def fires_after(self, after: datetime) -> Iterator[tuple[datetime, list[int]]]:
        for u, group in self.inner.fires_after(after - self.delta):
            yield u + self.delta, group

    def winner(self, group: Sequence[int], u: datetime) -> Entry:
        return self.inner.winner(group, u - self.delta)

    def change_after(
        self, after: datetime, target: str | None, before: datetime | None
    ) -> tuple[tuple[Entry, datetime] | None, datetime | None]:
        d = self.delta
        found, reach = self.inner.change_after(after - d, target, before - d if before is not None else None)
        return (
            (found[0], found[1] + d) if found is not None else None,
            reach + d if reach is not None else None,
        )


# --------------------------------------------------------------------------------------------------
# The DST rule and the calendar search live in ``fires.py``; this name is what a calendar exception's
# FROM and UNTIL are mapped with.


def wall_to_utc(wall: datetime, tz: ZoneInfo) -> datetime:
    """The instant (UTC) a naive wall-clock time of zone ``tz`` stands for, under the one DST rule of
    :func:`_to_utc`: a calendar exception's FROM and UNTIL are mapped exactly as entries are.

    Raises:
        OverflowError: the time is too close to year 1 or 9999 to be mapped.
    """
    return _to_utc(wall.replace(second=0, microsecond=0), tz)

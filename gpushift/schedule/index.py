"""The weekly entries, indexed for the questions the daemon asks many times a minute.

* Entries with the same time fields fire at the same wall-clock times, so only the last of them in
  the file can ever win (a tie goes to the later line): the others are left out of every search.
* Per entry, the fires around the instant last asked (its latest fire at or before it and its first
  fire after it) are kept; they stay valid until that next fire, so "in effect now" and "the next
  boundary" cost one comparison per entry, and the calendar is searched again only for the entries
  that fired since.
* "What comes next" walks the entries' next fires in a heap (one step per instant at which some
  entry fires), never every entry once a minute.

The results are exactly those of asking every entry (``fires.prev_fire``/``fires.next_fire``); the
index is a cache, safe to read from several threads (a slot is replaced whole, a race only searches
twice).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from heapq import heapify, heappop, heappush
from zoneinfo import ZoneInfo

from gpushift.schedule.entry import Entry
from gpushift.schedule.fires import after_gap, next_fire, prev_fire, wall_of

# One entry's fires around an instant: (valid from, valid until, latest fire (instant, wall)); for
# every t with from <= t < until (until None: for ever) the latest fire at or before t is the one
# kept, and the first fire after t is ``until``.
#: ``change_after`` gives up after this many instants at which an entry naming another target fires
#: without winning (it only happens when every such entry is shadowed by a later line at the same
#: instant), or after this much work: one entry looked at is 1, one calendar search NEXT_FIRE_WORK
#: (tens of milliseconds for the largest schedule accepted, docs/schedule.md "How big a schedule may be").
CHANGE_SEARCH_FIRES = 2000
CHANGE_SEARCH_WORK = 30_000
NEXT_FIRE_WORK = 10

_Known = tuple[datetime, datetime | None, tuple[datetime, datetime] | None]


class EntryIndex:
    def __init__(self, entries: Sequence[Entry], tz: ZoneInfo) -> None:
        last: dict[tuple[object, ...], Entry] = {}
        for e in entries:
            last[e.spec] = e  # file order: a later line with the same fields replaces an earlier one
        self.live: tuple[Entry, ...] = tuple(sorted(last.values(), key=lambda e: e.line))
        self.tz = tz
        self._known: list[_Known | None] = [None] * len(self.live)

    def _around(self, i: int, t: datetime) -> _Known:
        k = self._known[i]
        if k is not None and k[0] <= t and (k[1] is None or t < k[1]):
            return k
        e = self.live[i]
        prev, nxt = prev_fire(e, self.tz, t), next_fire(e, self.tz, t)
        k = (prev[0] if prev is not None else t, nxt, prev)
        self._known[i] = k
        return k

    def latest(self, t: datetime) -> tuple[Entry, datetime] | None:
        """The weekly entry in effect at ``t`` (UTC) and the instant it fired: the latest fire at or
        before ``t``; at one instant the later written time wins, then the later line."""
        best: tuple[datetime, datetime, int] | None = None
        winner: Entry | None = None
        for i, e in enumerate(self.live):
            p = self._around(i, t)[2]
            if p is not None and (best is None or (p[0], p[1], e.line) > best):
                best, winner = (p[0], p[1], e.line), e
        return (winner, best[0]) if winner is not None and best is not None else None

    def heads(self, after: datetime) -> list[tuple[datetime, int]]:
        """(first fire strictly after ``after``, entry index) of every live entry that fires again."""
        out = []
        for i in range(len(self.live)):
            u = self._around(i, after)[1]
            if u is not None:
                out.append((u, i))
        return out

    def fires_after(self, after: datetime) -> Iterator[tuple[datetime, list[int]]]:
        """Every instant strictly after ``after`` at which some live entry fires, in order, with the
        indexes of the entries firing then (the heap advances only when the next one is asked)."""
        heap = self.heads(after)
        heapify(heap)
        while heap:
            u = heap[0][0]
            group = []
            while heap and heap[0][0] == u:
                group.append(heappop(heap)[1])
            yield u, group
            for i in group:
                v = next_fire(self.live[i], self.tz, u)
                if v is not None:
                    heappush(heap, (v, i))

    def winner(self, group: Sequence[int], u: datetime) -> Entry:
        """Of the entries ``group`` firing at instant ``u``, the one that wins: the later written
        time (they differ only at the end of a spring-forward gap), then the later line."""
        if len(group) == 1:
            return self.live[group[0]]
        wall = wall_of(u, self.tz)
        on_time = [i for i in group if self.live[i].matches(wall)]
        if on_time:  # no wall-clock time firing at u is later than u's own
            return self.live[max(on_time)]  # live is in line order

        def key(i: int) -> tuple[datetime, int]:
            p = prev_fire(self.live[i], self.tz, u)
            assert p is not None and p[0] == u  # it fires at u, so its latest fire at or before u is u
            return p[1], self.live[i].line

        return self.live[max(group, key=key)]

    def fires_at(self, u: datetime, among: Sequence[int]) -> list[int]:
        """Which of the entries ``among`` fire at ``u``, an instant at which some entry fires."""
        wall = wall_of(u, self.tz)
        if not after_gap(u, self.tz):
            return [i for i in among if self.live[i].matches(wall)]
        # The end of a spring-forward gap: the gap's wall-clock times fire here too.
        return [i for i in among if (p := prev_fire(self.live[i], self.tz, u)) is not None and p[0] == u]

    def change_after(
        self, after: datetime, target: str | None, before: datetime | None
    ) -> tuple[tuple[Entry, datetime] | None, datetime | None]:
        """(The first instant in ``(after, before)`` at which the entry that wins names another target
        than ``target`` and that entry, or ``None``; ``None`` when the search ended for good, else
        the last instant it looked at).

        Only the instants at which an entry naming another target fires are visited; at each, an
        entry naming ``target`` on a later line (or a later written time) may win again.  ``None``
        when there is none, or after :data:`CHANGE_SEARCH_FIRES` such instants or
        :data:`CHANGE_SEARCH_WORK` steps without one (every entry naming another target shadowed).
        """
        mine = [i for i, e in enumerate(self.live) if e.target == target][::-1]  # later lines first
        heap = [(u, i) for u, i in self.heads(after) if self.live[i].target != target]
        heapify(heap)
        work = len(self.live)  # the heads, from what is kept
        reach = after
        for _ in range(CHANGE_SEARCH_FIRES):
            if not heap:
                return None, None
            if work > CHANGE_SEARCH_WORK:
                return None, reach
            u = heap[0][0]
            if before is not None and u >= before:
                return None, None
            group = []
            while heap and heap[0][0] == u:
                group.append(heappop(heap)[1])
            won, checked = self._won_by(u, group, mine, target)
            if won is not None:
                return (won, u), None
            work += checked + len(group) * NEXT_FIRE_WORK
            reach = u
            for i in group:
                v = next_fire(self.live[i], self.tz, u)
                if v is not None:
                    heappush(heap, (v, i))
        return None, reach

    def _won_by(
        self, u: datetime, group: list[int], mine: list[int], target: str | None
    ) -> tuple[Entry | None, int]:
        """(The entry of ``group`` that wins at ``u``, or ``None`` when one of ``mine`` (naming
        ``target``) firing then beats it; how many entries were looked at)."""
        if after_gap(u, self.tz):
            w = self.winner(sorted([*group, *self.fires_at(u, mine)]), u)
            return (w if w.target != target else None), len(mine)
        best = max(group)  # away from a gap every entry firing at u fires at u's own wall-clock time
        wall = wall_of(u, self.tz)
        checked = 0
        for i in mine:
            if i < best:
                break
            checked += 1
            if self.live[i].matches(wall):
                return None, checked
        return self.live[best], checked

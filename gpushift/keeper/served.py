"""When the keeper will next serve each backend by itself — what ``NextServed`` announces.

Pure.  :func:`next_served` walks the keeper's "what comes next" (:mod:`gpushift.keeper.coming`)
further than the next switch: the override's end, then the schedule's changes one after another
(calendar exceptions included, as :meth:`~gpushift.schedule.Schedule.next_change` lays them over
the entries), until every backend has a time, the schedule has no change left, or
:data:`MAX_CHANGES` changes were looked at.

* a backend that serves now (active, or the target of the switch in flight): served now;
* a switch waiting for an idle moment (a deferral): its target by the deferral's end at the latest;
* a hold, an override without an end, no schedule: nothing ahead (only what serves now);
* an override with an end: from that end (the schedule's backend then, and its changes after).

The answer holds until :attr:`Served.until` (the first of those instants, or the next
boundary): the daemon computes it again only then or when what it depends on changes, never
every second.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from gpushift.keeper.decide import Deferral
from gpushift.keeper.override import Override
from gpushift.schedule import Schedule
from gpushift.values import OFF, Mode

#: The schedule's changes looked at, at most, for a backend that does not come back soon.
MAX_CHANGES = 64


@dataclass(frozen=True)
class Served:
    """Per backend, when it is next served (None: now); a backend absent is never served by the
    keeper by itself.  ``until``: when this answer must be computed again (None: it holds)."""

    at: dict[str, datetime | None]
    until: datetime | None

    def seconds(self) -> dict[str, int]:
        """Per backend, UTC UNIX seconds (0: served now), as ``NextServed`` carries them."""
        return {b: 0 if t is None else max(1, int(t.timestamp())) for b, t in self.at.items()}


def next_served(
    now: datetime,
    schedule: Schedule | None,
    override: Override | None,
    deferral: Deferral | None,
    backends: Iterable[str],
    serving: Iterable[str],
) -> Served:
    """When each of ``backends`` is next served by the keeper by itself, after ``now``."""
    wanted = [b for b in backends if b != OFF]
    at: dict[str, datetime | None] = {b: None for b in serving if b in wanted}
    ends: list[datetime] = []

    def note(backend: str, t: datetime) -> None:
        ends.append(t)
        if backend not in wanted:
            return
        if backend not in at:
            at[backend] = t
            return
        known = at[backend]
        if known is not None and t < known:
            at[backend] = t

    if deferral is not None:
        note(deferral.target, max(now, deferral.until()))
    if schedule is None:
        return Served(at, min(ends) if ends else None)
    if override is not None:
        if override.mode is Mode.HOLD or override.until is None:
            return Served(at, min(ends) if ends else None)
        end = max(override.until, now)
        fire = schedule.in_effect(end)
        if fire is not None and fire.target != override.backend:
            note(fire.target, end)
        else:
            ends.append(end)
        t = end
    else:
        t = now
        boundary = schedule.next_boundary(now)
        if boundary is not None:
            ends.append(boundary.at)
    for _ in range(MAX_CHANGES):
        if all(b in at for b in wanted):
            break
        fire = schedule.next_change(t)
        if fire is None:
            break
        note(fire.target, fire.at)
        t = fire.at
    return Served(at, min(ends) if ends else None)

"""The next scheduled switch to another backend — what a look-ahead consumer prepares for.

Pure.  :func:`coming_switch` answers "which switch will the keeper make next, by itself, and
when": the schedule's next change of backend, or the end of a person's override when the
schedule then wants another backend.  It is what the pre-warm, the ``before_boundary`` hook and
the webhook's notice look ahead to (``gpushift/keeper/lookahead.py``).

* during a hold: none (a hold ends only when a person acts);
* during an override with an end: counted from that end — at the end, the backend the schedule
  wants then, if it is not the override's; otherwise the schedule's next change after the end;
* otherwise: the schedule's next change (a boundary that names the backend already in effect is
  not a switch).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpushift.keeper.override import Override
from gpushift.schedule import Schedule
from gpushift.values import Mode


@dataclass(frozen=True)
class Coming:
    """A switch the keeper will make at ``at`` (aware, UTC) from ``from_backend`` to ``target``.

    ``why`` is one line for logs and notices (the schedule line that fires, or the override's
    end); ``line`` the schedule line, when one fires.
    """

    at: datetime
    target: str
    from_backend: str | None
    why: str
    line: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        """What makes two answers the same switch: the instant and the target."""
        return (self.at.isoformat(), self.target)

    def as_dict(self) -> dict[str, object]:
        return {"at": self.at.isoformat(), "from": self.from_backend, "to": self.target, "why": self.why}


def coming_switch(now: datetime, schedule: Schedule | None, override: Override | None) -> Coming | None:
    """The next switch to another backend the keeper will make by itself after ``now``, or None."""
    if schedule is None:
        return None
    if override is not None:
        if override.mode is Mode.HOLD or override.until is None:
            return None
        end = override.until
        wanted = schedule.in_effect(end)
        if wanted is not None and wanted.target != override.backend:
            return Coming(
                end,
                wanted.target,
                override.backend,
                f"the override of {override.backend} ends; {wanted.describe()}",
                wanted.entry.line,
            )
        start = max(end, now)
        current: str | None = override.backend
    else:
        start = now
        fire = schedule.in_effect(now)
        current = fire.target if fire is not None else None
    nxt = schedule.next_change(start)
    if nxt is None or nxt.target == current:
        return None
    return Coming(nxt.at, nxt.target, current, nxt.describe(), nxt.entry.line)

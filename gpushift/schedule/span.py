"""One calendar exception: an ``except FROM .. UNTIL backend [NAME]`` line of the schedule file.

While a span is in force (``start <= t < end``) its backend is in effect, whatever the weekly entries
say; at ``end`` the weekly entries decide again.  ``start``/``end`` are the instants (UTC) the
wall-clock times ``start_wall``/``end_wall`` stand for in the schedule's zone, under the same DST
rule as every entry (``fires.to_utc``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Any

from gpushift.schedule.entry import Entry


@dataclass(frozen=True)
class Span:
    """A one-off date range that takes precedence over the weekly entries, half-open ``[start, end)``.

    ``written`` is the range as ``schedule check`` prints it (``2026-12-24..2026-12-31``, or with
    times ``2026-12-24T18:00..2027-01-04T08:00``); ``name`` the optional NAME of the line.
    """

    line: int
    written: str
    target: str
    name: str | None
    start_wall: datetime  # naive, in the schedule's zone
    end_wall: datetime  # naive, in the schedule's zone; the first wall-clock time NOT in the span
    start: datetime  # aware, UTC
    end: datetime  # aware, UTC
    entry: Entry = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # What code that knows only entries reads (the keeper's "schedule line N (fields)").
        object.__setattr__(
            self, "entry", Entry(line=self.line, fields=f"except {self.written}", target=self.target)
        )

    @property
    def label(self) -> str:
        """How the exception is named: its NAME, else its dates."""
        return self.name if self.name else self.written

    def as_dict(self, tz: tzinfo) -> dict[str, Any]:
        """The exception for ``gpushift status``: NAME (or dates), line, backend, from and until."""
        return {
            "name": self.label,
            "line": self.line,
            "target": self.target,
            "from": self.start.isoformat(),
            "until": self.end.isoformat(),
            "until_local": self.end.astimezone(tz).isoformat(),
        }

    def contains(self, at: datetime) -> bool:
        """Whether the aware instant ``at`` lies in ``[start, end)``."""
        return self.start <= at < self.end

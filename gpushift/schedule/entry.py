"""One schedule line, parsed: when it fires (per field) and which backend it names."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime


@dataclass(frozen=True)
class Entry:
    """One schedule line: when it fires and which backend it names.

    ``dom_restricted``/``dow_restricted`` follow crontab(5): a day field is restricted when it does
    not start with ``*``.  When both are, a day matches if EITHER matches; otherwise both must.
    ``weekdays`` uses 0 = Sunday … 6 = Saturday (7 has been folded onto 0).
    """

    line: int
    fields: str  # the five time fields as written (single-spaced), or the @-form
    target: str  # a configured backend name or "off"
    minutes: tuple[int, ...] = field(repr=False, default=())
    hours: tuple[int, ...] = field(repr=False, default=())
    days: frozenset[int] = field(repr=False, default=frozenset())
    months: frozenset[int] = field(repr=False, default=frozenset())
    weekdays: frozenset[int] = field(repr=False, default=frozenset())
    dom_restricted: bool = field(repr=False, default=False)
    dow_restricted: bool = field(repr=False, default=False)
    # ``days`` and ``months`` in order, for the calendar search (``fires.py``).
    day_list: tuple[int, ...] = field(init=False, repr=False, compare=False)
    month_list: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "day_list", tuple(sorted(self.days)))
        object.__setattr__(self, "month_list", tuple(sorted(self.months)))

    @property
    def spec(self) -> tuple[object, ...]:
        """Everything that decides when the entry fires: two entries with the same spec fire at the
        same wall-clock times."""
        return (
            self.minutes,
            self.hours,
            self.days,
            self.months,
            self.weekdays,
            self.dom_restricted,
            self.dow_restricted,
        )

    def day_matches(self, d: date) -> bool:
        """Whether the entry fires on calendar day ``d`` (at its hours and minutes)."""
        if d.month not in self.months:
            return False
        dom = d.day in self.days
        dow = d.isoweekday() % 7 in self.weekdays  # isoweekday: Monday 1 … Sunday 7 → Sunday 0
        if self.dom_restricted and self.dow_restricted:
            return dom or dow
        return dom and dow

    def matches(self, wall: datetime) -> bool:
        """Whether the local wall-clock minute ``wall`` (naive) matches the entry."""
        return wall.minute in self.minutes and wall.hour in self.hours and self.day_matches(wall.date())

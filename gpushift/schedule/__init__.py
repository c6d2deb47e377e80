"""The schedule file (crontab(5) semantics) → "which backend is in effect now" and "what comes next".

The file is a small crontab: comment lines, one optional ``TZ=Area/City`` line before the first entry,
entries ``minute hour day-of-month month day-of-week backend``, and calendar exceptions
``except FROM .. UNTIL backend [NAME]`` (one-off date ranges that take precedence over the entries
while they are in force).  Everything outside this package
sees plain aware datetimes: :meth:`Schedule.in_effect`, :meth:`Schedule.next`,
:meth:`Schedule.next_boundary`, :meth:`Schedule.next_change`.

The package, one job a module:

* ``parse`` -- the file's text → :class:`Schedule` (:func:`parse_schedule`, :func:`load_schedule`):
  lines, fields, @-forms, the ``TZ=`` line, the bound on entries, errors naming file, line and field.
* ``parse_span`` -- one ``except`` line → :class:`Span` (FROM, UNTIL, backend, NAME; no overlap).
* ``entry`` -- :class:`Entry`, one parsed line, and which calendar days and minutes it matches.
* ``span`` -- :class:`Span`, one calendar exception: its instants, its NAME, the Entry it shows as.
* ``evaluate`` -- :class:`Schedule` and :class:`Fire`: in effect, next, next boundary, next change,
  with the calendar exceptions laid over the entries.
* ``index`` -- the entries that can win, each one's fires around the instant last asked, and the
  heap of their next fires: what keeps those questions cheap at the bound (1000 entries).
* ``fires`` -- one entry's previous and next fire: the one DST rule mapping a wall-clock time to an
  instant; the calendar search.
* ``zones`` -- zone names and the host's zone (:func:`host_timezone`).

Why the fire times are computed here, per field, instead of through APScheduler's ``CronTrigger``
(docs/schedule.md says more):

* ``CronTrigger.from_crontab`` reads weekday 0 as Monday, rejects 7 and ANDs the two day fields
  (agronholm/apscheduler#286); crontab(5) says 0 and 7 are Sunday and the day fields are ORed.
* APScheduler has no "previous fire time", which is exactly what "the backend in effect now" needs,
  for yearly entries too (``0 8 29 2 *`` last fired up to eight years ago).
* Its DST behaviour (fires twice on the fall-back night) is not the one we want.
"""

from __future__ import annotations

from gpushift.schedule.entry import Entry
from gpushift.schedule.evaluate import UTC, Fire, Schedule
from gpushift.schedule.parse import DEFAULT_SCHEDULE_PATH, FIELD_NAMES, load_schedule, parse_schedule
from gpushift.schedule.span import Span
from gpushift.schedule.zones import host_timezone

__all__ = [
    "DEFAULT_SCHEDULE_PATH",
    "FIELD_NAMES",
    "UTC",
    "Entry",
    "Fire",
    "Schedule",
    "Span",
    "host_timezone",
    "load_schedule",
    "parse_schedule",
]

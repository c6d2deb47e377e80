"""The status page's data, on the daemon's side: the redacted summary (``GetSummary``).

:class:`PageData` gathers what :func:`gpushift.statuspage.summary.build` reads, from memory only
(the status document, the ledger view's newest rows, the keeper's override) and the week's layout
of the schedule (:func:`gpushift.schedule.week.lay_out`: today and the next 6 days of the schedule's
zone, with the override or hold laid over them).  The layout is computed again only when the
schedule, the override or the day changes; the service (``gpushift/bus/service.py``) asks for the
summary at most every :data:`~gpushift.bus.service.SUMMARY_REUSE_S`, whatever the traffic.
"""

from __future__ import annotations

import json
import threading
from datetime import datetime, timezone
from typing import Any

from gpushift.schedule.week import Overlay, Week, lay_out
from gpushift.statuspage import summary

UTC = timezone.utc
#: The days the summary's week covers: today and the next six.
WEEK_DAYS = 7


def overlay_of(override: Any) -> Overlay | None:
    """The keeper's override (``gpushift.keeper.Override``) as the layout's overlay."""
    if override is None:
        return None
    mode = str(override.mode.value)
    if mode not in ("override", "hold"):
        return None
    return Overlay(mode, override.backend, override.set_at, override.until if mode == "override" else None)


class PageData:
    """The summary of one daemon (``d``: the :class:`~gpushift.daemon.core.Daemon`).

    The week's layout costs milliseconds for a usual schedule and up to about a second for the
    largest one accepted (1,000 entries, thousands of stretches a week), which the daemon's loop
    thread must not wait for: once a layout exists, a new one (another override, another day) is
    made on a thread of its own (``background``) while the summary goes on with the one before.
    """

    def __init__(self, background: bool = True) -> None:
        self.background = background
        self._week: tuple[tuple[Any, ...], Week] | None = None
        self._making: threading.Thread | None = None
        self._lock = threading.Lock()

    def week(self, d: Any, now: datetime) -> Week | None:
        sched = d.schedule
        if sched is None:
            return None
        overlay = overlay_of(d.keeper.override)
        key = (id(sched), overlay, now.astimezone(sched.tz).date())
        kept = self._week
        if (
            kept is not None
            and kept[0] == key
            and (overlay is None or overlay.until is None or now < overlay.until)
        ):
            return kept[1]
        if kept is None or not self.background:
            return self._make(sched, key, now)
        with self._lock:
            if self._making is None or not self._making.is_alive():
                self._making = threading.Thread(
                    target=self._make, args=(sched, key, now), name="pagedata-week", daemon=True
                )
                self._making.start()
        return kept[1]

    def _make(self, sched: Any, key: tuple[Any, ...], now: datetime) -> Week:
        week = lay_out(sched, key[2], WEEK_DAYS, now=now, overlay=key[1])
        self._week = (key, week)
        return week

    def summary(self, d: Any, now: datetime | None = None) -> dict[str, Any]:
        now = now or datetime.now(UTC)
        status = d.status()
        rows = [r.to_dict() for r in d.components.ledger_view().rows[: summary.RECENT]]
        return summary.build(status, rows, self.week(d, now), list(d.config.backends), now)

    def summary_json(self, d: Any) -> str:
        return json.dumps(self.summary(d), separators=(",", ":"))

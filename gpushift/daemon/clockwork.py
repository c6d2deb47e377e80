"""The schedule's clockwork — when the keeper is asked to decide.

* APScheduler's ``BackgroundScheduler`` runs one job, armed at the next schedule boundary or the
  end of an override (:meth:`Clockwork.arm`, again after every decision that may move it);
* the look-ahead's jobs (``lookahead.py``: pre-warm, hooks, notices before a switch) on the same
  scheduler, re-evaluated whenever the boundary job is re-armed and after every decision;
* a GLib timer on the loop's monotonic clock runs every second: it notices a wall-clock jump (a
  wall-clock scheduler cannot notice one itself) and calls ``on_reconcile`` every
  ``reconcile_interval_s`` and after a jump.

A clock jump is nothing special to the keeper: its next decision just sees a new "now".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timezone
from typing import Any

from gpushift.keeper import Keeper
from gpushift.keeper.lookahead import LookAhead, SchedulerTimer
from gpushift.values import Trigger

#: A change of the wall clock against the monotonic one beyond this, within a second, is a jump.
JUMP_S = 2.0


class Clockwork:
    def __init__(
        self,
        keeper: Keeper,
        reconcile_interval_s: Callable[[], float],
        on_reconcile: Callable[[], None],
        log: Any,
        lookahead: LookAhead | None = None,
    ) -> None:
        self.keeper = keeper
        self.lookahead = lookahead
        self.reconcile_interval_s = reconcile_interval_s
        self.on_reconcile = on_reconcile
        self.log = log
        self._scheduler: Any = None
        self._last_offset = time.time() - time.monotonic()
        self._last_reconcile = time.monotonic()

    def start(self) -> None:
        """Start APScheduler (the boundary job) and the once-a-second GLib timer."""
        from apscheduler.schedulers.background import BackgroundScheduler
        from gi.repository import GLib

        self._scheduler = BackgroundScheduler(
            timezone=timezone.utc,
            job_defaults={"coalesce": True, "misfire_grace_time": None, "max_instances": 1},
        )
        self._scheduler.start()
        if self.lookahead is not None:
            self.lookahead.attach(SchedulerTimer(self._scheduler))
        self.arm()
        self._last_offset = time.time() - time.monotonic()
        self._last_reconcile = time.monotonic()
        GLib.timeout_add(1000, self._every_second)

    def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)

    def arm(self) -> None:
        """(Re-)arm the boundary job for the next boundary or override end, and the look-ahead's."""
        sched = self._scheduler
        if sched is None:
            return
        from apscheduler.triggers.date import DateTrigger

        when = self.keeper.next_wakeup()
        if when is None:
            if sched.get_job("boundary"):
                sched.remove_job("boundary")
        else:
            sched.add_job(self._on_boundary, DateTrigger(run_date=when), id="boundary", replace_existing=True)
            self.log.debug("boundary_armed", at=when.isoformat())
        self._look_ahead()

    def _look_ahead(self) -> None:
        if self.lookahead is None:
            return
        try:
            self.lookahead.evaluate()
        except Exception as e:  # an edge: log it, the switch's own path goes on
            self.log.exception("lookahead_failed", error=repr(e))

    def tick(self, trigger: Trigger) -> None:
        """Ask the keeper to decide; the edge of every caller: log a failure, never raise."""
        try:
            action = self.keeper.tick(trigger)
        except Exception as e:
            self.log.exception("tick_failed", error=repr(e))
            return
        self.log.debug("tick", trigger=trigger.value, action=action)
        self._look_ahead()

    def _on_boundary(self) -> None:
        """On APScheduler's thread, at a schedule boundary (or an override's end)."""
        self.tick(Trigger.SCHEDULE)
        self.arm()

    def _every_second(self) -> bool:
        """GLib (monotonic) timer: notice wall-clock jumps, reconcile every reconcile_interval_s."""
        offset = time.time() - time.monotonic()
        jumped = abs(offset - self._last_offset) > JUMP_S
        if jumped:
            self.log.warning(
                "clock_jump",
                seconds=round(offset - self._last_offset, 1),
                detail="re-arming the schedule and reconciling",
            )
        self._last_offset = offset  # every second: slow NTP slewing never adds up to a "jump"
        due = time.monotonic() - self._last_reconcile >= self.reconcile_interval_s()
        if jumped or due:
            self._last_reconcile = time.monotonic()
            self.on_reconcile()
        return True

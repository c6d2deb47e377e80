"""Look-ahead — act some time before the keeper's next switch (pre-warm, a hook, a notice).

A *consumer* says how long before a coming switch it wants to act (asked per switch, so a
per-backend lead fits) and what to do; :class:`LookAhead` keeps one timer job per consumer at
``at - lead`` of the coming switch (:meth:`gpushift.keeper.Keeper.coming_switch`), or at once if
that moment has passed.  The jobs are re-evaluated whenever the clockwork re-arms and after every
keeper decision (an override, a hold, a resume, a reload or a clock jump moves them).  A job that
fires asks again and acts only if the same switch (instant and target) is still coming, and at
most once per switch.  A consumer with an ``abandon`` callback is told when a switch it acted on
is called off before its time.

``act`` runs on the scheduler's worker threads and ``abandon`` on the thread that re-evaluated:
both must return soon (start a process or queue work, never wait on it).  An exception in either
is logged, never raised.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from gpushift.host.nulllog import NULL_LOG
from gpushift.keeper import Coming


class Timer(Protocol):
    """Where the jobs live (APScheduler's scheduler in the daemon, a fake in the unit tests)."""

    def set(self, job_id: str, when: datetime, fn: Callable[[], None]) -> None:
        """Run ``fn`` once at ``when`` (at once if it has passed), replacing the job ``job_id``."""
        ...

    def cancel(self, job_id: str) -> None:
        """Forget ``job_id`` (no error if there is none)."""
        ...


@dataclass(frozen=True)
class Consumer:
    """``lead_s(coming)``: how long before that switch to act (None or ≤ 0: not for this one);
    ``act(coming)``: do it; ``abandon(coming)``: a switch it acted on was called off early."""

    name: str
    lead_s: Callable[[Coming], float | None]
    act: Callable[[Coming], None]
    abandon: Callable[[Coming], None] | None = None


@dataclass
class _State:
    consumer: Consumer
    armed: Coming | None = None  # the switch the job waits for
    due: datetime | None = None  # at - lead
    acted: Coming | None = None  # the switch it acted on (at most once each)
    acted_at: datetime | None = None


class LookAhead:
    """Args:
    coming: the keeper's ``coming_switch``.
    now: the wall clock (aware UTC), the one the keeper and the timer use.
    log: structlog logger (default: none, :data:`~gpushift.host.nulllog.NULL_LOG`).
    """

    def __init__(
        self, coming: Callable[[], Coming | None], now: Callable[[], datetime], log: Any = NULL_LOG
    ) -> None:
        self.coming = coming
        self.now = now
        self.log = log
        self._timer: Timer | None = None
        self._states: dict[str, _State] = {}
        self._lock = threading.RLock()

    def add(self, consumer: Consumer) -> None:
        """Register a consumer (names are unique); armed at once if the timer is attached."""
        with self._lock:
            if consumer.name in self._states:
                raise ValueError(f"look-ahead consumer {consumer.name!r} is already registered")
            self._states[consumer.name] = _State(consumer)
        self.evaluate()

    def attach(self, timer: Timer) -> None:
        """Start arming jobs on ``timer`` (the clockwork does this once its scheduler runs)."""
        with self._lock:
            self._timer = timer
        self.evaluate()

    @staticmethod
    def job_id(name: str) -> str:
        return f"lookahead:{name}"

    # ------------------------------------------------------------ re-evaluation

    def evaluate(self) -> None:
        """Re-arm every consumer's job for the switch coming now (cheap; called often)."""
        abandoned: list[tuple[Consumer, Coming]] = []
        with self._lock:
            timer = self._timer
            if timer is None:
                return
            coming = self._ask()
            now = self.now()
            for name, st in self._states.items():
                if st.acted is not None and (coming is None or coming.key != st.acted.key):
                    if now < st.acted.at and st.consumer.abandon is not None:
                        abandoned.append((st.consumer, st.acted))
                    st.acted = st.acted_at = None
                due = self._due(st.consumer, coming, now)
                if coming is None or due is None or st.acted is not None:
                    if st.armed is not None:
                        timer.cancel(self.job_id(name))
                    st.armed = st.due = None
                    continue
                if st.armed is not None and st.armed.key == coming.key and st.due == due:
                    continue  # already waiting for it
                st.armed, st.due = coming, due
                timer.set(self.job_id(name), max(due, now), self._firing(name, coming.key))
                self._debug("lookahead_armed", consumer=name, to=coming.target, at=coming.at.isoformat(),
                            fires_at=max(due, now).isoformat())  # fmt: skip
        for consumer, c in abandoned:
            self._debug("lookahead_abandoned", consumer=consumer.name, to=c.target, at=c.at.isoformat())
            self._call(consumer.name, "abandon", consumer.abandon, c)

    def _due(self, consumer: Consumer, coming: Coming | None, now: datetime) -> datetime | None:
        if coming is None or coming.at <= now:
            return None  # nothing to look ahead to (a switch due now is the keeper's already)
        try:
            lead = consumer.lead_s(coming)
        except Exception as e:
            self._error("lookahead_lead_failed", consumer=consumer.name, error=repr(e))
            return None
        if lead is None or lead <= 0:
            return None
        return coming.at - timedelta(seconds=lead)

    def _firing(self, name: str, key: tuple[str, str]) -> Callable[[], None]:
        return lambda: self.fire(name, key)

    def fire(self, name: str, key: tuple[str, str]) -> None:
        """The job of ``name`` for the switch ``key`` is due: act if that switch is still coming."""
        with self._lock:
            st = self._states.get(name)
            if st is None:
                return
            coming = self._ask()
            now = self.now()
            if coming is None or coming.key != key or coming.at <= now:
                self._debug("lookahead_stale", consumer=name, detail="that switch is no longer coming")
                return
            if st.acted is not None and st.acted.key == key:
                return  # at most once per switch
            st.acted, st.acted_at = coming, now
            st.armed = st.due = None
            consumer = st.consumer
        self._info("lookahead_fired", consumer=name, to=coming.target, at=coming.at.isoformat())
        self._call(name, "act", consumer.act, coming)

    # ------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        """What each consumer is armed for and what it last acted on (for ``status --json``)."""
        with self._lock:
            out: dict[str, Any] = {}
            for name, st in self._states.items():
                out[name] = {
                    "armed": (
                        {**st.armed.as_dict(), "fires_at": st.due.isoformat() if st.due else None}
                        if st.armed is not None
                        else None
                    ),
                    "acted": (
                        {**st.acted.as_dict(), "acted_at": st.acted_at.isoformat() if st.acted_at else None}
                        if st.acted is not None
                        else None
                    ),
                }
            return out

    # ------------------------------------------------------------ edges

    def _ask(self) -> Coming | None:
        try:
            return self.coming()
        except Exception as e:
            self._error("lookahead_coming_failed", error=repr(e))
            return None

    def _call(self, name: str, what: str, fn: Callable[[Coming], None] | None, c: Coming) -> None:
        if fn is None:
            return
        try:
            fn(c)
        except Exception as e:
            self._error(f"lookahead_{what}_failed", consumer=name, to=c.target, error=repr(e))

    def _info(self, event: str, **kw: Any) -> None:
        self.log.info(event, **kw)

    def _debug(self, event: str, **kw: Any) -> None:
        self.log.debug(event, **kw)

    def _error(self, event: str, **kw: Any) -> None:
        self.log.error(event, **kw)


class SchedulerTimer:
    """:class:`Timer` on APScheduler's ``BackgroundScheduler`` (the clockwork's): one DateTrigger job
    each.  After a wall-clock jump the clockwork re-adds its boundary job, which wakes the
    scheduler's thread: it then sees every job's time afresh, these included."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def set(self, job_id: str, when: datetime, fn: Callable[[], None]) -> None:
        from apscheduler.triggers.date import DateTrigger

        self.scheduler.add_job(fn, DateTrigger(run_date=when), id=job_id, replace_existing=True)

    def cancel(self, job_id: str) -> None:
        from apscheduler.jobstores.base import JobLookupError

        # It ran (a DateTrigger job is removed after its run) or was never added: nothing to do.
        with contextlib.suppress(JobLookupError):
            self.scheduler.remove_job(job_id)

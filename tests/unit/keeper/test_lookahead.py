"""Look-ahead: the next switch the keeper will make by itself, and the consumers that act some time
before it (pre-warm, the ``before_boundary`` hook, the webhook's notice).

``coming_switch`` is pure; :class:`LookAhead` runs here on a fake timer whose jobs the test fires by
hand, and once on APScheduler's real scheduler (as in the daemon).  2026-03-02 is a Monday.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from gpushift.keeper import Coming, Keeper, Override, coming_switch
from gpushift.keeper.decide import Ask
from gpushift.keeper.lookahead import Consumer, LookAhead, SchedulerTimer
from gpushift.schedule import Schedule, parse_schedule
from gpushift.values import Caller, Mode

UTC = timezone.utc

#: Day from 08:00, night from 20:00, and night confirmed again at midnight (a boundary that keeps
#: the same backend: not a switch).
SCHEDULE = """\
TZ=UTC
0 8  * * *  day
0 20 * * *  night
0 0  * * *  night
"""


def utc(day: int, hour: int, minute: int = 0, second: int = 0) -> datetime:
    return datetime(2026, 3, day, hour, minute, second, tzinfo=UTC)


def schedule() -> Schedule:
    return parse_schedule(SCHEDULE, "/etc/gpushift/schedule", backends=["day", "night"])


def override(backend: str, until: datetime | None, mode: Mode = Mode.OVERRIDE) -> Override:
    return Override(mode, backend, until, "alice", utc(2, 9), "demo")


# --------------------------------------------------------------------------- the coming switch


def test_coming_switch_is_the_schedules_next_change_of_backend() -> None:
    c = coming_switch(utc(2, 12), schedule(), None)
    assert c is not None
    assert (c.at, c.from_backend, c.target, c.line) == (utc(2, 20), "day", "night", 3)
    assert "schedule line 3" in c.why


def test_a_boundary_that_keeps_the_same_backend_is_not_a_coming_switch() -> None:
    # At 22:00 night runs; midnight names night again: the next switch is day at 08:00.
    c = coming_switch(utc(2, 22), schedule(), None)
    assert c is not None and (c.at, c.target) == (utc(3, 8), "day")


def test_no_switch_is_coming_during_a_hold_or_without_a_schedule() -> None:
    assert coming_switch(utc(2, 12), schedule(), override("night", None, Mode.HOLD)) is None
    assert coming_switch(utc(2, 12), None, None) is None


def test_an_override_counts_from_its_end_when_the_schedule_then_wants_another_backend() -> None:
    # night by hand until 15:00 while the schedule wants day: day comes back at 15:00, not at 08:00.
    c = coming_switch(utc(2, 12), schedule(), override("night", utc(2, 15)))
    assert c is not None
    assert (c.at, c.from_backend, c.target) == (utc(2, 15), "night", "day")
    assert "override of night ends" in c.why


def test_an_override_of_the_backend_the_schedule_wants_at_its_end_waits_for_the_next_change() -> None:
    # day by hand until 21:00 during the day period... at 21:00 the schedule wants night: switch then.
    c = coming_switch(utc(2, 12), schedule(), override("day", utc(2, 21)))
    assert c is not None and (c.at, c.target) == (utc(2, 21), "night")
    # night by hand until 21:00: the schedule wants night then too; the next switch is day at 08:00.
    c = coming_switch(utc(2, 12), schedule(), override("night", utc(2, 21)))
    assert c is not None and (c.at, c.from_backend, c.target) == (utc(3, 8), "night", "day")


class _Switcher:
    """The little of a switcher the keeper's constructor, ``coming_switch`` and a person's switch touch."""

    def add_listener(self, listener: Callable[..., None]) -> None:
        pass

    def snapshot(self) -> tuple[bool, str | None]:
        return False, "day"

    def request(self, target: str, *args: Any, **kw: Any) -> str:
        return f"ticket-{target}"


class _Store:
    def __init__(self) -> None:
        self.ov: Override | None = None

    def load(self) -> Override | None:
        return self.ov

    def save(self, override: Override | None) -> None:
        self.ov = override


def test_the_keepers_coming_switch_follows_a_persons_hold_and_resume_of_it() -> None:
    now = [utc(2, 12)]
    keeper = Keeper(_Switcher(), schedule(), _Store(), now=lambda: now[0], monotonic=lambda: 0.0)  # type: ignore[arg-type]
    c = keeper.coming_switch()
    assert c is not None and (c.at, c.target) == (utc(2, 20), "night")
    ticket, _ov = keeper.ask(Ask("night", "", Caller(uid=1000, user="alice", pid=1), hold=True))
    assert ticket == "ticket-night"
    assert keeper.coming_switch() is None
    keeper.override = None  # what resume leaves (its tick needs a real switcher)
    c = keeper.coming_switch()
    assert c is not None and c.target == "night"


# --------------------------------------------------------------------------- the consumers


@dataclass
class FakeTimer:
    jobs: dict[str, tuple[datetime, Callable[[], None]]] = field(default_factory=dict)
    sets: int = 0

    def set(self, job_id: str, when: datetime, fn: Callable[[], None]) -> None:
        self.jobs[job_id] = (when, fn)
        self.sets += 1

    def cancel(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)

    def when(self, name: str) -> datetime | None:
        job = self.jobs.get(LookAhead.job_id(name))
        return job[0] if job else None

    def run(self, name: str) -> None:
        """Fire the job the way the scheduler does: once, then it is gone."""
        _, fn = self.jobs.pop(LookAhead.job_id(name))
        fn()


@dataclass
class World:
    """The keeper's answer and the wall clock, both set by the test."""

    now: datetime = utc(2, 12)
    coming: Coming | None = None
    acted: list[Coming] = field(default_factory=list)
    abandoned: list[Coming] = field(default_factory=list)
    timer: FakeTimer = field(default_factory=FakeTimer)
    la: Any = None

    def set_coming(self, at: datetime, target: str) -> None:
        self.coming = Coming(at, target, "day", "test")


def world(lead: Callable[[Coming], float | None] = lambda c: 300.0, with_abandon: bool = True) -> World:
    w = World()
    w.set_coming(utc(2, 20), "night")
    w.la = LookAhead(lambda: w.coming, lambda: w.now)
    w.la.attach(w.timer)
    w.la.add(Consumer("prewarm", lead, w.acted.append, w.abandoned.append if with_abandon else None))
    return w


def test_a_consumers_job_is_armed_its_lead_before_the_switch_and_acts_once() -> None:
    w = world()
    assert w.timer.when("prewarm") == utc(2, 19, 55)
    w.now = utc(2, 19, 55)
    w.timer.run("prewarm")
    assert [c.target for c in w.acted] == ["night"]
    # Re-evaluations (every decision, every re-arm) never act on the same switch twice.
    w.la.evaluate()
    assert w.timer.when("prewarm") is None
    w.la.fire("prewarm", w.coming.key)  # type: ignore[union-attr]
    assert len(w.acted) == 1
    st = w.la.status()["prewarm"]
    assert st["armed"] is None and st["acted"]["to"] == "night"


def test_a_lead_that_has_already_passed_arms_the_job_at_once() -> None:
    w = world()
    w.now = utc(2, 19, 58)  # 2 minutes before; lead 5 minutes
    w.set_coming(utc(2, 20, 0, 1), "night")  # another instant: a new switch
    w.la.evaluate()
    assert w.timer.when("prewarm") == utc(2, 19, 58)


def test_a_job_that_fires_for_a_switch_no_longer_coming_does_nothing_and_is_moved() -> None:
    w = world()
    stale = w.timer.jobs[LookAhead.job_id("prewarm")][1]
    w.set_coming(utc(2, 21), "night")  # an override moved the switch to 21:00
    stale()
    assert w.acted == []
    w.la.evaluate()
    assert w.timer.when("prewarm") == utc(2, 20, 55)


def test_a_hold_disarms_and_a_switch_acted_on_then_called_off_is_abandoned() -> None:
    w = world()
    w.now = utc(2, 19, 56)
    w.timer.run("prewarm")
    assert len(w.acted) == 1
    w.coming = None  # a person holds day: no switch is coming
    w.la.evaluate()
    assert [c.target for c in w.abandoned] == ["night"]
    assert w.timer.jobs == {}
    w.la.evaluate()
    assert len(w.abandoned) == 1  # told once


def test_a_switch_that_happened_is_not_abandoned_and_the_next_one_is_armed() -> None:
    w = world()
    w.now = utc(2, 19, 56)
    w.timer.run("prewarm")
    w.now = utc(2, 20, 0, 5)  # the boundary passed; the keeper switched; next: day at 08:00
    w.set_coming(utc(3, 8), "day")
    w.la.evaluate()
    assert w.abandoned == []
    assert w.timer.when("prewarm") == utc(3, 7, 55)


def test_the_lead_is_asked_per_switch_none_or_zero_means_not_for_this_one() -> None:
    leads = {"night": 600.0, "day": 0.0}
    w = world(lead=lambda c: leads.get(c.target))
    assert w.timer.when("prewarm") == utc(2, 19, 50)
    w.set_coming(utc(3, 8), "day")
    w.la.evaluate()
    assert w.timer.when("prewarm") is None
    w.set_coming(utc(3, 8), "off")
    w.la.evaluate()
    assert w.timer.when("prewarm") is None


def test_re_evaluation_keeps_a_job_that_is_already_right() -> None:
    w = world()
    sets = w.timer.sets
    for _ in range(5):
        w.la.evaluate()
    assert w.timer.sets == sets


def test_a_failing_consumer_is_logged_and_never_breaks_the_others() -> None:
    class Log:
        def __init__(self) -> None:
            self.errors: list[tuple[str, dict[str, Any]]] = []

        def info(self, event: str, **kw: Any) -> None:
            pass

        def debug(self, event: str, **kw: Any) -> None:
            pass

        def error(self, event: str, **kw: Any) -> None:
            self.errors.append((event, kw))

    log = Log()
    w = world()
    w.la.log = log

    def boom(c: Coming) -> None:
        raise RuntimeError("disk gone")

    w.la.add(Consumer("hook", lambda c: 300.0, boom))
    w.now = utc(2, 19, 55)
    w.timer.run("hook")
    w.timer.run("prewarm")
    assert len(w.acted) == 1
    assert [e for e, _ in log.errors] == ["lookahead_act_failed"]
    with pytest.raises(ValueError, match="already registered"):
        w.la.add(Consumer("hook", lambda c: 1.0, boom))


def test_on_apschedulers_real_scheduler_a_passed_lead_fires_at_once() -> None:
    from apscheduler.schedulers.background import BackgroundScheduler

    sched = BackgroundScheduler(timezone=UTC, job_defaults={"misfire_grace_time": None, "max_instances": 1})
    sched.start()
    try:
        fired = threading.Event()
        now = datetime.now(UTC)
        coming = Coming(now + timedelta(seconds=60), "night", "day", "test")
        la = LookAhead(lambda: coming, lambda: datetime.now(UTC))
        la.add(Consumer("notice", lambda c: 600.0, lambda c: fired.set()))
        la.attach(SchedulerTimer(sched))
        assert fired.wait(10), "the job armed at once never ran"
        la.evaluate()  # acted on: nothing is armed, and cancelling a job that ran is no error
        assert la.status()["notice"]["armed"] is None
        # APScheduler removes a date job after submitting it; a shutdown in between makes its own
        # thread fail to find the job (a warning in the test run, nothing the daemon does).
        deadline = time.monotonic() + 10
        while sched.get_job(LookAhead.job_id("notice")) is not None and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        sched.shutdown(wait=False)

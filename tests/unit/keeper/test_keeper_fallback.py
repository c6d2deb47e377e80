"""The fallback rule (``gpushift/keeper/fallback.py``) and its place in the decision table.

A crashed backend whose relaunches all failed (``max_attempts``; e.g. a port impostor holds its
port) gives way, once, to the backend that served before it when ``on_failure = "rollback"``: the
host serves something whenever something can serve.  With ``"stay"``, or when nothing known served
before, the keeper gives up as before.  Plain snapshots, no clock: day serves from 08:00, night from
20:00 (UTC); 2026-03-02 is a Monday.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from gpushift.keeper import Attempts, Snapshot, decide
from gpushift.keeper.decide import Ended, Relaunch, Switch
from gpushift.keeper.fallback import fall_back
from gpushift.keeper.watch import Incident
from gpushift.values import OFF, Outcome, Trigger

UTC = timezone.utc
CRASH = Incident(Outcome.CRASHED, "day", "gs-day.service exited by itself (killed by signal 9)")
REFUSED = "refused: port 8000 is already taken by pid 99 (python3, user nobody)"


def utc(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 3, day, hour, minute, tzinfo=UTC)


def snap(**kw: Any) -> Snapshot:
    """Monday noon, no schedule: day crashed a minute ago and is down (night served before it)."""
    base = Snapshot(
        now=utc(2, 12, 1),
        mono=1000.0,
        trigger=Trigger.RECONCILE,
        schedule=None,
        override=None,
        busy=False,
        established=OFF,
        running=(),
        relaunch=Relaunch("day", utc(2, 12), CRASH.detail, restart=False, before="night"),
        max_attempts=2,
    )
    return replace(base, **kw)


def gave_up(failures: int = 2) -> Attempts:
    return Attempts(utc(2, 12), "day", failures=failures, last_failure_mono=900.0, last_message=REFUSED)


def switches(d: Any) -> list[Switch]:
    return [a for a in d.actions if isinstance(a, Switch)]


# --------------------------------------------------------------------------- the pure rule


def test_fall_back_to_the_backend_that_served_before_once_nothing_serves() -> None:
    fb = fall_back("day", "night", False, 2, REFUSED, OFF, "rollback", "never")
    assert fb is not None and fb.target == "night"
    assert fb.reason == f"fallback: 2 failed relaunches of day (last: {REFUSED}); night served before it"
    assert fb.blocked.startswith("fell back to night after 2 failed relaunches of day")


def test_fall_back_does_not_apply_with_stay_without_a_before_or_while_something_serves() -> None:
    assert fall_back("day", "night", False, 2, REFUSED, OFF, "stay", "never") is None
    assert fall_back("day", None, False, 2, REFUSED, OFF, "rollback", "never") is None
    assert fall_back("day", OFF, False, 2, REFUSED, OFF, "rollback", "never") is None
    assert fall_back("day", "day", False, 2, REFUSED, OFF, "rollback", "never") is None
    assert fall_back("day", "night", False, 2, REFUSED, "other", "rollback", "never") is None


def test_fall_back_is_tried_once_and_says_whether_it_serves() -> None:
    serving = fall_back("day", "night", True, 2, REFUSED, "night", "rollback", "never")
    assert serving is not None and serving.target is None and serving.reason == ""
    assert serving.blocked.startswith("fell back to night after 2 failed relaunches of day")
    failed = fall_back("day", "night", True, 3, REFUSED, OFF, "rollback", "never")
    assert failed is not None and failed.target is None
    assert "but night does not serve (nothing serves)" in failed.blocked


# --------------------------------------------------------------------------- in the decision table


def test_decide_a_crash_remembers_who_served_before() -> None:
    d = decide(snap(established="day", running=(), incident=CRASH, relaunch=None, before="night"))
    assert d.relaunch is not None and d.relaunch.before == "night" and not d.relaunch.fell_back
    assert [(s.target, s.trigger) for s in switches(d)] == [("day", Trigger.RECOVERY)]


def test_decide_relaunches_under_max_attempts_are_retried_not_fallen_back() -> None:
    d = decide(snap(attempts=gave_up(failures=1)))
    assert [s.target for s in switches(d)] == ["day"]


def test_decide_relaunches_that_gave_up_fall_back_to_the_backend_that_served_before() -> None:
    d = decide(snap(attempts=gave_up()))
    (sw,) = switches(d)
    assert (sw.target, sw.trigger, sw.actual) == ("night", Trigger.ROLLBACK, OFF)
    assert "2 failed relaunches of day" in sw.reason and REFUSED in sw.reason
    assert sw.details == {"fallback": {"from": "day", "failed_relaunches": 2}}
    assert d.relaunch is not None and d.relaunch.fell_back and d.relaunch.backend == "day"
    assert d.blocked is not None and d.blocked.startswith("fell back to night")
    # night serves then: nothing more is asked for, status keeps saying why day does not serve
    after = decide(snap(attempts=d.attempts, relaunch=d.relaunch, established="night", running=("night",)))
    assert switches(after) == [] and after.blocked is not None and "fell back to night" in after.blocked
    assert after.relaunch == d.relaunch


def test_decide_a_fallback_that_failed_too_is_not_tried_again() -> None:
    d = decide(snap(attempts=gave_up()))
    failed = Ended("night", Trigger.ROLLBACK, False, "night: start job failed", 1001.0)
    after = decide(snap(attempts=d.attempts, relaunch=d.relaunch, ended=(failed,), mono=2000.0))
    assert switches(after) == []
    assert after.blocked is not None and "nothing serves" in after.blocked


def test_decide_with_on_failure_stay_or_nothing_before_gives_up_as_before() -> None:
    unknown = Relaunch("day", utc(2, 12), CRASH.detail, restart=False, before=None)
    for s in (snap(attempts=gave_up(), on_failure="stay"), snap(attempts=gave_up(), relaunch=unknown)):
        d = decide(s)
        assert switches(d) == []
        assert d.blocked is not None and d.blocked.startswith("gave up switching to day after 2")


def test_decide_a_cancelled_relaunch_does_not_fall_back() -> None:
    d = decide(snap(attempts=replace(gave_up(failures=1), cancelled_by="alice")))
    assert switches(d) == [] and d.blocked is not None and "cancelled by alice" in d.blocked

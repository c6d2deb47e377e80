"""The keeper's decision table: :func:`gpushift.keeper.decide` from a snapshot to actions.

No thread, no bus, no clock: every case is a plain :class:`Snapshot` and the assertion is on the
:class:`Decision` it gives.  The schedule is day from 08:00, night from 20:00 (UTC); 2026-03-02 is
a Monday.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from gpushift.keeper import Attempts, Decision, Override, Snapshot, WatchSettings, decide
from gpushift.keeper.decide import (
    Adopt,
    Ask,
    Ended,
    Log,
    RecordExternal,
    RecordIncident,
    RecordRelaunch,
    Relaunch,
    SetOverride,
    Switch,
    after_result,
)
from gpushift.keeper.watch import Incident
from gpushift.schedule import parse_schedule
from gpushift.values import OFF, Caller, Mode, Outcome, OverrideSource, Trigger

UTC = timezone.utc
SCHEDULE = parse_schedule(
    "TZ=UTC\n0 8 * * * day\n0 20 * * * night\n", "test.schedule", backends={"day", "night"}
)


def utc(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 3, day, hour, minute, tzinfo=UTC)


def snap(**kw: Any) -> Snapshot:
    """Monday noon, day serving as established, schedule mode, nothing failed."""
    base = Snapshot(
        now=utc(2, 12),
        mono=1000.0,
        trigger=Trigger.RECONCILE,
        schedule=SCHEDULE,
        override=None,
        busy=False,
        established="day",
        running=("day",),
    )
    return replace(base, **kw)


def switches(d: Decision) -> list[tuple[str, Trigger]]:
    return [(a.target, a.trigger) for a in d.actions if isinstance(a, Switch)]


def of(d: Decision, kind: type) -> list[Any]:
    return [a for a in d.actions if isinstance(a, kind)]


def test_decide_schedule_satisfied_does_nothing() -> None:
    d = decide(snap())
    assert d.actions == () and d.summary == "day serves as the schedule wants"


def test_decide_boundary_passed_switches_to_the_entry_in_effect() -> None:
    d = decide(snap(now=utc(2, 20, 0), trigger=Trigger.SCHEDULE))
    assert switches(d) == [("night", Trigger.SCHEDULE)]
    (sw,) = of(d, Switch)
    assert "schedule line 3" in sw.reason and sw.actual == "day"
    assert d.attempts == Attempts(utc(2, 20), "night")


def test_decide_clock_jump_is_just_a_new_now() -> None:
    # A wall clock that jumped forward over 20:00 (suspend, NTP step): the same rule applies.
    d = decide(snap(now=utc(2, 23, 17)))
    assert switches(d) == [("night", Trigger.RECONCILE)]
    # ... and one that jumped back into the day keeps what the day wants.
    assert switches(decide(snap(now=utc(2, 9), established="day"))) == []


def test_decide_busy_decides_nothing() -> None:
    d = decide(snap(now=utc(2, 21), busy=True))
    assert d.actions == () and "a switch is running" in d.summary


def test_decide_override_until_keeps_what_runs_then_ends() -> None:
    ov = Override(Mode.OVERRIDE, "night", utc(2, 20), "alice", utc(2, 11))
    d = decide(snap(override=ov, running=("night",), established="night"))
    assert d.actions == () and d.summary.startswith("override until")
    d = decide(snap(now=utc(2, 20), override=ov, running=("night",), established="night"))
    assert SetOverride(None) in d.actions
    assert of(d, Log)[0].event == "override_ended"
    assert switches(d) == []  # at 20:00 the schedule wants night, which runs


def test_decide_hold_never_ends_by_itself() -> None:
    ov = Override(Mode.HOLD, "day", None, "alice", utc(2, 11))
    d = decide(snap(now=utc(9, 23), override=ov))
    assert d.actions == () and d.summary.startswith("hold: keeping day")


def test_decide_resume_is_no_override_and_switches_at_once() -> None:
    # `gpushift resume` clears the override; the next decision obeys the schedule.
    d = decide(snap(now=utc(2, 22), override=None))
    assert switches(d) == [("night", Trigger.RECONCILE)]


def test_decide_failed_switch_is_retried_only_after_the_spacing() -> None:
    a = after_result(Attempts(utc(2, 20), "night"), ok=False, message="night: health 503", ended_mono=1000.0)
    assert a is not None and a.failures == 1
    d = decide(snap(now=utc(2, 20, 1), mono=1010.0, attempts=a))
    assert switches(d) == [] and d.summary == "retrying night in 20s"
    d = decide(snap(now=utc(2, 20, 1), mono=1030.0, attempts=a))
    assert switches(d) == [("night", Trigger.RECONCILE)]
    assert after_result(a, ok=True, message="", ended_mono=2000.0) == a  # success does not count


def test_decide_attempts_exhausted_gives_up_until_the_next_boundary() -> None:
    a = Attempts(utc(2, 20), "night", failures=3, last_failure_mono=0.0, last_message="boom")
    d = decide(snap(now=utc(2, 21), attempts=a, max_attempts=3))
    assert switches(d) == []
    assert (
        d.blocked is not None
        and "gave up switching to night after 3 failed attempts (last: boom)" in d.blocked
    )
    assert "2026-03-03T08:00:00+00:00" in d.blocked
    # The next boundary (a new fire) starts counting again.
    d = decide(snap(now=utc(3, 8), attempts=a, running=("night",), established="night", blocked=d.blocked))
    assert switches(d) == [("day", Trigger.RECONCILE)] and d.blocked is None


CRASH = Incident(
    Outcome.CRASHED, "day", "gs-day.service exited by itself (exit status 0)", "success", "exit status 0"
)


def test_decide_backend_died_is_recorded_adopted_as_off_and_brought_back() -> None:
    d = decide(snap(running=(), incident=CRASH))
    assert of(d, RecordIncident) == [RecordIncident(CRASH)]
    assert Adopt(OFF, force=True) in d.actions
    assert of(d, Log)[0].event == "backend_crashed"
    assert of(d, RecordExternal) == [] and of(d, SetOverride) == []
    assert switches(d) == [("day", Trigger.RECOVERY)]
    assert d.relaunch is not None and d.relaunch.backend == "day" and not d.relaunch.restart


def test_decide_crashed_backend_under_an_override_is_relaunched_too() -> None:
    ov = Override(Mode.OVERRIDE, "day", utc(2, 20), "alice", utc(2, 11))
    d = decide(snap(running=(), incident=CRASH, override=ov))
    assert switches(d) == [("day", Trigger.RECOVERY)]


def test_decide_crashed_backend_with_on_crash_stay_is_not_relaunched() -> None:
    d = decide(snap(running=(), incident=CRASH, settings={"day": WatchSettings(on_crash="stay")}))
    assert of(d, RecordIncident) and switches(d) == []
    assert d.blocked is not None and 'on_crash = "stay"' in d.blocked
    # ...and stays so at the next decision, until the next boundary
    again = decide(
        snap(
            running=(), established=OFF, relaunch=d.relaunch, settings={"day": WatchSettings(on_crash="stay")}
        )
    )
    assert switches(again) == [] and again.relaunch == d.relaunch
    assert switches(decide(snap(now=utc(2, 20), running=(), established=OFF, relaunch=d.relaunch))) == [
        ("night", Trigger.RECONCILE)
    ]


def test_decide_crash_that_systemd_restarted_is_recorded_and_nothing_more() -> None:
    inc = Incident(Outcome.CRASHED, "day", "restarted by systemd", serving_again=True)
    d = decide(snap(incident=inc))
    assert of(d, RecordIncident) == [RecordIncident(inc)] and switches(d) == [] and d.relaunch is None
    assert of(d, Adopt) == []


def test_decide_wedged_backend_is_relaunched_through_the_gate() -> None:
    inc = Incident(Outcome.UNHEALTHY, "day", "day has not answered its health URL for 130s")
    d = decide(snap(incident=inc))
    (sw,) = of(d, Switch)
    assert (sw.target, sw.trigger, sw.relaunch) == ("day", Trigger.RECOVERY, True)
    assert of(d, Adopt) == []  # it still runs: the relaunch stops it first


def test_decide_relaunch_behind_our_back_is_recorded() -> None:
    d = decide(snap(relaunched="gs-day.service was relaunched outside gpushift (main pid 1 -> 2)"))
    assert [a.backend for a in of(d, RecordRelaunch)] == ["day"] and switches(d) == []


def test_decide_person_stopped_a_unit_is_an_external_override_until_the_next_boundary() -> None:
    d = decide(snap(running=()))  # day inactive, not failed: `systemctl stop`
    assert RecordExternal("day", OFF) in d.actions and switches(d) == []
    (so,) = of(d, SetOverride)
    ov = so.override
    assert (ov.mode, ov.backend, ov.until, ov.set_by, ov.source) == (
        Mode.OVERRIDE,
        OFF,
        utc(2, 20),
        "systemctl",
        OverrideSource.EXTERNAL,
    )


def test_decide_person_started_a_unit_under_a_hold_keeps_the_hold_of_what_runs() -> None:
    hold = Override(Mode.HOLD, "day", None, "alice", utc(2, 11), "demo")
    d = decide(snap(override=hold, running=("night",)))
    (so,) = of(d, SetOverride)
    assert so.override == replace(hold, backend="night")
    assert RecordExternal("day", "night") in d.actions and switches(d) == []


def test_decide_several_running_waits_for_a_person() -> None:
    d = decide(snap(running=("day", "night")))
    assert d.actions == () and "several backends run" in d.summary


def test_decide_unknown_established_adopts_what_runs() -> None:
    d = decide(snap(established=None, running=("night",), now=utc(2, 12)))
    assert d.actions[0] == Adopt("night") and switches(d) == [("day", Trigger.RECONCILE)]


def test_decide_without_schedule_only_follows_people() -> None:
    d = decide(snap(schedule=None, now=utc(2, 12) + timedelta(days=3)))
    assert d.actions == () and d.summary == "day serves (no schedule)"


def test_decide_cancelled_scheduled_switch_waits_for_the_next_boundary() -> None:
    a = after_result(Attempts(utc(2, 20), "night"), False, "cancelled by carol", 1000.0, cancelled_by="carol")
    d = decide(snap(now=utc(2, 20, 5), mono=5000.0, attempts=a))  # long after the retry spacing
    assert switches(d) == []
    assert d.blocked is not None and "cancelled by carol" in d.blocked and "gpushift resume" in d.blocked
    # the next boundary is a new attempt
    d = decide(snap(now=utc(3, 8), attempts=a, running=("night",), established="night"))
    assert switches(d) == [("day", Trigger.RECONCILE)]


BUSY = {"day": WatchSettings(defer_while_busy_s=600, idle_s=5)}


def test_decide_boundary_with_a_busy_backend_is_deferred_then_taken_when_idle() -> None:
    at = utc(2, 20)
    d = decide(
        snap(now=at, mono=1000.0, trigger=Trigger.SCHEDULE, settings=BUSY, in_flight=3, idle_for_s=None)
    )
    assert switches(d) == [] and d.deferral is not None and "deferred until" in d.summary
    assert d.deferral.until() == at + timedelta(seconds=600)
    # still busy 30 s later: still waiting (no ticket, nothing asked of the switcher)
    d2 = decide(
        snap(now=at + timedelta(seconds=30), mono=1030.0, settings=BUSY, in_flight=1, deferral=d.deferral)
    )
    assert switches(d2) == [] and d2.deferral == d.deferral
    # idle for 5 s: switch, and the row will say how long it waited and why it ended
    d3 = decide(
        snap(
            now=at + timedelta(seconds=40),
            mono=1040.0,
            settings=BUSY,
            in_flight=0,
            idle_for_s=5.5,
            deferral=d.deferral,
        )
    )
    (sw,) = of(d3, Switch)
    assert (
        sw.target == "night"
        and sw.details["deferral"]["ended"] == "idle"
        and sw.details["deferral"]["waited_s"] == 40
    )
    assert d3.deferral is None


def test_decide_deferral_ends_at_its_limit_even_while_busy() -> None:
    at = utc(2, 20)
    d = decide(snap(now=at, mono=1000.0, settings=BUSY, in_flight=2))
    late = decide(
        snap(now=at + timedelta(seconds=601), mono=1601.0, settings=BUSY, in_flight=2, deferral=d.deferral)
    )
    (sw,) = of(late, Switch)
    assert sw.details["deferral"]["ended"] == "limit"


def test_decide_no_deferral_when_off_idle_or_unknowable() -> None:
    at = utc(2, 20)
    assert switches(decide(snap(now=at, in_flight=5))) == [("night", Trigger.RECONCILE)]  # off by default
    assert switches(decide(snap(now=at, settings=BUSY, in_flight=0, idle_for_s=30))) != []  # idle already
    assert switches(decide(snap(now=at, settings=BUSY))) != []  # no gauges: cannot tell busy from idle


def test_decide_manual_switch_is_deferred_only_with_when_idle() -> None:
    ov = Override(Mode.OVERRIDE, "night", utc(2, 20), "alice", utc(2, 12), when_idle=True)
    d = decide(snap(override=ov, in_flight=2))
    assert switches(d) == [] and d.deferral is not None and d.deferral.limit_s == 600


# --------------------------------------------------------------------------- switches asked for


ALICE = Caller(uid=1000, user="alice", pid=77)


def test_decide_a_persons_switch_is_asked_for_first_then_its_override_kept() -> None:
    # Monday noon, day serving: `gpushift switch night` keeps night until the next boundary (20:00).
    old = Relaunch("day", utc(2, 11), "wedged", restart=True)
    d = decide(snap(asked=Ask("night", "demo", ALICE), blocked="gave up on day", relaunch=old))
    sw, keep = d.actions  # the order matters: a refused switch (SwitchInProgress) keeps nothing
    assert isinstance(sw, Switch) and isinstance(keep, SetOverride)
    assert (sw.target, sw.trigger, sw.caller, sw.reason) == ("night", Trigger.MANUAL, ALICE, "demo")
    assert (sw.skip_drain, sw.relaunch, sw.verify_running) == (False, False, False)
    assert keep.override == Override(Mode.OVERRIDE, "night", utc(2, 20), "alice", utc(2, 12), "demo")
    assert d.blocked is None and d.relaunch is None, "a person acted: no stale 'gave up', no relaunch"


def test_decide_a_persons_switch_with_hold_until_now_and_restart() -> None:
    (sw, keep) = decide(snap(asked=Ask("night", "", ALICE, hold=True, skip_drain=True))).actions
    assert isinstance(keep, SetOverride) and keep.override is not None and keep.override.mode is Mode.HOLD
    assert isinstance(sw, Switch) and sw.skip_drain
    (sw, keep) = decide(snap(asked=Ask("day", "", ALICE, until=utc(2, 15), relaunch=True))).actions
    assert isinstance(keep, SetOverride) and keep.override is not None and keep.override.until == utc(2, 15)
    assert isinstance(sw, Switch) and sw.relaunch and not sw.verify_running  # --restart: the whole gate


def test_decide_a_persons_switch_when_idle_only_keeps_the_override() -> None:
    d = decide(snap(asked=Ask("night", "after the batch", ALICE, when_idle=True)))
    (keep,) = d.actions
    assert isinstance(keep, SetOverride) and keep.override is not None and keep.override.when_idle
    assert switches(d) == [], "the rules switch once day is idle"


def test_decide_a_persons_switch_while_busy_is_still_asked_for() -> None:
    # The switcher answers SwitchInProgress itself (at once, naming the switch in flight).
    assert switches(decide(snap(busy=True, asked=Ask("night", "", ALICE)))) == [("night", Trigger.MANUAL)]


def test_decide_recovery_at_daemon_start_verifies_its_target_and_keeps_the_override() -> None:
    ov = Override(Mode.HOLD, "night", None, "alice", utc(2, 11))
    d = decide(snap(override=ov, asked=Ask("night", "recovery: died", Caller.daemon(), Trigger.RECOVERY,
                                         recovery_attempt=2)))  # fmt: skip
    (sw,) = d.actions
    assert isinstance(sw, Switch) and (sw.trigger, sw.verify_running, sw.recovery_attempt) == (
        Trigger.RECOVERY,
        True,
        2,
    )
    assert sw.caller == Caller.daemon()


def test_decide_a_persons_failed_switch_leaves_the_override_on_what_runs() -> None:
    ov = Override(Mode.HOLD, "night", None, "alice", utc(2, 11), "try night")
    failed = Ended("night", Trigger.MANUAL, ok=False, message="rolled back", ended_mono=990.0)
    d = decide(snap(override=ov, ended=(failed,)))  # day serves again (rolled back)
    assert of(d, SetOverride) == [
        SetOverride(replace(ov, backend="day", reason="try night (switch to night failed)"))
    ]
    assert d.attempts is None, "a person's switch is no attempt of the keeper's"
    ok = Ended("night", Trigger.MANUAL, ok=True, message="night is serving", ended_mono=990.0)
    assert (
        of(
            decide(snap(override=replace(ov), running=("night",), established="night", ended=(ok,))),
            SetOverride,
        )
        == []
    )


def test_decide_a_failed_switch_of_the_keepers_counts_as_an_attempt_from_when_it_ended() -> None:
    a = Attempts(utc(2, 20), "night")
    failed = Ended("night", Trigger.SCHEDULE, ok=False, message="night: health 503", ended_mono=1000.0)
    d = decide(snap(now=utc(2, 20, 1), mono=1010.0, attempts=a, ended=(failed,)))
    assert switches(d) == [] and d.summary == "retrying night in 20s"
    assert d.attempts is not None and (d.attempts.failures, d.attempts.last_failure_mono) == (1, 1000.0)
    # while a switch runs, the end is still taken into account
    d = decide(snap(now=utc(2, 20, 1), mono=1010.0, attempts=a, ended=(failed,), busy=True))
    assert d.attempts is not None and d.attempts.failures == 1


def test_decide_a_backend_brought_back_ends_its_relaunch() -> None:
    r = Relaunch("day", utc(2, 11), "day exited by itself", restart=False)
    back = Ended("day", Trigger.RECOVERY, ok=True, message="day is serving", ended_mono=990.0)
    d = decide(snap(relaunch=r, ended=(back,), schedule=None))
    assert d.relaunch is None and switches(d) == []

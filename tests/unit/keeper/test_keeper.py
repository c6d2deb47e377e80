"""The keeper against a real Switcher on the stateful fakes: obey the schedule, yield to people.

Every test drives :meth:`Keeper.tick` the way the daemon does (at start, every reconcile interval,
at a boundary with trigger ``schedule``) and then asserts what the world looks like: which switches
were asked for (and with which trigger), what runs, what the ledger says, what ``status`` shows.

Time: the World's FakeClock (its monotonic time drives retry spacing and the switcher's timeouts);
the keeper's wall clock is :class:`Wall`, the FakeClock's ``now`` shifted to a chosen start instant,
so both move together when a test lets time pass.  2026-03-02 is a Monday; schedules are in UTC
unless a test is about local times.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from gpushift_unit_fakes import MemoryOverrideStore  # loaded by tests/unit/conftest.py

from gpushift.errors import GpushiftError
from gpushift.keeper import Keeper, Override, OverrideStore
from gpushift.keeper.decide import Ask
from gpushift.keeper.store import JsonOverrideStore
from gpushift.schedule import Schedule, parse_schedule
from gpushift.switch import Switcher
from gpushift.values import OFF, Caller, Outcome, SwitchRecord, Trigger

UTC = timezone.utc
ALICE = Caller(uid=1000, user="alice", pid=77)

#: Day from 08:00, night from 20:00, and night confirmed again at midnight (a boundary that names the
#: backend already in effect: it ends a default override and resets the failed-attempt count).
SCHEDULE = """\
# minute hour dom month dow  backend
TZ=UTC
0 8  * * *  day
0 20 * * *  night
0 0  * * *  night
"""

#: Two boundaries within two hours with different targets (coalescing of missed boundaries).
SCHEDULE_WITH_OFF = """\
TZ=UTC
0 8  * * *  day
0 20 * * *  night
0 22 * * *  off
"""


def utc(day: int, hour: int, minute: int = 0, second: int = 0) -> datetime:
    """An instant in March 2026 (UTC)."""
    return datetime(2026, 3, day, hour, minute, second, tzinfo=UTC)


MONDAY_NOON = utc(2, 12)


# --------------------------------------------------------------------------- helpers


class Wall:
    """The keeper's wall clock: the FakeClock's ``now`` shifted so that it starts at ``start``."""

    def __init__(self, clock: Any, start: datetime) -> None:
        self.clock = clock
        self.offset = start - clock.now()

    def now(self) -> datetime:
        return self.clock.now() + self.offset

    def advance(self, seconds: float) -> None:
        """Time passes: wall and monotonic clocks move together."""
        self.clock.advance(seconds)

    def advance_to(self, at: datetime) -> None:
        delta = (at - self.now()).total_seconds()
        assert delta >= 0, f"time runs forward only: now {self.now()}, asked for {at}"
        self.clock.advance(delta)


@dataclass
class Rig:
    """A World, its Switcher (with a spy on ``request``), a Keeper, the keeper's wall clock, a store."""

    world: Any
    wall: Wall
    store: OverrideStore
    schedule: Schedule | None
    keeper: Keeper = field(init=False)
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # (target, trigger, user)
    max_attempts: int = 3
    retry_after_s: float = 30.0

    def __post_init__(self) -> None:
        self._spy(self.world.switcher)
        self.keeper = self._keeper()

    def _spy(self, switcher: Switcher) -> None:
        real = switcher.request

        def request(
            target: str,
            reason: str,
            caller: Caller,
            trigger: Trigger = Trigger.MANUAL,
            skip_drain: bool = False,
            **kw: Any,
        ) -> str:
            self.requests.append((target, trigger.value, caller.user))
            return real(target, reason, caller, trigger, skip_drain, **kw)

        switcher.request = request  # type: ignore[method-assign]

    def _keeper(self) -> Keeper:
        return Keeper(
            self.world.switcher,
            self.schedule,
            self.store,
            now=self.wall.now,
            monotonic=self.world.clock.monotonic,
            max_attempts=self.max_attempts,
            retry_after_s=self.retry_after_s,
        )

    def restart(self) -> Keeper:
        """The daemon restarts: a new Switcher (knowing nothing) and a new Keeper on the same store."""
        w = self.world
        w.switcher = Switcher(w.config, w.ports, listener=w._listen, version="0.0.0-test")
        self._spy(w.switcher)
        self.keeper = self._keeper()
        return self.keeper

    def tick(self, trigger: Trigger = Trigger.RECONCILE) -> str:
        """One tick, then wait for the switch it may have started to finish."""
        action = self.keeper.tick(trigger)
        self.settle()
        return action

    def tick_at(self, at: datetime, trigger: Trigger = Trigger.RECONCILE) -> str:
        self.wall.advance_to(at)
        return self.tick(trigger)

    def settle(self) -> None:
        assert self.world.switcher.wait(20), "a switch is still running after 20 s (real time)"

    def manual(
        self, backend: str, hold: bool = False, until: datetime | None = None, reason: str = "by hand"
    ) -> Override:
        """``gpushift switch`` as the daemon does it: the keeper decides it (the switch asked for,
        then the override kept) and its executor asks the switcher."""
        ticket, ov = self.keeper.ask(Ask(backend, reason, ALICE, hold=hold, until=until))
        assert ticket is not None and ov is not None
        self.settle()
        res = self.world.switcher.result(ticket)
        assert res is not None and res.ok, res
        return ov

    def keeper_requests(self) -> list[tuple[str, str]]:
        """The switches the keeper asked for (not people's): (target, trigger)."""
        return [(t, trig) for t, trig, user in self.requests if user == "gpushift"]

    def rows(self, trigger: str | None = None) -> list[SwitchRecord]:
        rows = [self.world.ledger.rows[i] for i in sorted(self.world.ledger.rows)]
        return [r for r in rows if trigger is None or r.trigger == trigger]

    def status(self) -> dict[str, Any]:
        return self.keeper.status()


@pytest.fixture
def rig(make_world: Callable[..., Any]) -> Iterator[Callable[..., Rig]]:
    """``rig(start=..., running="day", schedule=SCHEDULE, **world_settings)`` → a Rig.

    ``schedule=None`` builds a keeper without a schedule; ``store`` shares a store between rigs.
    """

    def make(
        start: datetime = MONDAY_NOON,
        running: str | None = "day",
        schedule: str | None = SCHEDULE,
        store: OverrideStore | None = None,
        max_attempts: int = 3,
        retry_after_s: float = 30.0,
        **world_settings: Any,
    ) -> Rig:
        world = make_world(**world_settings)
        world.boot(running)
        sched = (
            parse_schedule(schedule, "test.schedule", backends=world.config.backends) if schedule else None
        )
        return Rig(
            world,
            Wall(world.clock, start),
            store if store is not None else MemoryOverrideStore(),
            sched,
            max_attempts=max_attempts,
            retry_after_s=retry_after_s,
        )

    yield make


def until_of(mode: str) -> datetime:
    """The instant at the end of ``override X until <iso>``."""
    head, sep, iso = mode.partition(" until ")
    assert sep and head.startswith("override "), mode
    return datetime.fromisoformat(iso)


# --------------------------------------------------------------------------- obeying the schedule


def test_keeper_start_in_a_night_period_with_nothing_running_brings_up_night(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 22), running=None)
    r.tick(Trigger.RECONCILE)
    assert r.keeper_requests() == [("night", "reconcile")]
    assert r.world.running() == ["night"]
    (row,) = r.rows()
    assert (row.trigger, row.requested_by, row.from_backend, row.to_backend) == (
        "reconcile",
        "gpushift",
        None,
        "night",
    )
    assert row.outcome == Outcome.OK.value
    assert "line 4" in row.reason, "the ledger says which schedule line asked for the switch"


def test_keeper_start_with_the_wrong_backend_running_switches_to_the_one_in_effect(
    rig: Callable[..., Rig],
) -> None:
    r = rig(start=utc(2, 22), running="day")
    r.tick(Trigger.RECONCILE)
    assert r.keeper_requests() == [("night", "reconcile")]
    assert r.world.running() == ["night"]
    assert r.world.unit_calls() == [("stop", "day"), ("start", "night")]
    # the switch is the keeper's own: the next tick neither undoes it nor calls it external
    r.wall.advance(60)
    r.tick()
    assert r.keeper_requests() == [("night", "reconcile")]
    assert r.rows("external") == []
    assert r.status()["mode"] == "schedule"


def test_keeper_switches_at_a_boundary_with_trigger_schedule(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 19, 59), running="day")
    r.tick()
    assert r.keeper_requests() == [], "day is in effect before 20:00"
    r.tick_at(utc(2, 20), Trigger.SCHEDULE)
    assert r.keeper_requests() == [("night", "schedule")]
    assert r.world.running() == ["night"]
    (row,) = r.rows()
    assert (row.trigger, row.from_backend, row.to_backend, row.outcome) == ("schedule", "day", "night", "ok")


def test_keeper_right_backend_running_switches_nothing(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 12), running="day")
    for at in (utc(2, 12), utc(2, 15), utc(2, 19, 59, 59)):
        r.tick_at(at)
    r.tick_at(utc(2, 20), Trigger.SCHEDULE)  # night now: one switch
    r.tick_at(utc(3, 0), Trigger.SCHEDULE)  # midnight names night again: nothing to do
    r.tick_at(utc(3, 3))
    assert r.keeper_requests() == [("night", "schedule")]
    assert r.world.unit_calls() == [("stop", "day"), ("start", "night")]
    assert len(r.rows()) == 1


def test_keeper_two_backends_running_touches_nothing(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 12), running="day")
    r.tick()
    r.world.units.set_running(r.world.unit("night"))  # somebody started night beside day
    r.wall.advance(60)
    action = r.tick()
    assert "several backends" in action
    assert r.keeper_requests() == []
    assert r.world.unit_calls() == []
    assert r.rows() == [], "neither a switch nor an 'external' row: which one is meant is not known"


# --------------------------------------------------------------------------- people: switch, hold, until


def test_keeper_manual_switch_holds_until_the_next_boundary_then_the_schedule_takes_over(
    rig: Callable[..., Rig],
) -> None:
    r = rig(start=utc(2, 21), running="night")
    r.tick()
    ov = r.manual("day", reason="demo for a customer")
    assert (ov.mode, ov.backend, ov.until, ov.set_by, ov.source) == (
        "override",
        "day",
        utc(3, 0),
        "alice",
        "manual",
    )
    assert r.status()["mode"].startswith("override day until ")
    assert until_of(r.status()["mode"]) == utc(3, 0)
    for at in (utc(2, 21, 1), utc(2, 22), utc(2, 23, 59, 59)):
        r.tick_at(at)
    assert r.keeper_requests() == [], "the schedule wants night, but a person chose day until midnight"
    assert r.world.running() == ["day"]
    r.tick_at(utc(3, 0), Trigger.SCHEDULE)
    assert r.keeper_requests() == [("night", "schedule")]
    assert r.world.running() == ["night"]
    assert r.keeper.override is None
    assert r.store.load() is None, "the ended override is gone from the store too"
    assert r.status()["mode"] == "schedule"


def test_keeper_hold_keeps_the_backend_across_boundaries_until_resume(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 12), running="day")
    ov = r.manual("night", hold=True)
    assert (ov.mode, ov.until) == ("hold", None)
    assert r.status()["mode"] == "hold night (until gpushift resume)"
    for at in (utc(2, 20), utc(3, 0), utc(3, 8), utc(3, 12), utc(4, 8)):
        r.tick_at(at, Trigger.SCHEDULE)
    assert r.keeper_requests() == []
    assert r.world.running() == ["night"]
    assert r.status()["mode"] == "hold night (until gpushift resume)"
    summary = r.keeper.resume(ALICE)
    r.settle()
    assert "obeying the schedule again" in summary
    assert r.keeper_requests() == [("day", "reconcile")], "resume switches at once, not at the next boundary"
    assert r.world.running() == ["day"]
    assert r.status()["mode"] == "schedule"
    assert r.store.load() is None


def test_keeper_until_ends_the_override_at_that_time_not_at_the_boundary(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 12), running="day")
    ov = r.manual("night", until=utc(3, 9, 30))
    assert (ov.mode, ov.until) == ("override", utc(3, 9, 30))
    # 20:00, midnight and 08:00 (day!) pass: the person's "until" wins over every boundary
    for at in (utc(2, 20), utc(3, 0), utc(3, 8), utc(3, 9, 29, 59)):
        r.tick_at(at, Trigger.SCHEDULE)
    assert r.keeper_requests() == []
    assert r.world.running() == ["night"]
    r.tick_at(utc(3, 9, 30), Trigger.SCHEDULE)
    assert r.keeper_requests() == [("day", "schedule")]
    assert r.world.running() == ["day"]
    assert r.status()["mode"] == "schedule"


def test_keeper_resume_during_an_override_switches_at_once_and_clears_the_store(
    rig: Callable[..., Rig],
) -> None:
    r = rig(start=utc(2, 12), running="day")
    r.manual("night")
    assert r.store.load() is not None
    r.wall.advance(600)
    r.keeper.resume(ALICE)
    r.settle()
    assert r.keeper_requests() == [("day", "reconcile")]
    assert r.world.running() == ["day"]
    assert r.keeper.override is None and r.store.load() is None
    (row,) = [x for x in r.rows() if x.requested_by == "gpushift"]
    assert (row.trigger, row.from_backend, row.to_backend) == ("reconcile", "night", "day")


def test_keeper_resume_when_the_schedule_already_agrees_switches_nothing(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 12), running="day")
    r.manual("day", hold=True)
    r.keeper.resume(ALICE)
    r.settle()
    assert r.keeper_requests() == []
    assert r.status()["mode"] == "schedule"


def test_keeper_resume_without_a_schedule_is_refused(rig: Callable[..., Rig]) -> None:
    r = rig(schedule=None)
    with pytest.raises(GpushiftError, match="no schedule"):
        r.keeper.resume(ALICE)


@pytest.mark.parametrize("store_kind", ["memory", "json"])
def test_keeper_hold_survives_a_daemon_restart(
    rig: Callable[..., Rig], tmp_path: Path, store_kind: str
) -> None:
    store: OverrideStore = (
        MemoryOverrideStore() if store_kind == "memory" else JsonOverrideStore(tmp_path / "override.json")
    )
    r = rig(start=utc(2, 12), running="day", store=store)
    ov = r.manual("night", hold=True, reason="benchmark all week")
    r.wall.advance(3600)
    k2 = r.restart()
    assert k2.override == ov
    assert k2.status()["mode"] == "hold night (until gpushift resume)"
    for at in (utc(2, 20), utc(3, 8), utc(3, 12)):
        r.tick_at(at, Trigger.SCHEDULE)
    assert r.keeper_requests() == [], "a restarted daemon keeps the person's hold"
    assert r.world.running() == ["night"]
    k2.resume(ALICE)
    r.settle()
    assert r.keeper_requests() == [("day", "reconcile")]


def test_keeper_override_survives_a_restart_and_still_ends_at_its_boundary(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 21), running="night")
    r.manual("day")
    r.wall.advance_to(utc(2, 22))
    r.restart()
    r.tick()
    assert r.keeper_requests() == [], "the restarted daemon does not undo the person's switch"
    assert until_of(r.status()["mode"]) == utc(3, 0)
    r.tick_at(utc(3, 0), Trigger.SCHEDULE)
    assert r.keeper_requests() == [("night", "schedule")]


def test_keeper_override_that_ended_while_the_daemon_was_down_ends_at_the_first_tick(
    rig: Callable[..., Rig],
) -> None:
    r = rig(start=utc(2, 12), running="day")
    r.manual(OFF)  # until 20:00
    r.wall.advance_to(utc(2, 21))  # the daemon was down from before 20:00 until now
    r.restart()
    r.tick(Trigger.RECONCILE)
    assert r.keeper_requests() == [("night", "reconcile")]
    assert r.world.running() == ["night"]
    assert r.keeper.override is None and r.store.load() is None


# --------------------------------------------------------------------------- systemctl behind our back


def test_keeper_external_stop_is_not_undone_before_the_next_boundary(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 12), running="day")
    r.tick()
    r.world.units.set_stopped(r.world.unit("day"))  # `systemctl stop gpushift-day`
    r.tick_at(utc(2, 12, 1))
    assert r.keeper_requests() == []
    assert r.world.running() == []
    (row,) = r.rows()
    assert (row.trigger, row.requested_by, row.from_backend, row.to_backend, row.outcome) == (
        "external",
        "systemctl",
        "day",
        OFF,
        "ok",
    )
    ov = r.keeper.override
    assert ov is not None and (ov.source, ov.backend, ov.until) == ("external", OFF, utc(2, 20))
    assert r.status()["mode"] == f"override off until {utc(2, 20).isoformat()}"
    for at in (utc(2, 13), utc(2, 19, 59, 59)):
        r.tick_at(at)
    assert r.keeper_requests() == [], "the person's stop is respected until the next boundary"
    assert len(r.rows("external")) == 1, "one external change, one ledger row"
    r.tick_at(utc(2, 20), Trigger.SCHEDULE)
    assert r.keeper_requests() == [("night", "schedule")]
    assert r.world.running() == ["night"]
    assert r.status()["mode"] == "schedule"


def test_keeper_external_start_of_another_backend_is_recorded_and_kept(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 21), running="night")
    r.tick()
    units = r.world.units
    units.set_stopped(r.world.unit("night"))
    units.set_running(r.world.unit("day"))
    r.tick_at(utc(2, 21, 5))
    (row,) = r.rows("external")
    assert (row.from_backend, row.to_backend) == ("night", "day")
    assert row.unit == r.world.unit("day")
    assert row.argv_running, "the external row names the command that really runs"
    assert until_of(r.status()["mode"]) == utc(3, 0)
    r.tick_at(utc(2, 23))
    assert r.keeper_requests() == []
    assert r.world.running() == ["day"]
    r.tick_at(utc(3, 0), Trigger.SCHEDULE)
    assert r.keeper_requests() == [("night", "schedule")]
    assert r.world.running() == ["night"]


def test_keeper_external_change_is_told_from_the_keepers_own_switch(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 19, 59), running="day")
    r.tick()
    r.tick_at(utc(2, 20), Trigger.SCHEDULE)
    r.tick_at(utc(2, 20, 1))
    assert r.rows("external") == []
    # a person's `gpushift switch` is not external either
    r.manual("day")
    r.tick_at(utc(2, 20, 2))
    assert r.rows("external") == []
    assert r.keeper.override is not None and r.keeper.override.source == "manual"


# --------------------------------------------------------------------------- a target that keeps failing


def _failing_night(r: Rig) -> None:
    r.world.units.behave(r.world.unit("night"), start_job_result="failed", start_failure_result="exit-code")


def test_keeper_gives_up_after_max_attempts_with_spacing_then_the_next_boundary_resets(
    rig: Callable[..., Rig],
) -> None:
    r = rig(start=utc(2, 19, 59), running="day", max_attempts=3, retry_after_s=30)
    _failing_night(r)
    r.tick()
    r.tick_at(utc(2, 20), Trigger.SCHEDULE)
    assert r.keeper_requests() == [("night", "schedule")]
    assert r.world.running() == ["day"], "rolled back"
    r.tick()  # collects the failure at once
    r.wall.advance(29)
    r.tick()
    assert len(r.keeper_requests()) == 1, "no retry sooner than retry_after_s"
    r.wall.advance(1)
    r.tick()
    assert len(r.keeper_requests()) == 2
    r.tick()
    r.wall.advance(30)
    r.tick()
    assert len(r.keeper_requests()) == 3
    r.tick()
    for _ in range(20):  # 10 more minutes of reconcile ticks
        r.wall.advance(30)
        r.tick()
    assert len(r.keeper_requests()) == 3, "after max_attempts the keeper waits for the next boundary"
    blocked = r.status()["schedule"]["blocked"]
    assert blocked is not None
    assert "night" in blocked and "3 failed attempts" in blocked
    assert "start job" in blocked, "status says what failed"
    assert utc(3, 0).isoformat() in blocked, "and when the keeper will try again"
    assert r.world.running() == ["day"]
    r.tick_at(utc(2, 23, 59))
    assert len(r.keeper_requests()) == 3
    # midnight is a new boundary (naming night again): the count starts afresh
    r.tick_at(utc(3, 0), Trigger.SCHEDULE)
    assert r.keeper_requests()[3:] == [("night", "schedule")]
    assert r.status()["schedule"]["blocked"] is None


def test_keeper_retries_when_the_target_recovers_and_then_stays(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 20), running="day", retry_after_s=30)
    _failing_night(r)
    r.tick(Trigger.SCHEDULE)
    r.tick()
    r.world.units.behave(r.world.unit("night"), start_job_result="done")  # fixed by an admin
    r.wall.advance(30)
    r.tick()
    assert r.keeper_requests() == [("night", "schedule"), ("night", "reconcile")]
    assert r.world.running() == ["night"]
    r.wall.advance(30)
    r.tick()
    assert len(r.keeper_requests()) == 2
    assert r.status()["schedule"]["blocked"] is None


def test_keeper_retry_spacing_counts_from_the_failed_switch_not_from_the_next_tick(
    rig: Callable[..., Rig],
) -> None:
    """The daemon ticks every reconcile_interval_s (30 s by default), not right after a switch ends.

    A switch that failed at 20:00 must be retried at the first tick at least retry_after_s after
    that failure; measuring from the tick that happened to notice the failure doubles the spacing.
    """
    r = rig(start=utc(2, 20), running="day", retry_after_s=30)
    _failing_night(r)
    r.tick(Trigger.SCHEDULE)  # the switch fails (fast) right after 20:00
    r.wall.advance(30)  # the next reconcile tick comes 30 s later
    r.tick()
    assert len(r.keeper_requests()) == 2, (
        f"the retry is due 30 s after the failure, got {r.keeper.last_action!r}"
    )


def test_keeper_manual_switch_clears_a_stale_blocked_reason(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 20), running="day", max_attempts=1)
    _failing_night(r)
    r.tick(Trigger.SCHEDULE)
    r.tick()
    assert r.status()["schedule"]["blocked"] is not None
    r.manual(OFF, reason="give up on night for today")
    st = r.status()
    assert st["mode"].startswith("override off until ")
    assert st["schedule"]["blocked"] is None, (
        "a person decided: status must not still say the keeper waits for a person"
    )


# --------------------------------------------------------------------------- busy, misfires


def test_keeper_tick_while_a_switch_runs_does_nothing(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 21), running="day")
    release = threading.Event()
    day = r.world.units.behave(r.world.unit("day"), hold_stop=release)
    try:
        r.keeper.tick(Trigger.RECONCILE)  # starts day -> night; the stop of day hangs
        assert day.stop_entered.wait(10), "the keeper's switch never reached the stop"
        for trigger in (Trigger.RECONCILE, Trigger.SCHEDULE, Trigger.RECONCILE):
            r.wall.advance(30)
            action = r.keeper.tick(trigger)
            assert "switch is running" in action
        assert r.keeper_requests() == [("night", "reconcile")]
        assert r.rows("external") == []
    finally:
        release.set()
    r.settle()
    assert r.world.running() == ["night"]
    r.tick()
    assert r.keeper_requests() == [("night", "reconcile")]
    assert r.rows("external") == []


def test_keeper_boundaries_missed_while_down_give_one_switch_to_the_latest(rig: Callable[..., Rig]) -> None:
    # day ran when the daemon went down before 20:00; it comes back at 23:30: 20:00 (night) and 22:00
    # (off) were both missed.  One switch, to what is in effect now.
    r = rig(start=utc(2, 23, 30), running="day", schedule=SCHEDULE_WITH_OFF)
    r.tick(Trigger.RECONCILE)
    assert r.keeper_requests() == [(OFF, "reconcile")]
    assert r.world.running() == []
    assert r.world.unit_calls() == [("stop", "day")]
    r.tick_at(utc(2, 23, 31))
    assert r.keeper_requests() == [(OFF, "reconcile")]


def test_keeper_boundary_passed_during_a_switch_gives_one_switch_after_it(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 21, 55), running="day", schedule=SCHEDULE_WITH_OFF)
    release = threading.Event()
    day = r.world.units.behave(r.world.unit("day"), hold_stop=release)
    try:
        r.keeper.tick(Trigger.RECONCILE)  # day -> night, held in the stop of day
        assert day.stop_entered.wait(10)
        r.wall.advance_to(utc(2, 22))
        r.keeper.tick(Trigger.SCHEDULE)  # the 22:00 boundary fires while the switch runs
        r.wall.advance_to(utc(2, 22, 1))
        r.keeper.tick(Trigger.RECONCILE)
    finally:
        release.set()
    r.settle()
    assert r.world.running() == ["night"]
    r.tick()
    assert r.keeper_requests() == [("night", "reconcile"), (OFF, "reconcile")]
    assert r.world.running() == []
    r.wall.advance(30)
    r.tick()
    assert len(r.keeper_requests()) == 2


# --------------------------------------------------------------------------- status, next wakeup

SHANGHAI = """\
TZ=Asia/Shanghai
0 8  * * *  day
0 20 * * *  night
"""


def test_keeper_status_in_schedule_mode_shows_wants_and_the_next_switch(rig: Callable[..., Rig]) -> None:
    # 10:00 UTC = 18:00 in Shanghai: day since 08:00 local (00:00 UTC), night at 20:00 local
    r = rig(start=utc(2, 10), running="day", schedule=SHANGHAI)
    r.tick()
    st = r.status()
    assert st["mode"] == "schedule"
    assert st["override"] is None
    s = st["schedule"]
    assert s["tz"] == "Asia/Shanghai"
    assert s["wants"] == "day"
    assert datetime.fromisoformat(s["since"]) == utc(2, 0)
    assert s["next"]["target"] == "night"
    assert datetime.fromisoformat(s["next"]["at"]) == utc(2, 12)
    assert s["next"]["at"].endswith("+00:00")
    assert s["next"]["at_local"] == "2026-03-02T20:00:00+08:00"
    assert s["next"]["line"] == 3
    assert s["blocked"] is None
    assert s["last_action"], "status says what the last tick did"


def test_keeper_status_next_is_the_next_change_not_a_boundary_that_repeats_the_target(
    rig: Callable[..., Rig],
) -> None:
    r = rig(start=utc(2, 21), running="night")
    s = r.status()["schedule"]
    assert s["wants"] == "night"
    # midnight names night again: the next *switch* is day at 08:00
    assert (s["next"]["target"], datetime.fromisoformat(s["next"]["at"])) == ("day", utc(3, 8))
    assert r.keeper.next_wakeup() == utc(3, 0), "the timer still wakes at the midnight boundary"


def test_keeper_status_and_ticks_without_a_schedule(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 12), running=None, schedule=None)
    r.tick()
    assert r.keeper_requests() == [], "without a schedule gpushift only switches when asked"
    st = r.status()
    assert st["mode"] == "manual (no schedule)"
    assert "schedule" not in st
    assert r.keeper.next_wakeup() is None
    ov = r.manual("night")
    assert (ov.mode, ov.until) == ("hold", None), "no boundary to end it: it lasts until changed"
    assert r.status()["mode"] == "manual (no schedule)"
    assert r.keeper.next_wakeup() is None


def test_keeper_status_modes_for_override_and_hold(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 12), running="day")
    r.manual("night", until=utc(2, 18))
    st = r.status()
    assert st["mode"] == f"override night until {utc(2, 18).isoformat()}"
    assert st["override"]["backend"] == "night" and st["override"]["set_by"] == "alice"
    assert st["schedule"]["wants"] == "day", "status shows what the schedule wants meanwhile"
    r.manual("day", hold=True)
    st = r.status()
    assert st["mode"] == "hold day (until gpushift resume)"
    assert st["override"]["until"] is None


@pytest.mark.parametrize(
    ("until", "wakeup"),
    [
        (None, utc(2, 20)),  # default override: ends at the boundary
        (utc(2, 18), utc(2, 18)),  # ends before the boundary: wake then
        (utc(3, 9, 30), utc(2, 20)),  # ends after it: the boundary comes first
    ],
)
def test_keeper_next_wakeup_is_the_earlier_of_boundary_and_override_end(
    rig: Callable[..., Rig], until: datetime | None, wakeup: datetime
) -> None:
    r = rig(start=utc(2, 12), running="day")
    assert r.keeper.next_wakeup() == utc(2, 20)
    r.manual("night", until=until)
    assert r.keeper.next_wakeup() == wakeup


def test_keeper_next_wakeup_during_a_hold_is_the_next_boundary(rig: Callable[..., Rig]) -> None:
    r = rig(start=utc(2, 21), running="night")
    r.manual("day", hold=True)
    assert r.keeper.next_wakeup() == utc(3, 0)


def test_keeper_failed_manual_switch_keeps_override_on_what_runs(world: Any) -> None:
    store = MemoryOverrideStore()
    keeper = Keeper(world.switcher, None, store, now=world.clock.now, monotonic=world.clock.monotonic)
    world.probe.set_health(world.url("night"), ok_after=None, before=503)  # night never answers
    ticket, ov = keeper.ask(Ask("night", "try night", Caller(uid=0, user="root"), hold=True))
    assert ov is not None and ov.backend == "night"  # kept at once, as the person asked
    assert ticket is not None and world.switcher.wait(20)
    res = world.switcher.result(ticket)
    assert res is not None and res.outcome is Outcome.ROLLED_BACK  # day serves again
    keeper.tick()  # the keeper's first look after the switch (the daemon's, before Finished)
    assert keeper.override is not None and keeper.override.backend == "day" and keeper.override.mode == "hold"
    assert "failed" in keeper.override.reason
    assert store.load().backend == "day"


def test_keeper_cancelled_scheduled_switch_is_not_retried_before_the_next_boundary(
    rig: Callable[..., Rig],
) -> None:
    r = rig(start=utc(2, 21), running="day", retry_after_s=30)
    r.world.probe.set_health(r.world.url("night"), ok_after=None, before=503)
    cancelled: list[str] = []

    def cancel_while_loading(e: Any) -> None:
        if e.kind == "progress" and e.phase == "ready" and not cancelled:
            cancelled.append(r.world.switcher.cancel(ALICE))

    r.world.switcher.listeners.append(cancel_while_loading)
    r.tick(Trigger.RECONCILE)
    assert cancelled and r.world.running() == ["day"]  # rolled back
    r.wall.advance(600)  # long past retry_after_s
    r.tick(Trigger.RECONCILE)
    assert r.keeper_requests() == [("night", "reconcile")]  # asked once, not again
    blocked = r.status()["blocked"]
    assert blocked is not None and "cancelled by alice" in blocked and "resume" in blocked
    r.keeper.resume(ALICE)  # a person asks: the schedule is obeyed again at once
    r.settle()
    assert r.keeper_requests() == [("night", "reconcile"), ("night", "reconcile")]


def test_keeper_switch_into_a_calendar_exception_records_its_name(rig: Callable[..., Rig]) -> None:
    schedule = SCHEDULE + "except 2026-03-02 .. 2026-03-03 night holidays\n"
    r = rig(start=utc(2, 12), running="day", schedule=schedule)
    r.tick(Trigger.RECONCILE)
    assert r.world.running() == ["night"]
    (row,) = r.rows("reconcile")
    assert row.extra["calendar_exception"] == "holidays"
    assert row.trigger == "reconcile" and "holidays" in row.reason  # the trigger stays a trigger


OVERRIDE_NIGHT = {
    "mode": "override",
    "backend": "night",
    "until": "2026-03-02T20:00:00+00:00",
    "set_by": "alice",
    "set_at": "2026-03-02T11:00:00+00:00",
    "reason": "",
    "source": "manual",
    "when_idle": False,
}


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (json.dumps({**OVERRIDE_NIGHT, "until": "2026-03-02T20:00:00"}), "no UTC offset"),
        (json.dumps({**OVERRIDE_NIGHT, "set_at": "2026-03-02 11:00"}), "no UTC offset"),
        (json.dumps({**OVERRIDE_NIGHT, "until": 5}), "until: expected a string"),
        (json.dumps({**OVERRIDE_NIGHT, "when_idle": "yes"}), "when_idle"),
        (json.dumps({**OVERRIDE_NIGHT, "backend": "gone"}), "'gone' is no longer configured"),
        (json.dumps({**OVERRIDE_NIGHT, "mode": "schedule"}), "mode"),
        (json.dumps({**OVERRIDE_NIGHT, "extra": 1}), "unknown key"),
        (json.dumps([OVERRIDE_NIGHT]), "expected a JSON object"),
        ("[" * 100000 + "]" * 100000, "larger than"),
        ("[" * 20000 + "]" * 20000, "nested deeper than 64"),
        ("\x00garbage\xff", "not valid JSON"),
        ('{"mode": "hold", "backend": "night", "set_at": "9999-12-31T23:59:59-23:59"}', ""),
    ],
)
def test_keeper_ignores_a_bad_override_file_and_follows_the_schedule(
    rig: Callable[..., Rig], tmp_path: Path, content: str, why: str
) -> None:
    """An override.json that is not what the daemon writes (a naive time crashed every tick, and
    so the daemon, in a loop) is ignored: logged, reported, and the schedule is obeyed."""
    path = tmp_path / "override.json"
    path.write_text(content, encoding="utf-8", errors="surrogateescape")
    store = JsonOverrideStore(path, backends={"day", "night"})
    r = rig(start=MONDAY_NOON, running="night", store=store)
    if why:
        assert r.keeper.override is None
        assert store.ignored is not None and why in store.ignored, store.ignored
    r.tick()
    if why:
        assert r.keeper_requests() == [("day", "reconcile")]
    r.manual("night", hold=True)
    assert store.ignored is None, "the next override a person sets clears the note"
    assert JsonOverrideStore(path, backends={"day", "night"}).load() == r.keeper.override


def test_override_file_that_is_not_a_regular_file_is_ignored_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "override.json"
    os.mkfifo(fifo)
    store = JsonOverrideStore(fifo)
    assert store.load() is None and store.ignored == "not a regular file (FIFO)"
    d = tmp_path / "dir.json"
    d.mkdir()
    assert JsonOverrideStore(d).load() is None


def test_status_says_the_override_file_was_ignored() -> None:
    from gpushift.cli import render_status

    why = "until: '2026-03-02T20:00:00' has no UTC offset (a naive time)"
    text = render_status({"daemon": {"running": True, "override_ignored": why}})
    assert f"override: IGNORED, obeying the schedule: {why}" in text.splitlines()
    assert "IGNORED" not in render_status({"daemon": {"running": True, "override_ignored": None}})


def test_keeper_falls_back_to_the_backend_that_served_before_once_relaunches_give_up(
    rig: Callable[..., Rig],
) -> None:
    # night served, then day; day dies and will not start again (its port taken, say): after
    # max_attempts relaunches the keeper brings night back instead of leaving nothing serving.
    r = rig(start=MONDAY_NOON, running="night", schedule=None, max_attempts=2, retry_after_s=30)
    r.manual("day")
    day = r.world.unit("day")
    # it exits by itself (at the next look), and its starts fail from now on
    r.world.units.behave(day, crash_after_s=0, crash_result="signal", start_job_result="failed")
    for _ in range(6):  # three minutes of reconcile ticks
        r.tick()
        r.wall.advance(30)
    assert r.keeper_requests() == [("day", "recovery"), ("day", "recovery"), ("night", "rollback")]
    assert r.world.running() == ["night"]
    (back,) = r.rows(trigger="rollback")
    assert back.outcome == "ok" and back.to_backend == "night"
    assert back.reason.startswith("fallback: 2 failed relaunches of day"), back.reason
    st = r.status()
    assert st["blocked"] is not None and st["blocked"].startswith("fell back to night after 2"), st
    assert st["relaunch"]["backend"] == "day" and st["relaunch"]["fell_back_to"] == "night", st


def test_keeper_with_on_failure_stay_gives_up_and_leaves_nothing_serving(make_world: Any) -> None:
    world = make_world(on_failure="stay")
    world.boot("night")
    keeper = Keeper(
        world.switcher, None, MemoryOverrideStore(), now=world.clock.now, monotonic=world.clock.monotonic,
        max_attempts=2, retry_after_s=0, on_failure="stay",
    )  # fmt: skip
    ticket, _ov = keeper.ask(Ask("day", "by hand", ALICE))
    assert ticket is not None and world.switcher.wait(20)
    world.units.behave(world.unit("day"), crash_after_s=0, crash_result="signal", start_job_result="failed")
    for _ in range(6):
        keeper.tick()
        assert world.switcher.wait(20)
    assert world.running() == []
    assert (keeper.blocked or "").startswith("gave up switching to day after 2 failed attempts")

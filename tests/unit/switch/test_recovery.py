"""Crash recovery and cancel in every phase, against the stateful fakes.

A daemon that "died" is a world left as systemd and the ledger would leave it (units stopped or
started, the intent row pending, the run written down in the run store) and a NEW Switcher built on
the same ports, as the restarted daemon builds it.  Then :func:`recovery.prepare` and
:func:`recovery.start` run the way ``Daemon.converge`` runs them.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from gpushift_unit_fakes import MemoryOverrideStore  # loaded by tests/unit/conftest.py

from gpushift.errors import CancelRefused
from gpushift.keeper import Keeper
from gpushift.switch import Switcher, SwitchRun, recovery
from gpushift.values import OFF, Caller, Outcome, Phase, SwitchRecord, Trigger

CAROL = Caller(uid=1001, user="carol")


class Log:
    """A structlog-like logger that keeps what it was told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.events.append((level, event, kw))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [kw for _lvl, ev, kw in self.events if ev == event]


def died_in(
    world: Any,
    target: str,
    phase: Phase,
    trigger: Trigger = Trigger.MANUAL,
    previous: str | None = "day",
    rollback_to: str | None = None,
    recovery_attempt: int = 0,
) -> SwitchRun:
    """The state a daemon leaves when it dies in ``phase`` of a switch ``previous`` → ``target``:
    a pending intent row and the run in the store (the units are the caller's to arrange)."""
    now = world.clock.now()
    rec = SwitchRecord(
        trigger=trigger.value,
        requested_by="alice",
        reason="before the crash",
        from_backend=previous,
        to_backend=target,
        started_at=now,
        ticket="dead0000beef",
    )
    row_id = world.ledger.begin(rec)
    run = SwitchRun(
        ticket="dead0000beef",
        target=target,
        trigger=trigger,
        requested_by="alice",
        reason="before the crash",
        started_at=now,
        started_mono=0.0,
        phase=phase,
        previous=[previous] if previous else [],
        stopping=[previous] if previous else [],
        touched=phase not in (Phase.PREFLIGHT, Phase.INTENT, Phase.DRAIN),
        ledger_id=row_id,
        rollback_to=rollback_to,
        recovery_attempt=recovery_attempt,
    )
    world.runs.save(run.to_dict())
    world.log.entries.clear()
    world.units.calls.clear()
    return run


def restart(world: Any, override: str | None = None, wants: str | None = None) -> tuple[Any, Log]:
    """The daemon starts again: a new Switcher on the same ports, then converge (the recovery
    switch is the keeper's decision, as ``Daemon.converge`` asks it)."""
    log = Log()
    world.switcher = Switcher(
        world.config, world.ports, listener=world._listen, log=log, version="0.0.0-test"
    )
    plan = recovery.prepare(world.switcher, override, wants, log)
    if plan is not None and not plan.give_up:
        clock = world.clock
        keeper = Keeper(world.switcher, None, MemoryOverrideStore(), now=clock.now, monotonic=clock.monotonic)
        keeper.recover(plan.target, recovery.announce(plan, log), plan.attempt)
        assert world.switcher.wait(20)
    return plan, log


def rows_by_trigger(world: Any, trigger: Trigger) -> list[SwitchRecord]:
    return [r for _i, r in sorted(world.ledger.rows.items()) if r.trigger == trigger.value]


# --------------------------------------------------------------------------- recovery


def test_recovery_manual_switch_that_died_after_the_stop_reaches_its_target(world: Any) -> None:
    world.units.stop(world.unit("day"), 5)  # day was stopped, then the daemon died in the gate
    run = died_in(world, "night", Phase.RELEASE)
    plan, log = restart(world, wants="day")  # the schedule would say day: a person's switch wins
    assert plan is not None and plan.target == "night" and not plan.give_up
    assert world.running() == ["night"]
    old = world.ledger.rows[run.ledger_id]
    assert (old.outcome, old.failed_phase) == (Outcome.INTERRUPTED.value, Phase.RELEASE.value)
    assert old.extra["interrupted"]["recovery_to"] == "night" and "phase release" in old.message
    (new,) = rows_by_trigger(world, Trigger.RECOVERY)
    assert new.outcome == Outcome.OK.value and new.to_backend == "night"
    assert new.argv_running and new.extra.get("launch") is not None  # a complete launch row
    assert log.named("recovery_started")[0]["target"] == "night"
    assert world.runs.load() is None  # the recovery's own run is done


def test_recovery_target_found_active_is_health_checked_and_gets_a_launch_row(world: Any) -> None:
    world.units.stop(world.unit("day"), 5)
    world.units.set_running(world.unit("night"))  # systemd finished the start without the daemon
    died_in(world, "night", Phase.START)
    restart(world)
    assert world.units.calls == []  # nothing stopped or started again
    assert world.log.of("probe.health"), "the running target was not health-checked"
    (new,) = rows_by_trigger(world, Trigger.RECOVERY)
    assert new.outcome == Outcome.OK.value and new.to_backend == "night"
    assert new.argv_running and new.extra.get("launch") is not None


def test_recovery_target_found_active_but_unhealthy_is_not_ok(make_world: Any) -> None:
    world = make_world(on_failure="stay")
    world.units.set_running(world.unit("night"))
    world.probe.set_health(world.url("night"), ok_after=None, before=503)
    died_in(world, "night", Phase.READY)
    restart(world)
    (new,) = rows_by_trigger(world, Trigger.RECOVERY)
    assert new.outcome == Outcome.FAILED.value and new.failed_phase == Phase.READY.value


def test_recovery_during_a_rollback_goes_to_the_rollback_destination(world: Any) -> None:
    world.units.stop(world.unit("day"), 5)
    died_in(world, "night", Phase.ROLLBACK, rollback_to="day")
    plan, _log = restart(world, wants="night")
    assert plan is not None and plan.target == "day"
    assert world.running() == ["day"]


def test_recovery_scheduled_switch_follows_the_schedule_or_the_override(world: Any) -> None:
    world.units.stop(world.unit("day"), 5)
    died_in(world, "night", Phase.RELEASE, trigger=Trigger.SCHEDULE)
    plan, _log = restart(world, override=None, wants="day")  # the boundary was reverted meanwhile
    assert plan is not None and plan.target == "day" and world.running() == ["day"]
    assert recovery.plan(plan.found, {"day", "night"}, "night", "day").target == "night"  # a hold wins


def test_recovery_gives_up_after_three_interrupted_recoveries_and_stops_everything(world: Any) -> None:
    died_in(world, "night", Phase.START, trigger=Trigger.RECOVERY, recovery_attempt=3)
    plan, log = restart(world)
    assert plan is not None and plan.give_up
    assert world.running() == []  # day stopped, nothing started
    assert ("start", world.unit("night")) not in world.units.calls
    (row,) = rows_by_trigger(world, Trigger.RECOVERY)[-1:]
    assert row.outcome == Outcome.FAILED.value and "recovery gave up" in (row.message or "")
    assert log.named("recovery_gave_up") and world.runs.load() is None
    assert world.switcher.snapshot() == (False, OFF)


def test_recovery_counts_recoveries_in_a_row() -> None:
    run = SwitchRun("t", "night", Trigger.RECOVERY, "gpushift", "", datetime.now(timezone.utc), 0.0)
    for attempt, give_up in [(0, False), (1, False), (2, False), (3, True)]:
        run.recovery_attempt = attempt
        p = recovery.plan(run, {"day", "night"}, None, None)
        assert (p.attempt, p.give_up) == (attempt + 1, give_up)


def test_recovery_without_an_unfinished_run_does_nothing(world: Any) -> None:
    plan, _log = restart(world)
    assert plan is None and world.units.calls == []


def test_switch_run_is_written_before_the_stop_before_the_start_and_after_ready(world: Any) -> None:
    res = world.switch("night")
    assert res.ok
    log = world.log
    saves = [i for i, e in enumerate(log.entries) if e.kind == "runs.save"]
    stop, start = log.first("units.stop"), log.first("units.start")
    ready = max(i for i, e in enumerate(log.entries) if e.kind == "probe.health")
    assert (
        any(i < stop for i in saves)
        and any(stop < i < start for i in saves)
        and any(i > ready for i in saves)
    )
    assert log.last("runs.clear") > log.last("ledger.finish")
    assert world.runs.load() is None
    phases = [s["phase"] for s in world.runs.saves]
    assert Phase.READY.value in phases and phases.index(Phase.STOP.value) < phases.index(Phase.START.value)


def test_switch_run_is_rewritten_only_when_what_recovery_reads_changed(world: Any) -> None:
    assert world.switch("night").ok
    saves = list(world.runs.saves)
    recovery_view = [{**s, "detail": None} for s in saves]
    assert all(a != b for a, b in zip(recovery_view, recovery_view[1:], strict=False)), [
        s["phase"] for s in saves
    ]
    phases = [s["phase"] for s in saves]
    for phase in (Phase.STOP, Phase.RELEASE, Phase.START, Phase.READY):
        assert phase.value in phases, phases
    assert world.switch("day").ok  # the next switch writes its own run from the start
    assert world.runs.saves[len(saves)]["target"] == "day"


def test_switch_run_round_trips_through_json() -> None:
    run = SwitchRun("t1", "night", Trigger.MANUAL, "alice", "why", datetime.now(timezone.utc), 1.5, uid=1000)
    run.phase, run.previous, run.touched, run.cancelled_by = Phase.START, ["day"], True, "carol"
    run.restart_instances = ["gpushift-night@1.service"]  # a hung instance restarted alone (issue 23)
    assert SwitchRun.from_dict(run.to_dict()) == run


# --------------------------------------------------------------------------- cancel in every phase


def cancel_at(world: Any, phase: Phase) -> list[str]:
    got: list[str] = []

    def listener(e: Any) -> None:
        if e.kind == "progress" and e.phase == phase and not got:
            got.append(world.switcher.cancel(CAROL))

    world.switcher.listeners.append(listener)
    return got


def test_cancel_during_the_stop_is_not_lost(world: Any) -> None:
    # The stop job and the gate are instant here: the cancel used to be checked only between polls.
    got = cancel_at(world, Phase.STOP)
    res = world.switch("night")
    assert got == [res.ticket]
    assert res.ok is False and res.cancelled_by == "carol"
    assert res.outcome == Outcome.ROLLED_BACK.value and world.running() == ["day"]
    assert ("start", world.unit("night")) not in world.units.calls
    assert world.record(res).extra["cancelled_by"] == "carol"


def test_cancel_during_the_preflight_ends_the_run_before_anything_is_touched(world: Any) -> None:
    got = cancel_at(world, Phase.PREFLIGHT)
    res = world.switch("night")
    assert got == [res.ticket] and res.outcome == Outcome.CANCELLED.value
    assert world.units.calls == [] and world.running() == ["day"]


def test_cancel_during_a_rollback_is_refused_with_a_message(make_world: Any) -> None:
    world = make_world()
    world.boot("day")
    world.probe.set_health(world.url("night"), ok_after=None, before=503)
    refused: list[str] = []

    def listener(e: Any) -> None:
        if e.kind == "progress" and e.phase == Phase.ROLLBACK and not refused:
            with pytest.raises(CancelRefused) as exc:
                world.switcher.cancel(CAROL)
            refused.append(str(exc.value))

    world.switcher.listeners.append(listener)
    res = world.switch("night")
    assert refused and "rolling back to day" in refused[0]
    assert res.outcome == Outcome.ROLLED_BACK.value and world.running() == ["day"]


def test_recovery_that_gives_up_stops_every_instance_of_a_backend_of_several(world: Any) -> None:
    from tests.support.instances import N0, N1, with_instances

    with_instances(world)
    world.units.set_stopped(world.unit("day"))
    world.units.set_running(N0)
    world.units.set_running(N1)
    died_in(world, "day", Phase.START, trigger=Trigger.RECOVERY, previous="night", recovery_attempt=3)
    plan, _log = restart(world)
    assert plan is not None and plan.give_up
    assert not world.units.is_running(N0) and not world.units.is_running(N1)
    assert {u for v, u in world.units.calls if v == "stop"} >= {N0, N1}

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

from gpushift_unit_fakes import MemoryOverrideStore  # loaded by tests/unit/conftest.py

from gpushift.errors import GpushiftError, SwitchInProgress
from gpushift.keeper import Attempts, Keeper, Snapshot, decide
from gpushift.keeper.decide import Ask, Ended, Relaunch, Switch
from gpushift.keeper.fallback import LEDGER_ROWS, fall_back, ledger_before, rows_before
from gpushift.keeper.watch import Incident
from gpushift.switch import Switcher
from gpushift.values import OFF, Caller, Outcome, SwitchRecord, Trigger

UTC = timezone.utc
CRASH = Incident(Outcome.CRASHED, "day", "gs-day.service exited by itself (killed by signal 9)")
REFUSED = "refused: port 8000 is already taken by pid 99 (python3, user nobody)"
ALICE = Caller(uid=1000, user="alice", pid=77)


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


# --------------------------------------------------------------------------- who served before whom


def row(trigger: str, was: str | None, to: str, outcome: str = "ok") -> SwitchRecord:
    return SwitchRecord(trigger, "gpushift", "r", was, to, utc(2, 11), outcome=outcome)


def test_rows_before_is_the_newest_ok_switch_of_gpushifts_from_another_backend() -> None:
    older = row("manual", "night", "day")
    newest_first = [
        row("watch", "day", OFF, outcome="crashed"),  # an incident
        row("external", "day", "day"),  # a relaunch behind gpushift's back
        row("external", "other", "day"),  # a person's systemctl: the keeper does not learn from it
        row("recovery", OFF, "day"),  # a relaunch by gpushift (nothing ran before it)
        row("schedule", "other", "day", outcome="refused"),
        older,
        row("schedule", "other", "night"),
    ]
    assert rows_before(newest_first) == ("day", "night")
    assert rows_before(newest_first[:5]) is None
    assert rows_before([]) is None


class Rows:
    def __init__(self, rows: list[SwitchRecord] | None = None, error: Exception | None = None) -> None:
        self.rows, self.error, self.limits = rows or [], error, []  # type: ignore[var-annotated]

    def list(self, limit: int = 20, **filters: Any) -> list[SwitchRecord]:
        self.limits.append(limit)
        if self.error is not None:
            raise self.error
        return self.rows[:limit]


class Log:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        pass

    def warning(self, event: str, **kw: Any) -> None:
        self.warnings.append((event, kw))


def test_ledger_before_reads_a_bounded_number_of_rows_and_survives_an_unreadable_ledger() -> None:
    ledger, log = Rows([row("manual", "night", "day")]), Log()
    assert ledger_before(ledger, log) == ("day", "night") and ledger.limits == [LEDGER_ROWS]
    broken = Rows(error=GpushiftError("ledger: database disk image is malformed"))
    assert ledger_before(broken, log) is None
    assert log.warnings == [
        ("fallback_ledger_unreadable", {"error": "ledger: database disk image is malformed"})
    ]


# --------------------------------------------------------------------------- the keeper


def make_keeper(world: Any, **kw: Any) -> Keeper:
    return Keeper(
        world.switcher, None, MemoryOverrideStore(), now=world.clock.now, monotonic=world.clock.monotonic,
        max_attempts=2, retry_after_s=30, **kw,
    )  # fmt: skip


def crash_for_good(world: Any, keeper: Keeper, ticks: int = 6) -> None:
    """The serving day exits by itself and its starts fail: reconcile ticks 30 s apart."""
    world.units.behave(world.unit("day"), crash_after_s=0, crash_result="signal", start_job_result="failed")
    for _ in range(ticks):
        keeper.tick()
        assert world.switcher.wait(20)
        world.clock.advance(30)


def fallbacks(world: Any) -> list[SwitchRecord]:
    return [r for r in (world.ledger.rows[i] for i in sorted(world.ledger.rows)) if r.trigger == "rollback"]


def test_keeper_started_after_a_restart_learns_from_the_ledger_who_served_before(make_world: Any) -> None:
    # night served, then day (a switch of the daemon before its restart); the restarted daemon has a
    # new switcher and keeper that saw no switch end, but the ledger says night served before day.
    world = make_world()
    world.boot("night")
    ticket, _ov = make_keeper(world).ask(Ask("day", "by hand", ALICE))
    assert ticket is not None and world.switcher.wait(20)
    world.switcher = Switcher(world.config, world.ports, listener=world._listen, version="0.0.0-test")
    keeper = make_keeper(world, ledger=world.ledger)
    keeper.tick()  # the restarted daemon's first look: day serves
    assert world.running() == ["day"]
    crash_for_good(world, keeper)
    assert world.running() == ["night"]
    (back,) = fallbacks(world)
    assert back.outcome == "ok" and back.reason.startswith("fallback: 2 failed relaunches of day"), back


def test_keeper_asks_again_for_a_fallback_the_switcher_refused_as_busy(make_world: Any) -> None:
    world = make_world()
    world.boot("night")
    keeper = make_keeper(world)
    ticket, _ov = keeper.ask(Ask("day", "by hand", ALICE))
    assert ticket is not None and world.switcher.wait(20)
    real, asked = world.switcher.request, []

    def request(
        target: str, reason: str, caller: Caller, trigger: Trigger = Trigger.MANUAL, *a: Any, **kw: Any
    ) -> str:
        asked.append((target, trigger))
        if trigger is Trigger.ROLLBACK and asked.count((target, trigger)) == 1:
            raise SwitchInProgress("a switch is already running")
        return real(target, reason, caller, trigger, *a, **kw)

    world.switcher.request = request
    crash_for_good(world, keeper)
    assert asked == [("day", Trigger.RECOVERY)] * 2 + [("night", Trigger.ROLLBACK)] * 2
    assert world.running() == ["night"]
    (back,) = fallbacks(world)
    assert back.outcome == "ok"
    assert (keeper.blocked or "").startswith("fell back to night after 2 failed relaunches"), keeper.blocked


def test_keeper_does_not_fall_back_after_a_refusal_once_a_person_acted(make_world: Any) -> None:
    world = make_world()
    world.boot("night")
    keeper = make_keeper(world)
    ticket, _ov = keeper.ask(Ask("day", "by hand", ALICE))
    assert ticket is not None and world.switcher.wait(20)
    real, asked = world.switcher.request, []

    def request(
        target: str, reason: str, caller: Caller, trigger: Trigger = Trigger.MANUAL, *a: Any, **kw: Any
    ) -> str:
        asked.append((target, trigger))
        if trigger is Trigger.ROLLBACK:
            raise SwitchInProgress("a switch is already running")
        return real(target, reason, caller, trigger, *a, **kw)

    world.switcher.request = request
    crash_for_good(world, keeper, ticks=4)
    assert asked[-1] == ("night", Trigger.ROLLBACK)
    assert (keeper.blocked or "") == "falling back to night waits for the switch that runs"
    ticket, _ov = keeper.ask(Ask(OFF, "leave it off", ALICE, hold=True))
    assert ticket is not None and world.switcher.wait(20)
    n = len(asked)
    for _ in range(3):
        keeper.tick()
        assert world.switcher.wait(20)
        world.clock.advance(30)
    assert asked[n:] == [] and world.running() == []

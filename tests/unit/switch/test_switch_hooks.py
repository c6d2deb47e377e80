"""The hooks of a switch against the stateful fakes: when each runs (on one timeline with the
ledger and the units), what it is told, what the row records, a required ``before_stop`` that
refuses, ``on_failure`` after a failure, and a cancel while a hook runs.

The World (tests/support/fakes.py) serves "day"; the tests switch to "night".  The hook runner is
the fake of the HookRunner port; the real one (transient units) is tested in
tests/integration/test_hooks_adapter.py.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from gpushift.config.schema import parse
from gpushift.switch.hooks import environment
from gpushift.values import Caller, HookEvent, Outcome, Phase

HOOKS = """
[hooks]
user = "gpuhook"
before_stop = {{ argv = ["/hooks/before", "--x", "$HOME"], required = {required}, timeout_s = 30 }}
after_ready = ["/hooks/ready"]
on_failure = ["/hooks/failed"]
"""

CAROL = Caller(uid=1001, user="carol")


@pytest.fixture
def hooked(world: Any, fakes: Any) -> Any:
    """The world with all three switch hooks configured and the fake runner plugged in."""
    return with_hooks(world, fakes, required=False)


def with_hooks(world: Any, fakes: Any, required: bool) -> Any:
    cfg = parse(world.toml + HOOKS.format(required=str(required).lower()), "/etc/gpushift/unit-test.toml")
    world.config = cfg
    world.switcher.reconfigure(cfg)
    world.hooks = fakes.FakeHookRunner(world.log, world.clock)
    world.ports.hooks = world.hooks
    world.boot("day")
    return world


def test_before_stop_runs_after_the_intent_row_and_after_ready_before_the_row_closes(hooked: Any) -> None:
    w = hooked
    res = w.switch("night", reason="evening")
    assert res.ok, res
    assert w.hooks.events() == ["before_stop", "after_ready"]
    log = w.log
    begin = log.first("ledger.begin")
    before = log.first("hook.run", "before_stop", "/hooks/before")
    stop = log.first("units.stop", w.unit("day"))
    start = log.first("units.start", w.unit("night"))
    ready = log.first("hook.run", "after_ready", "/hooks/ready")
    finish = log.last("ledger.finish")
    assert begin < before < stop < start < ready < finish
    assert Phase.HOOKS.value in w.phases(res.ticket)
    # The argv exactly as configured (no shell, no expansion), as the configured user.
    spec = w.hooks.specs[0]
    assert (spec.argv, spec.user, spec.timeout_s) == (("/hooks/before", "--x", "$HOME"), "gpuhook", 30.0)
    assert spec.name == f"gpushift-hook-before-stop-{res.ticket}.service"
    rec = w.record(res)
    assert [(h["event"], h["result"], h["exit_status"]) for h in rec.extra["hooks"]] == [
        ("before_stop", "success", 0),
        ("after_ready", "success", 0),
    ]
    assert rec.extra["hooks"][0]["user"] == "gpuhook" and rec.extra["hooks"][0]["unit"] == spec.name


def test_a_hook_gets_the_documented_environment(hooked: Any) -> None:
    w = hooked
    res = w.switch("night", reason="evening batch")
    env = w.hooks.specs[0].env
    rec = w.record(res)
    assert env["GPUSHIFT_EVENT"] == "before_stop"
    assert (env["GPUSHIFT_FROM"], env["GPUSHIFT_TO"]) == ("day", "night")
    assert (env["GPUSHIFT_FROM_UNIT"], env["GPUSHIFT_TO_UNIT"]) == (w.unit("day"), w.unit("night"))
    assert (env["GPUSHIFT_TRIGGER"], env["GPUSHIFT_REASON"]) == ("manual", "evening batch")
    assert (env["GPUSHIFT_TICKET"], env["GPUSHIFT_LEDGER_ID"]) == (res.ticket, str(rec.id))
    assert env["GPUSHIFT_OUTCOME"] == ""  # not decided yet
    assert datetime.fromisoformat(env["GPUSHIFT_AT"]).tzinfo is not None
    after = w.hooks.specs[1].env
    assert after["GPUSHIFT_EVENT"] == "after_ready" and after["GPUSHIFT_MESSAGE"] == "night is serving"


def test_a_failing_hook_that_is_not_required_is_recorded_and_the_switch_goes_on(hooked: Any) -> None:
    w = hooked
    w.hooks.exit["/hooks/before"] = 3
    w.hooks.exit["/hooks/ready"] = 1
    w.hooks.output["/hooks/ready"] = "cache warm failed\n"
    res = w.switch("night")
    assert res.ok and w.running() == ["night"]
    hooks = w.record(res).extra["hooks"]
    assert [(h["result"], h["exit_status"]) for h in hooks] == [("exit-code", 3), ("exit-code", 1)]
    assert hooks[1]["output"] == "cache warm failed\n"
    assert "on_failure" not in w.hooks.events()


def test_a_required_before_stop_that_fails_refuses_the_switch_and_stops_nothing(
    world: Any, fakes: Any
) -> None:
    w = with_hooks(world, fakes, required=True)
    w.hooks.exit["/hooks/before"] = 7
    w.hooks.output["/hooks/before"] = "checking\nbatch job 4411 still running\n"
    res = w.switch("night")
    assert not res.ok and res.outcome == Outcome.REFUSED.value
    assert w.running() == ["day"] and w.unit_calls() == []
    assert (
        "before_stop hook /hooks/before said no (exit status 7): batch job 4411 still running" in res.message
    )
    rec = w.record(res)
    assert (rec.outcome, rec.failed_phase) == ("refused", "hooks")
    # on_failure runs for a refused switch, and is told so.
    assert w.hooks.events() == ["before_stop", "on_failure"]
    env = w.hooks.specs[1].env
    assert (env["GPUSHIFT_OUTCOME"], env["GPUSHIFT_PHASE"]) == ("refused", "hooks")
    assert "said no" in env["GPUSHIFT_MESSAGE"]
    assert [h["event"] for h in rec.extra["hooks"]] == ["before_stop", "on_failure"]


def test_a_required_before_stop_that_times_out_refuses_too(world: Any, fakes: Any) -> None:
    w = with_hooks(world, fakes, required=True)
    w.hooks.hang.add("/hooks/before")
    res = w.switch("night")
    assert res.outcome == Outcome.REFUSED.value and "timed out" in res.message
    assert w.running() == ["day"]


def test_on_failure_runs_for_a_rolled_back_switch_with_its_outcome(hooked: Any) -> None:
    w = hooked
    w.units.behave(w.unit("night"), start_job_result="failed", start_failure_result="exit-code")
    res = w.switch("night")
    assert res.outcome == Outcome.ROLLED_BACK.value
    assert w.hooks.events() == ["before_stop", "on_failure"]
    env = w.hooks.specs[-1].env
    assert (env["GPUSHIFT_OUTCOME"], env["GPUSHIFT_PHASE"]) == ("rolled_back", "start")
    assert w.log.last("hook.run") < w.log.last("ledger.finish")
    assert w.record(res).extra["hooks"][-1]["event"] == "on_failure"


def test_a_cancel_during_before_stop_stops_the_hook_and_nothing_else_is_touched(hooked: Any) -> None:
    w = hooked
    w.hooks.hang.add("/hooks/before")
    asked: list[str] = []

    def cancel_in_hook(e: Any) -> None:
        if e.kind == "progress" and e.phase == Phase.HOOKS.value and not asked:
            asked.append(w.switcher.cancel(CAROL))

    w.switcher.listeners.append(cancel_in_hook)
    res = w.switch("night")
    assert res.outcome == Outcome.CANCELLED.value and "cancelled by carol" in res.message
    assert w.running() == ["day"] and w.unit_calls() == []
    assert w.record(res).extra["hooks"][0]["result"] == "cancelled"


def test_a_cancel_during_after_ready_follows_the_cancel_rules_rollback(hooked: Any) -> None:
    w = hooked
    w.hooks.hang.add("/hooks/ready")
    asked: list[str] = []

    def cancel_in_ready_hook(e: Any) -> None:
        if e.kind == "progress" and e.phase == Phase.HOOKS.value and "after_ready" in e.detail and not asked:
            asked.append(w.switcher.cancel(CAROL))

    w.switcher.listeners.append(cancel_in_ready_hook)
    res = w.switch("night")
    assert res.outcome == Outcome.ROLLED_BACK.value, res
    assert w.running() == ["day"]
    assert [h["result"] for h in w.record(res).extra["hooks"]][:2] == ["success", "cancelled"]


def test_the_heartbeat_goes_on_while_a_hook_runs(hooked: Any) -> None:
    w = hooked
    w.hooks.hang.add("/hooks/ready")
    res = w.switch("night")
    assert res.ok  # the after_ready hook timed out (recorded), the switch stays ok
    assert w.hooks.beats >= 30 / 0.5 - 1
    assert w.record(res).extra["hooks"][1]["result"] == "timeout"


def test_no_hooks_configured_means_no_runs_and_no_hooks_phase(world: Any, fakes: Any) -> None:
    world.ports.hooks = runner = fakes.FakeHookRunner(world.log, world.clock)
    world.boot("day")
    res = world.switch("night")
    assert res.ok and runner.specs == []
    assert Phase.HOOKS.value not in world.phases(res.ticket)
    assert "hooks" not in world.record(res).extra


def test_the_environment_of_a_before_boundary_hook_and_its_limits() -> None:
    cfg = parse(
        '[backends.day]\nunit = "d.service"\nhealth_url = "http://127.0.0.1:1/h"\n'
        '[backends.night]\nunit = "n.service"\nhealth_url = "http://127.0.0.1:2/h"\n'
    )
    at = datetime(2026, 3, 2, 20, 0, tzinfo=timezone.utc)
    env = environment(
        HookEvent.BEFORE_BOUNDARY, config=cfg, from_backend=None, to_backend="night", trigger="schedule",
        at=at, reason="nul\0here", message="x" * 5000,
    )  # fmt: skip
    assert env["GPUSHIFT_FROM"] == "off" and env["GPUSHIFT_FROM_UNIT"] == ""
    assert env["GPUSHIFT_TO_UNIT"] == "n.service" and env["GPUSHIFT_AT"] == at.isoformat()
    assert env["GPUSHIFT_REASON"] == "nulhere" and len(env["GPUSHIFT_MESSAGE"]) == 4000
    assert set(env) == {
        "GPUSHIFT_EVENT", "GPUSHIFT_TICKET", "GPUSHIFT_LEDGER_ID", "GPUSHIFT_FROM", "GPUSHIFT_TO",
        "GPUSHIFT_FROM_UNIT", "GPUSHIFT_TO_UNIT", "GPUSHIFT_TRIGGER", "GPUSHIFT_REASON",
        "GPUSHIFT_OUTCOME", "GPUSHIFT_PHASE", "GPUSHIFT_MESSAGE", "GPUSHIFT_AT",
    }  # fmt: skip


def test_ledger_show_prints_each_hook_run_with_its_outputs_last_lines(world: Any, fakes: Any) -> None:
    from gpushift.ledger.reports import format_record

    w = with_hooks(world, fakes, required=True)
    w.hooks.exit["/hooks/before"] = 7
    w.hooks.output["/hooks/before"] = "checking\nbatch job 4411 still running\n"
    text = format_record(w.record(w.switch("night")))
    assert "Hooks" in text
    assert "before_stop          /hooks/before --x '$HOME' as gpuhook: exit status 7 in 0.25 s" in text
    assert "    | batch job 4411 still running" in text
    assert "on_failure           /hooks/failed as gpuhook: exit status 0" in text

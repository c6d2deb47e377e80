"""A failed start's, a rollback's and a crash's row carry the why: the unit's exit and last log lines."""

from __future__ import annotations

from typing import Any

from gpushift.values import Outcome, Phase


def test_failed_start_row_keeps_the_units_last_log_lines_and_exit(world: Any) -> None:
    unit = world.unit("night")
    world.host.unit_logs[unit] = [f"08:00:0{i} line {i}" for i in range(60)] + ["08:00:09 model file missing"]
    world.units.behave(unit, crash_after_s=0)
    res = world.switch("night")
    assert res.ok is False and res.failed_phase in (Phase.START.value, Phase.READY.value)
    ev = world.record(res).extra["evidence"]
    assert ev["unit"] == unit and ev["result"] and "Result=" in ev["exit"]
    assert ev["log"]["lines"][-1].endswith("model file missing")
    assert len(ev["log"]["lines"]) == world.config.daemon.evidence_lines  # the newest 50


def test_successful_switch_row_has_no_evidence(world: Any) -> None:
    assert "evidence" not in world.record(world.switch("night")).extra


def test_crash_row_keeps_the_evidence_too(world: Any) -> None:
    unit = world.unit("day")
    world.host.unit_logs[unit] = ["09:00:00 engine core died", "09:00:01 exiting"]
    world.switcher.record_incident(Outcome.CRASHED, "day", "gone", "exit status 0, Result=success")
    rec = world.ledger.last()
    assert rec.outcome == Outcome.CRASHED.value
    assert rec.extra["evidence"]["log"]["lines"] == ["09:00:00 engine core died", "09:00:01 exiting"]

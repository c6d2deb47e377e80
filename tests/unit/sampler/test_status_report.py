"""`gpushift status`: one composition for the daemon (its sampler's latest sample, the ledger view in
memory) and for the CLI while the daemon is down (a one-shot read) — the same keys either way, each
figure with its age; and the ledger view the daemon keeps in memory follows every write."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from gpushift.cli import render_status
from gpushift.daemon.wiring import Components, compose_status, status_report
from gpushift.ledger.view import LedgerView, RememberingLedger, read_view
from gpushift.sampler.sampler import Sampler
from gpushift.values import OFF, Outcome, SwitchRecord

#: The keys scripts read from `gpushift status --json` (the daemon adds mode/override/schedule).
STATUS_KEYS = {
    "daemon",
    "active",
    "running",
    "since",
    "backends",
    "gpus",
    "simulated",
    "last_switch",
    "ledger",
    "version",
    "config",
    "now",
}
BACKEND_KEYS = {
    "unit",
    "kind",
    "gpus",
    "load_state",
    "active_state",
    "sub_state",
    "result",
    "main_pid",
    "health",
}
GPU_KEYS = {"index", "name", "total_mib", "used_mib", "error", "holders", "state", "simulated"}


def record(to: str, outcome: Outcome, minutes_ago: int, frm: str | None = None) -> SwitchRecord:
    t = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc) - timedelta(minutes=minutes_ago)
    return SwitchRecord(
        trigger="manual",
        requested_by="alice",
        reason="test",
        from_backend=frm,
        to_backend=to,
        started_at=t,
        finished_at=t,
        outcome=outcome.value,
    )


def write(ledger: Any, rec: SwitchRecord) -> int:
    row_id = int(ledger.begin(rec))
    rec.id = row_id
    ledger.finish(rec)
    return row_id


def test_status_report_one_shot_has_every_key_scripts_read_and_each_figures_age(world: Any) -> None:
    w = world
    write(w.ledger, record("day", Outcome.OK, 30, frm="night"))
    st = status_report(Components(w.config, w.ports), {"running": False, "state": "down"})
    assert set(st) >= STATUS_KEYS
    assert st["active"] == "day" and st["active_reason"] is None
    assert st["since"] == "2026-03-02T11:30:00+00:00"
    assert st["last_switch"]["to"] == "day" and "vram" not in st["last_switch"]
    assert st["ledger"] == {"state": "ok", "pending": 0, "error": None}
    day = st["backends"]["day"]
    assert set(day) >= BACKEND_KEYS and day["age_s"] == 0.0 and day["health"]["age_s"] == 0.0
    assert all(set(g) >= GPU_KEYS and g["age_s"] == 0.0 for g in st["gpus"])


def test_status_daemon_and_cli_compose_the_same_fields(world: Any) -> None:
    w = world
    c = Components(w.config, w.ports)
    one_shot = status_report(c, {"running": False})
    sampler = Sampler(w.config, w.ports)
    sampler.sample_once()
    from_memory = compose_status(
        w.config, sampler.snapshot(), w.clock.monotonic(), {"running": True}, read_view(w.ledger)
    )
    assert set(one_shot) == set(from_memory)
    assert set(one_shot["backends"]["day"]) == set(from_memory["backends"]["day"])
    assert [set(g) for g in one_shot["gpus"]] == [set(g) for g in from_memory["gpus"]]


def test_status_composition_reads_no_port(world: Any) -> None:
    # What the daemon's GetStatus runs on the loop thread: a sample and a ledger view, nothing else.
    w = world
    sampler = Sampler(w.config, w.ports)
    sampler.sample_once()
    view = read_view(w.ledger)

    def no_io(*a: Any, **k: Any) -> Any:
        raise AssertionError("status did I/O")

    for obj, name in ((w.units, "state"), (w.probe, "health"), (w.gpu, "read"), (w.ledger, "list")):
        setattr(obj, name, no_io)
    w.clock.advance(1.0)
    st = compose_status(w.config, sampler.snapshot(), w.clock.monotonic(), {"running": True}, view)
    assert st["active"] == "day" and st["backends"]["day"]["health"]["age_s"] == 1.0


def test_status_active_is_off_when_nothing_runs_and_null_with_a_reason_when_unhealthy(world: Any) -> None:
    w = world
    w.units.set_stopped(w.unit("day"))
    c = Components(w.config, w.ports)
    assert status_report(c, {})["active"] == OFF
    w.units.set_running(w.unit("day"))
    w.probe.set_health(w.url("day"), ok_after=None, before=503)
    st = status_report(c, {})
    assert st["active"] is None and st["since"] is None
    assert st["active_reason"].startswith("day: health failing (HTTP 503")
    assert st["running"] == ["day"]


def test_render_status_shows_health_state_and_ages(world: Any) -> None:
    w = world
    c = Components(w.config, w.ports)
    text = render_status(status_report(c, {"running": False}))
    assert "active:   day" in text
    assert "health 200  (0.0s ago)" in text
    assert "[held]  (0.0s ago)" in text
    w.probe.set_health(w.url("day"), ok_after=None, before=503)
    text = render_status(status_report(c, {"running": False}))
    assert "active:   unknown: day: health failing (HTTP 503" in text
    assert "health FAILING: 503 Loading model  (0.0s ago)" in text


# --------------------------------------------------------------------------- the ledger view


def test_ledger_view_since_is_the_last_switch_to_the_backend_or_rollback_to_it() -> None:
    rows = (
        record("night", Outcome.ROLLED_BACK, 5, frm="day"),
        record("night", Outcome.FAILED, 10, frm="day"),
        record("day", Outcome.OK, 60, frm="night"),
    )
    view = LedgerView(rows, {"state": "ok"})
    assert view.last() is rows[0]
    assert view.since("day") == rows[0].finished_at  # the rollback brought day back
    assert view.since("night") is None
    assert LedgerView().last() is None


def test_remembering_ledger_view_follows_every_write(world: Any) -> None:
    w = world
    led = RememberingLedger(w.ledger)
    assert led.view().rows == () and led.view().health["state"] == "ok"
    rec = record("night", Outcome.PENDING, 0, frm="day")
    rec.finished_at = None
    rec.id = led.begin(rec)
    assert led.view().last() is not None and led.view().last().outcome == Outcome.PENDING.value
    rec.outcome, rec.finished_at = Outcome.OK.value, datetime(2026, 3, 2, 12, 1, tzinfo=timezone.utc)
    led.finish(rec)
    assert led.view().last().outcome == Outcome.OK.value
    assert led.view().since("night") == rec.finished_at
    second = record("day", Outcome.PENDING, 0, frm="night")
    second.finished_at = None
    led.begin(second)
    assert led.mark_interrupted(datetime(2026, 3, 2, 12, 2, tzinfo=timezone.utc)) == [2]
    assert led.view().last().outcome == Outcome.INTERRUPTED.value
    assert led.get(1) is not None and led.list(limit=5)[0].id == 2  # reads go to the ledger


def test_remembering_ledger_passes_errors_through_and_still_refreshes(world: Any) -> None:
    w = world
    led = RememberingLedger(w.ledger)
    rec = record("day", Outcome.OK, 0)
    with pytest.raises(AssertionError, match="never begun"):
        led.finish(rec)  # the fake refuses a finish without a begin: the caller sees it
    w.ledger.health = lambda: {"state": "degraded", "pending": 1, "error": "disk full"}
    led.health()  # the daemon's periodic flush check reads the health: the view follows
    assert led.view().health["state"] == "degraded"
    w.ledger.flush_pending = lambda: 1
    w.ledger.health = lambda: {"state": "ok", "pending": 0, "error": None}
    assert led.flush_pending() == 1
    assert led.view().health["state"] == "ok"
    assert led.clock is w.clock  # anything else is the inner ledger's


def test_read_view_of_an_unreadable_ledger_says_so(world: Any) -> None:
    w = world

    def broken(*a: Any, **k: Any) -> Any:
        raise OSError("database disk image is malformed")

    w.ledger.list = broken
    view = read_view(w.ledger)
    assert view.rows == () and view.health["state"] == "unreadable"
    assert "malformed" in view.health["error"]

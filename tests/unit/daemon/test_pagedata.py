"""The daemon's side of the status page (``gpushift/daemon/pagedata.py``): the summary from the
daemon's memory, with the week of its schedule and the keeper's override laid over it, the layout
computed again only when the schedule, the override or the day changes."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

from gpushift.daemon.pagedata import PageData
from gpushift.keeper import Override
from gpushift.ledger.view import LedgerView
from gpushift.schedule import parse_schedule
from gpushift.values import Mode, SwitchRecord

UTC = timezone.utc
SCHEDULE = "TZ=Europe/Berlin\n0 8 * * * day\n0 20 * * * night\n"


def fake_daemon(override: Override | None = None) -> Any:
    row = SwitchRecord(
        trigger="schedule",
        requested_by="scheduler",
        reason="schedule line 2",
        from_backend="night",
        to_backend="day",
        started_at=datetime(2026, 3, 2, 7, tzinfo=UTC),
        finished_at=datetime(2026, 3, 2, 7, 1, tzinfo=UTC),
        outcome="ok",
        id=3,
        argv_configured=["vllm", "--api-key", "sk-secret"],
    )
    d = SimpleNamespace(
        schedule=parse_schedule(SCHEDULE, "schedule", backends={"day", "night"}),
        keeper=SimpleNamespace(override=override),
        config=SimpleNamespace(backends={"day": None, "night": None}),
        components=SimpleNamespace(ledger_view=lambda: LedgerView((row,), {"state": "ok"})),
    )
    d.status = lambda: {"active": "day", "since": "2026-03-02T07:01:00+00:00", "backends": {}, "schedule": {}}
    return d


def test_the_summary_has_the_week_the_rows_and_nothing_of_the_rows_argv() -> None:
    pages = PageData(background=False)
    now = datetime(2026, 3, 2, 9, tzinfo=UTC)
    s = pages.summary(fake_daemon(), now)
    assert s["serving"] == {"backend": "day", "since": "2026-03-02T07:01:00Z"}
    assert [r["id"] for r in s["recent"]] == [3]
    assert s["week"]["zone"] == "Europe/Berlin" and s["week"]["days"][0]["date"] == "2026-03-02"
    assert s["next"][0] == {"backend": "night", "at": "2026-03-02T19:00:00Z", "source": "schedule"}
    assert "sk-secret" not in json.dumps(s) and "scheduler" not in json.dumps(s)


def test_the_week_is_laid_out_again_only_when_the_override_or_the_day_changes() -> None:
    pages = PageData(background=False)
    d = fake_daemon()
    t = datetime(2026, 3, 2, 9, tzinfo=UTC)
    first = pages.week(d, t)
    assert pages.week(d, t.replace(hour=10)) is first  # same schedule, override, day
    ov = Override(Mode.HOLD, "night", None, "alice", t, "eval")
    d.keeper.override = ov
    held = pages.week(d, t.replace(hour=10))
    assert held is not first and [s.source for s in held.stretches][-1] == "hold"
    assert pages.week(d, t.replace(hour=11)) is held
    assert pages.week(d, datetime(2026, 3, 3, 0, tzinfo=UTC)).days[0].date.isoformat() == "2026-03-03"
    d.schedule = None
    assert pages.week(d, t) is None


def test_an_override_that_ended_is_laid_out_again_without_it() -> None:
    pages = PageData(background=False)
    t = datetime(2026, 3, 2, 9, tzinfo=UTC)
    ov = Override(Mode.OVERRIDE, "night", datetime(2026, 3, 2, 10, tzinfo=UTC), "alice", t, "eval")
    d = fake_daemon(ov)
    assert "override" in [s.source for s in pages.week(d, t).stretches]  # type: ignore[union-attr]
    after = pages.week(d, datetime(2026, 3, 2, 10, 30, tzinfo=UTC))
    assert after is not None and "override" not in [s.source for s in after.stretches]


def test_a_new_layout_is_made_on_a_thread_while_the_summary_keeps_the_one_before() -> None:
    pages = PageData()
    d = fake_daemon()
    t = datetime(2026, 3, 2, 9, tzinfo=UTC)
    first = pages.week(d, t)  # the first one: made at once
    assert first is not None
    d.keeper.override = Override(Mode.HOLD, "night", None, "alice", t, "eval")
    assert pages.week(d, t) is first  # the one before, while the new one is made
    thread = pages._making
    assert thread is not None
    thread.join(20)
    held = pages.week(d, t)
    assert held is not first and held is not None and held.stretches[-1].source == "hold"

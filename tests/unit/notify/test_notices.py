"""What people are told: the webhook's document per finished switch and its notice before a
scheduled switch, and the ``before_boundary`` hook as a look-ahead consumer (notify/notices.py)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any

from gpushift.config.schema import parse
from gpushift.keeper import Coming
from gpushift.keeper.lookahead import LookAhead
from gpushift.notify.notices import HOOK, NOTICE, Notices, notice_document, switch_document
from gpushift.switch import SwitchResult
from gpushift.values import HookOutcome, HookSpec, Outcome, Phase, SwitchRecord

UTC = timezone.utc
NOW = datetime(2026, 3, 2, 19, 55, tzinfo=UTC)
COMING = Coming(datetime(2026, 3, 2, 20, 0, tzinfo=UTC), "night", "day", "schedule line 3 (0 20 * * *) fires")
BASE = """
[backends.day]
unit = "gpushift-day.service"
health_url = "http://127.0.0.1:18000/health"
[backends.night]
unit = "gpushift-night.service"
health_url = "http://127.0.0.1:18080/health"
"""


class Sender:
    def __init__(self) -> None:
        self.docs: list[dict[str, Any]] = []

    def enqueue(self, doc: dict[str, Any]) -> None:
        self.docs.append(doc)

    def status(self) -> dict[str, Any]:
        return {"queued": len(self.docs)}


class Runner:
    def __init__(self) -> None:
        self.specs: list[HookSpec] = []

    def run(self, spec: HookSpec, cancelled: Any, beat: Any) -> HookOutcome:
        self.specs.append(spec)
        return HookOutcome(spec.name, "success", 0)


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.lines.append((event, kw))

    error = warning = debug = info


def notices(extra: str = "", runner: Runner | None = None) -> tuple[Notices, Sender, Log]:
    cfg = parse(extra + BASE)
    sender, log = Sender(), Log()
    n = Notices(lambda: cfg, sender, runner, None, lambda: NOW, log, host="gpu1")  # type: ignore[arg-type]
    return n, sender, log


def test_a_finished_switch_is_one_document_with_a_text_line_and_its_fields() -> None:
    res = SwitchResult("t1", False, Outcome.ROLLED_BACK, "night", "day", "night failed its warm-up; rolled back",
                       failed_phase=Phase.WARMUP, ledger_id=12, durations_s={"stop": 1.5, "start": 2.0})  # fmt: skip
    row = SwitchRecord("schedule", "gpushift", "schedule line 3", "day", "night", NOW, finished_at=NOW)
    doc = switch_document(res, "gpu1", row)
    assert doc["text"] == "gpushift on gpu1: day → night: rolled_back — night failed its warm-up; rolled back"
    assert (doc["event"], doc["from"], doc["to"], doc["outcome"], doc["ok"]) == (
        "switch_finished", "day", "night", "rolled_back", False,
    )  # fmt: skip
    assert (doc["ledger_id"], doc["failed_phase"], doc["seconds"], doc["trigger"]) == (
        12,
        "warmup",
        3.5,
        "schedule",
    )


def test_documents_go_out_only_with_a_webhook_and_not_for_a_switch_that_found_its_target_serving() -> None:
    ok = SwitchResult("t2", True, Outcome.OK, "night", "day", "night is serving")
    n, sender, _ = notices()
    n.finished(ok)
    assert sender.docs == []  # no webhook_url
    n, sender, _ = notices('[notify]\nwebhook_url = "http://127.0.0.1:9/x"\n')
    n.finished(SwitchResult("t3", True, Outcome.OK, "night", None, "night is already serving", already=True))
    n.finished(ok)
    assert [d["ticket"] for d in sender.docs] == ["t2"]


def test_the_notice_before_a_scheduled_switch_is_a_look_ahead_consumer() -> None:
    n, sender, _ = notices('[notify]\nwebhook_url = "http://127.0.0.1:9/x"\nlead_s = 300\n')
    consumers = {c.name: c for c in n.consumers()}
    assert consumers[NOTICE].lead_s(COMING) == 300.0
    assert consumers[HOOK].lead_s(COMING) is None  # no before_boundary hook configured
    consumers[NOTICE].act(COMING)
    (doc,) = sender.docs
    assert doc["text"] == "gpushift on gpu1: in 5 min (20:00 UTC) day → night (scheduled)"
    assert (doc["event"], doc["at"], doc["in_s"]) == ("switch_coming", COMING.at.isoformat(), 300)
    off, _, _ = notices('[notify]\nwebhook_url = "http://127.0.0.1:9/x"\nlead_s = 0\n')
    assert {c.name: c for c in off.consumers()}[NOTICE].lead_s(COMING) is None
    assert notice_document(COMING, "h", COMING.at - timedelta(seconds=75))["in_s"] == 75


def test_the_before_boundary_hook_runs_once_its_lead_before_the_switch_with_its_environment() -> None:
    runner = Runner()
    n, _, log = notices('[hooks]\nbefore_boundary = { argv = ["/hooks/warn", "x"], lead_s = 600 }\n', runner)
    la = LookAhead(lambda: COMING, lambda: NOW)
    for c in n.consumers():
        la.add(c)

    class Timer:
        jobs: dict[str, Any] = {}

        def set(self, job_id: str, when: datetime, fn: Any) -> None:
            self.jobs[job_id] = (when, fn)

        def cancel(self, job_id: str) -> None:
            self.jobs.pop(job_id, None)

    timer = Timer()
    la.attach(timer)
    when, fire = timer.jobs[LookAhead.job_id(HOOK)]
    assert when == NOW  # 10 minutes before 20:00 has passed at 19:55: at once
    assert LookAhead.job_id(NOTICE) not in timer.jobs  # no webhook
    fire()
    fire()  # once per switch
    deadline = time.monotonic() + 5
    while not log.lines and time.monotonic() < deadline:
        time.sleep(0.01)
    (spec,) = runner.specs
    assert spec.argv == ("/hooks/warn", "x") and spec.user == "nobody"
    env = spec.env
    assert (env["GPUSHIFT_EVENT"], env["GPUSHIFT_FROM"], env["GPUSHIFT_TO"]) == (
        "before_boundary",
        "day",
        "night",
    )
    assert (env["GPUSHIFT_TRIGGER"], env["GPUSHIFT_AT"]) == ("schedule", COMING.at.isoformat())
    assert env["GPUSHIFT_TO_UNIT"] == "gpushift-night.service" and env["GPUSHIFT_TICKET"] == ""
    assert log.lines[0][0] == "hook_finished" and log.lines[0][1]["hook"] == HOOK


def test_plain_status_shows_the_webhook_queue_and_what_the_look_ahead_is_armed_for() -> None:
    from gpushift.cli import render_status

    notices_json = {
        "webhook": {
            "url": "http://chat.lan:8065/***",
            "queued": 2,
            "delivered": 5,
            "dropped": 1,
            "last_error": "HTTP 503",
            "last_delivered_at": None,
        },  # fmt: skip
        "lookahead": {
            HOOK: {"armed": {**COMING.as_dict(), "fires_at": "2026-03-02T19:55:00+00:00"}, "acted": None},
            NOTICE: {"armed": None, "acted": None},
        },
    }
    text = render_status({"daemon": {"running": True}, "notices": notices_json})
    assert (
        "webhook:  http://chat.lan:8065/***: 2 queued, 5 delivered, 1 dropped, last error: HTTP 503" in text
    )
    fires = datetime(2026, 3, 2, 19, 55, tzinfo=timezone.utc).astimezone().strftime("%Y-%m-%d %H:%M")
    assert (
        f"ahead:    {HOOK} at {fires}, before the switch to {COMING.target}" in text
    )  # local, as the ledger
    assert f"ahead:    {NOTICE}" not in text  # not armed: nothing to say
    assert "webhook:" not in render_status({"daemon": {"running": True}, "notices": {"webhook": None}})

"""What the front door answers itself (gpushift/frontdoor/answers.py): OpenAI-format errors,
Retry-After from NextServed rounded up, the time named in the schedule's zone, x-should-retry over
120 s, the hold message without Retry-After, and /v1/models with its extension."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timezone

import pytest

from gpushift.frontdoor import answers, routing
from gpushift.frontdoor.routing import Decision, names_of
from gpushift.frontdoor.view import DaemonView

DAY, NIGHT = "qwen2.5-7b-instruct", "llama-3.2-1b"
NAMES = names_of({"vllm": (DAY,), "llama": (NIGHT,)}, {"llama": ("default",)}, {})


def utc(*args: int) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


NOW = utc(2026, 12, 2, 21, 0, 0)  # 22:00 CET, a Wednesday
AT_8_CET = int(utc(2026, 12, 3, 7, 0, 0))  # tomorrow 08:00 CET
NIGHT_VIEW = DaemonView(
    connected=True,
    active="llama",
    mode="schedule",
    zone="Europe/Berlin",
    next_served={DAY: AT_8_CET, NIGHT: 0},
)


def answer_for(
    reason: str, model: str | None, view: DaemonView = NIGHT_VIEW, now: float = NOW, **kw: str
) -> answers.Answer:
    d = Decision(routing.ANSWER, kw.get("serving", view.serving), reason=reason, target=kw.get("target", ""))
    return answers.for_decision(d, NAMES, view, model, now)


def test_the_issues_example_message_and_retry_after() -> None:
    a = answer_for(routing.NOT_SERVED, DAY, now=AT_8_CET - 10.5)  # 10.5 s before 08:00 CET
    assert a.status == 503
    assert a.message == f"{DAY} is served from 08:00 CET; now serving: llama"
    assert a.retry_after == 11  # rounded up
    assert a.should_retry is None  # under 120 s: the client may retry by itself
    body = json.loads(a.body_bytes())
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "model_not_served"
    assert ("Retry-After", "11") in a.headers() and all(k != "x-should-retry" for k, _ in a.headers())


@pytest.mark.parametrize(
    ("wait_s", "retry_after", "no_retry"),
    [
        (0.2, 1, False),
        (1.0, 1, False),
        (119.5, 120, False),
        (120.0, 120, False),
        (120.01, 121, True),
        (9 * 3600, 9 * 3600, True),
    ],
)
def test_retry_after_is_rounded_up_and_long_waits_say_do_not_retry(
    wait_s: float, retry_after: int, no_retry: bool
) -> None:
    a = answer_for(routing.NOT_SERVED, DAY, now=AT_8_CET - wait_s)
    assert a.retry_after == retry_after
    assert (("x-should-retry", "false") in a.headers()) is no_retry


@pytest.mark.parametrize(
    ("now", "text"),
    [
        (utc(2026, 12, 3, 6, 0), "08:00 CET"),  # the same day
        (utc(2026, 12, 2, 21, 0), "Thu 08:00 CET"),  # tomorrow
        (utc(2026, 11, 20, 12, 0), "2026-12-03 08:00 CET"),  # weeks ahead
    ],
)
def test_the_time_is_named_in_the_schedules_zone(now: float, text: str) -> None:
    assert answers.when(AT_8_CET, now, "Europe/Berlin") == text


def test_zones_summer_time_utc_and_unknown_zone_names() -> None:
    july = utc(2026, 7, 1, 6, 0)
    assert answers.when(july, july - 60, "Europe/Berlin") == "08:00 CEST"
    assert answers.when(july, july - 60, "") == "06:00 UTC"
    assert answers.when(july, july - 60, "No/Such_Zone") == "06:00 UTC"
    assert answers.when(july, july - 60, "../etc/passwd") == "06:00 UTC"
    assert answers.when(july + 30, july, "Asia/Shanghai") == "14:00:30 CST"


def test_during_a_hold_no_retry_after_and_the_message_says_a_person_resumes() -> None:
    held = replace(NIGHT_VIEW, mode="hold", next_served={})
    a = answer_for(routing.NOT_SERVED, DAY, held)
    assert a.retry_after is None and ("x-should-retry", "false") in a.headers()
    assert "held" in a.message and "until a person resumes the schedule" in a.message
    assert all(k != "Retry-After" for k, _ in a.headers())


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("manual", "gpushift switch"),
        ("schedule", "not scheduled to be served again"),
        ("override", "not scheduled"),
    ],
)
def test_no_time_known_outside_a_hold(mode: str, says: str) -> None:
    a = answer_for(routing.NOT_SERVED, DAY, replace(NIGHT_VIEW, mode=mode, next_served={}))
    assert says in a.message and a.retry_after is None and a.should_retry is False


def test_off_says_when_and_no_model_names_the_next_one() -> None:
    off = replace(NIGHT_VIEW, active="off", next_served={DAY: AT_8_CET, NIGHT: AT_8_CET + 3600})
    a = answer_for(routing.HOST_OFF, DAY, off)
    assert a.status == 503 and a.code == "host_off"
    assert a.message.startswith("the GPU host is off; ") and "08:00 CET" in a.message
    b = answer_for(routing.HOST_OFF, None, off)
    assert "the next model is served from Thu 08:00 CET" in b.message
    assert b.retry_after == AT_8_CET - int(NOW)


def test_an_alias_comes_back_with_its_backends_model() -> None:
    v = replace(NIGHT_VIEW, active="vllm", next_served={NIGHT: AT_8_CET})
    assert answers.next_at(NAMES, v, "default") == AT_8_CET
    assert answers.next_at(NAMES, v, "nope") is None


def test_served_now_per_next_served_but_not_here_is_a_short_wait() -> None:
    a = answer_for(routing.NOT_SERVED, NIGHT, replace(NIGHT_VIEW, active="vllm"), serving="vllm")
    assert a.retry_after == 1 and "being brought up" in a.message


def test_during_a_switch_the_answer_names_the_target() -> None:
    a = answer_for(routing.NOT_SERVED, DAY, serving="vllm", target="llama")
    assert "now switching to llama, which does not serve it" in a.message


def test_unknown_model_is_404_listing_the_names() -> None:
    a = answer_for(routing.UNKNOWN_MODEL, "gpt-4")
    assert (a.status, a.code, a.param, a.type) == (404, "model_not_found", "model", "invalid_request_error")
    assert "'gpt-4' does not exist here" in a.message and f"models are: default, {NIGHT}, {DAY}" in a.message
    weird = answer_for(routing.UNKNOWN_MODEL, "x\n\x1b[31m" + "y" * 500)
    assert "\n" not in weird.message and "\x1b" not in weird.message and len(weird.message) < 300


def test_daemon_lost_and_nothing_serving() -> None:
    lost = answer_for(routing.DAEMON_LOST, DAY, DaemonView())
    assert lost.message == "the gpushift daemon is not answering and no backend is known to be serving"
    assert lost.retry_after == answers.SHORT_RETRY_S
    none = answer_for(routing.NOTHING_SERVING, DAY, replace(NIGHT_VIEW, active="", next_served={}))
    assert none.retry_after == answers.SHORT_RETRY_S and "no backend is serving now" in none.message


def test_released_elsewhere_says_why() -> None:
    d = Decision(routing.ANSWER, "vllm", reason=routing.NOT_SERVED)
    a = answers.released_elsewhere(d, NAMES, replace(NIGHT_VIEW, active="vllm"), NIGHT, NOW, "llama")
    assert a.message.startswith("the switch to llama did not complete: ") and "now serving: vllm" in a.message


def test_hold_timeout_too_many_and_request_errors() -> None:
    t = answers.hold_timeout(300.2, "llama", 12.1)
    assert (t.status, t.retry_after, t.code) == (503, 13, "hold_timeout") and "held 300 s" in t.message
    assert answers.hold_timeout(5, "", -3).retry_after == 1
    m = answers.too_many_held(1000, "llama", 400)
    assert m.retry_after == 400 and m.should_retry is False and "1000 requests are held" in m.message
    assert answers.too_large(1024).status == 413
    assert answers.timed_out("body", 60).status == 408
    n = answers.not_a_string(["a"])
    assert (n.status, n.param, n.code) == (400, "model", "invalid_model") and "got list ['a']" in n.message
    assert answers.upstream_failed("vllm", "connection refused").status == 502
    assert "/completion" in answers.no_route("/slots", ["/completion"]).message


def test_v1_models_lists_what_serves_and_every_model_in_the_extension() -> None:
    doc = answers.models_list(NAMES, NIGHT_VIEW, "llama", {"vllm": "vllm", "llama": "llama-server"})
    assert [m["id"] for m in doc["data"]] == [NIGHT, "default"]
    assert doc["data"][0]["gpushift"] == {
        "backend": "llama",
        "kind": "llama-server",
        "served": True,
        "next_served": 0,
    }
    every = {m["id"]: m["gpushift"] for m in doc["gpushift"]["models"]}
    assert every[DAY] == {"backend": "vllm", "kind": "vllm", "served": False, "next_served": AT_8_CET}
    assert doc["gpushift"]["serving"] == "llama"
    assert answers.models_list(NAMES, NIGHT_VIEW, "", {})["data"] == []

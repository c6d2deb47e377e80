"""The status page's HTML and SVG (``gpushift/statuspage/page.py``, ``timeline.py``) from a summary:
one SVG group per stretch naming its backend, the clock's changes, now; who serves, the switch in
flight, the last switches with their phase timings; every value escaped; ``status.json``; and the
front door's live values laid over the summary (``summary.with_live``)."""

from __future__ import annotations

import json
from datetime import date, datetime, timezone
from html.parser import HTMLParser
from typing import Any

import pytest

from gpushift.schedule import parse_schedule
from gpushift.schedule.week import Overlay, lay_out
from gpushift.statuspage import timeline
from gpushift.statuspage.page import render, status_json
from gpushift.statuspage.summary import build, with_live

UTC = timezone.utc
NOW = datetime(2026, 3, 28, 12, 0, tzinfo=UTC)  # Sat 13:00 CET; the clock goes forward tomorrow
SCHEDULE = """TZ=Europe/Berlin
0  8  *  *  1-5      vllm
0  20 *  *  1-5      llama
0  0  *  *  sat,sun  llama
30 2  *  *  sun      vllm
except 2026-03-30 08:00 .. 2026-03-30 12:00 off maintenance
"""


class Elements(HTMLParser):
    """Every start tag as (tag, attributes, the tags it is inside), and the text under each id."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str], tuple[str, ...]]] = []
        self.stack: list[tuple[str, dict[str, str]]] = []
        self.texts: dict[str, str] = {}
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.found.append((tag, a, tuple(t for t, _ in self.stack)))
        if tag in ("td", "th", "tr"):  # cells read apart
            self.handle_data(" ")
        if tag not in ("meta", "br", "img", "input", "link"):
            self.stack.append((tag, a))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {k: v or "" for k, v in attrs}, tuple(t for t, _ in self.stack)))

    def handle_endtag(self, tag: str) -> None:
        if tag not in [t for t, _ in self.stack]:
            return
        while self.stack:
            t, _ = self.stack.pop()
            if t == tag:
                break

    def handle_data(self, data: str) -> None:
        for _, a in self.stack:
            if "id" in a:
                self.texts[a["id"]] = self.texts.get(a["id"], "") + data

    def all(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        return [a for t, a, _ in self.found if t == tag and all(a.get(k) == v for k, v in attrs.items())]


def summary(**status: Any) -> dict[str, Any]:
    sched = parse_schedule(SCHEDULE, "schedule", backends={"vllm", "llama"})
    ov = Overlay(
        "override", "vllm", datetime(2026, 3, 28, 11, 30, tzinfo=UTC), datetime(2026, 3, 28, 23, tzinfo=UTC)
    )
    week = lay_out(sched, date(2026, 3, 28), 7, now=NOW, overlay=ov)
    base = {
        "active": "vllm",
        "since": "2026-03-28T11:31:05+00:00",
        "schedule": {},
        "override": {"mode": "override", "backend": "vllm", "until": "2026-03-28T23:00:00+00:00"},
        "backends": {"vllm": {"active_state": "active", "health": {"state": "ok"}}},
        "gpus": [
            {"index": 0, "name": "NVIDIA H200", "used_mib": 70000, "total_mib": 143771, "state": "held"}
        ],
        "frontdoor": {"held": 2, "in_flight": {"vllm": 5}},
        **status,
    }
    rows = [
        {
            "id": 4,
            "from": "llama",
            "to": "vllm",
            "trigger": "manual",
            "outcome": "ok",
            "started_at": "2026-03-28T11:30:00+00:00",
            "finished_at": "2026-03-28T11:31:05+00:00",
            "durations_s": {"drain": 1.5, "stop": 2.25, "ready": 58.0},
        }
    ]
    return build(base, rows, week, ["vllm", "llama"], NOW)


def test_one_svg_group_per_stretch_names_its_backend_and_holds_its_pieces() -> None:
    s = summary()
    page = Elements(render(s))
    groups = page.all("g", **{"class": "stretch"})
    stretches = s["week"]["stretches"]
    assert len(groups) == len(stretches) > 10
    assert [g["data-backend"] for g in groups] == [x["backend"] for x in stretches]
    assert [(g["data-from"], g["data-until"], g["data-source"]) for g in groups] == [
        (x["from"], x["until"], x["source"]) for x in stretches
    ]
    assert {g["data-source"] for g in groups} == {"schedule", "override", "exception"}
    # every piece is a rect inside its group; a stretch over several days has several
    rects = [(a, inside) for t, a, inside in page.found if t == "rect" and "g" in inside]
    assert len(rects) == sum(len(d["pieces"]) for d in s["week"]["days"])
    fills = timeline.fills(s)
    assert fills["vllm"] != fills["llama"] and fills["off"] == timeline.OFF_FILL


def test_the_skipped_hour_is_hatched_and_no_stretch_is_drawn_over_it() -> None:
    s = summary()
    page = Elements(render(s))
    (gap,) = page.all("rect", **{"class": "clock-gap"})
    x0, x1 = timeline._x(2 * 3600), timeline._x(3 * 3600)
    assert float(gap["x"]) == pytest.approx(x0) and float(gap["width"]) == pytest.approx(x1 - x0)
    row_y = timeline.TOP + 1 * timeline.ROW_H + 3  # Sunday: the second row
    sunday = [
        (float(a["x"]), float(a["x"]) + float(a["width"]))
        for t, a, inside in page.found
        if t == "rect" and "g" in inside and float(a["y"]) == row_y
    ]
    assert sunday and all(b <= x0 + 1e-6 or a >= x1 - 1e-6 for a, b in sunday)
    (now,) = page.all("line", id="now")
    assert float(now["x1"]) == pytest.approx(timeline._x(13 * 3600))  # 13:00 CET, Saturday's row


def test_the_page_says_who_serves_the_mode_the_switch_the_last_switches_and_the_gpus() -> None:
    s = summary(daemon={"switch": {"from": "vllm", "to": "llama", "phase": "release", "elapsed_s": 4.26}})
    html = render(s)
    page = Elements(html)
    (serving,) = page.all("strong", id="serving")
    assert serving["data-backend"] == "vllm" and page.texts["serving"] == "vllm"
    assert "since Sat 2026-03-28 12:31 CET" in " ".join(page.texts["now"].split())
    assert page.texts["mode"] == "Override: vllm until Sun 2026-03-29 00:00 CET, then the schedule."
    (sw,) = page.all("p", id="switch")
    assert (sw["data-phase"], sw["data-to"]) == ("release", "llama")
    assert "phase release, 4.3 s so far" in page.texts["switch"]
    recent = " ".join(page.texts["recent"].split())
    assert "drain stop ready" in recent and "1.5 s 2.25 s 58.0 s" in recent and "manual ok" in recent
    assert "NVIDIA H200 68.4 GiB 140.4 GiB held" in " ".join(page.texts["gpus"].split())
    assert page.texts["held"] == "2" and page.texts["in-flight"] == "vllm 5"
    nxt = [a["data-backend"] for a in page.all("li")]
    assert nxt[:3] == ["llama", "vllm", "off"]  # the override ends, the 02:30 entry, maintenance
    assert html.startswith("<!DOCTYPE html>") and "<script>" in html and "setInterval" in html


def test_every_value_is_escaped_even_from_a_summary_not_made_by_build() -> None:
    hostile = "<img src=x onerror=alert(1)>"
    s = summary()
    s["serving"] = {"backend": hostile, "since": None}
    s["week"]["stretches"][0]["backend"] = hostile
    s["recent"][0]["to"] = hostile
    s["gpus"][0]["name"] = hostile
    html = render(s)
    assert hostile not in html and "<img" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html


def test_status_json_is_the_summary_and_a_stale_page_says_since_when() -> None:
    s = summary()
    assert json.loads(status_json(s)) == {**s, "stale_since": None}
    html = render(s, stale_since="2026-03-28T11:59:00Z")
    assert "has not answered since" in html and 'datetime="2026-03-28T11:59:00Z"' in html


def test_the_front_doors_live_values_lay_over_the_summary_by_the_same_rules() -> None:
    s = summary()
    live = with_live(s, active="llama", switching=True, target="llama", phase="ready")
    assert live["serving"] == {"backend": "llama", "since": None}  # not known since when yet
    assert live["switch"]["to"] == "llama" and live["switch"]["phase"] == "ready"
    assert with_live(s, active="vllm")["serving"]["since"] == "2026-03-28T11:31:05Z"
    assert with_live(s, active="")["serving"]["backend"] is None  # unknown
    assert with_live(s, active="/etc/passwd")["serving"]["backend"] is None
    assert with_live(s, switching=False)["switch"] is None
    fd = with_live(s, frontdoor={"held": 7, "in_flight": {"vllm": 1, "x y": 2}, "listen": ["[::]:8000"]})
    assert fd["frontdoor"] == {"held": 7, "in_flight": {"vllm": 1}}
    page = Elements(render(live))
    assert page.all("strong", id="serving")[0]["data-backend"] == "llama"

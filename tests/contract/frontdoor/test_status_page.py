"""The status page served by a real front door on a loopback socket (``gpushift/frontdoor/page.py``):
``/gpushift/`` and ``/gpushift/status.json`` from a summary the test's daemon stand-in hands over,
fetched at most every 2 s whatever the traffic (the source's clock is the test's), with who serves
from the daemon's properties (the view) at once, the front door's own held and in-flight counts,
what it last heard when the daemon stops answering, and nothing but GET and HEAD."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable
from datetime import date, datetime, timezone
from typing import Any

import pytest

from gpushift.frontdoor.page import FETCH_EVERY_S, HEADERS, StatusPage, SummarySource
from gpushift.schedule import parse_schedule
from gpushift.schedule.week import lay_out
from gpushift.statuspage.summary import build
from tests.support.frontdoor_rig import DEADLINE_S, Door

UTC = timezone.utc
NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


class DaemonStandIn:
    """What the daemon link's ``get_summary`` would return: the summary of a daemon serving
    ``serving``, counted; ``fail`` makes it raise (a daemon that does not answer)."""

    def __init__(self) -> None:
        self.calls = 0
        self.serving = "day"
        self.fail = False

    async def get_summary(self) -> str:
        self.calls += 1
        if self.fail:
            raise ConnectionError("no answer to GetSummary within 5 s")
        sched = parse_schedule(
            "TZ=Europe/Berlin\n0 8 * * * day\n0 20 * * * night\n", "s", backends={"day", "night"}
        )
        week = lay_out(sched, date(2026, 3, 2), 7, now=NOW)
        status = {
            "active": self.serving,
            "since": "2026-03-02T07:00:00+00:00",
            "backends": {},
            "schedule": {},
        }
        return json.dumps(build(status, [], week, ["day", "night"], NOW))


@pytest.fixture
def served(door_factory: Callable[..., Door]) -> tuple[Door, DaemonStandIn, list[float], SummarySource]:
    door = door_factory()
    daemon = DaemonStandIn()
    clock = [100.0]
    source = SummarySource(daemon.get_summary, monotonic=lambda: clock[0], wall=lambda: NOW.timestamp())

    def attach() -> None:
        door.fd.status_page = StatusPage(source, door.fd, monotonic=lambda: clock[0])

    door.loop.call(attach)
    return door, daemon, clock, source


def get(door: Door, path: str, method: str = "GET") -> tuple[int, http.client.HTTPMessage, str]:
    c = http.client.HTTPConnection("127.0.0.1", door.port, timeout=DEADLINE_S)
    try:
        c.request(method, path)
        r = c.getresponse()
        return r.status, r.headers, r.read().decode()
    finally:
        c.close()


def test_the_page_and_its_json_are_served_with_the_daemons_summary(served: Any) -> None:
    door, daemon, _clock, _source = served
    status, headers, html = get(door, "/gpushift/")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8", html
    assert 'id="serving" data-backend="day"' in html and html.count('class="stretch"') == 15
    for k, v in HEADERS.items():
        assert headers[k] == v
    status, headers, text = get(door, "/gpushift/status.json")
    doc = json.loads(text)
    assert status == 200 and headers["Content-Type"] == "application/json; charset=utf-8"
    assert doc["serving"]["backend"] == "day" and doc["stale_since"] is None
    assert [b["name"] for b in doc["backends"]] == ["day", "night"]
    assert doc["frontdoor"] == {"held": 0, "in_flight": {"day": 0, "night": 0}}  # the front door's own
    assert daemon.calls == 1  # both answered from one fetch


def test_the_summary_is_fetched_at_most_every_2_s_whatever_the_traffic(served: Any) -> None:
    door, daemon, clock, _source = served
    for _ in range(40):
        assert get(door, "/gpushift/status.json")[0] == 200
    assert daemon.calls == 1
    assert door.fd.status_page.renders == 1  # the flood within a second: one rendering
    clock[0] += FETCH_EVERY_S - 0.01
    get(door, "/gpushift/")
    assert daemon.calls == 1
    clock[0] += 0.02
    get(door, "/gpushift/")
    get(door, "/gpushift/status.json")
    assert daemon.calls == 2


def test_who_serves_follows_the_daemons_properties_at_once(served: Any) -> None:
    door, daemon, _clock, _source = served
    get(door, "/gpushift/")
    door.update(active="night", switching=False)  # a PropertiesChanged: ActiveBackend night
    _s, _h, html = get(door, "/gpushift/")
    assert 'id="serving" data-backend="night"' in html and daemon.calls == 1
    door.update(active="", switching=True, target="day", phase="release")
    doc = json.loads(get(door, "/gpushift/status.json")[2])
    assert doc["serving"]["backend"] is None
    assert doc["switch"] == {
        "from": "day",
        "to": "day",
        "phase": "release",
        "trigger": None,
        "elapsed_s": None,
    }


def test_a_daemon_that_stops_answering_leaves_the_last_summary_and_says_since_when(served: Any) -> None:
    door, daemon, clock, _source = served
    get(door, "/gpushift/")
    daemon.fail = True
    clock[0] += FETCH_EVERY_S
    door.update(connected=False, active="day")
    status, _h, html = get(door, "/gpushift/")
    assert status == 200 and 'id="stale"' in html and "has not answered since" in html
    assert 'data-backend="day"' in html  # what it said last
    doc = json.loads(get(door, "/gpushift/status.json")[2])
    assert doc["stale_since"] == "2026-03-02T09:00:00Z"
    daemon.fail = False
    clock[0] += FETCH_EVERY_S
    assert json.loads(get(door, "/gpushift/status.json")[2])["stale_since"] is None


def test_a_daemon_never_heard_gives_a_page_that_says_so(door_factory: Callable[..., Door]) -> None:
    door = door_factory()

    async def never() -> str:
        raise ConnectionError("not connected to the bus")

    door.loop.call(lambda: setattr(door.fd, "status_page", StatusPage(SummarySource(never), door.fd)))
    status, _h, html = get(door, "/gpushift/")
    assert status == 200 and "The gpushift daemon is not answering" in html
    assert json.loads(get(door, "/gpushift/status.json")[2])["stale_since"] == ""


def test_only_get_and_head_under_gpushift_and_other_paths_are_the_front_doors(served: Any) -> None:
    door, _daemon, _clock, _source = served
    status, headers, _ = get(door, "/gpushift")
    assert status == 308 and headers["Location"] == "/gpushift/"
    assert get(door, "/gpushift/", "POST")[0] == 405
    assert get(door, "/gpushift/", "HEAD")[0] == 200
    assert get(door, "/gpushift/../etc/passwd")[0] in (400, 404)
    assert get(door, "/gpushift/nothing-here")[0] == 404
    status, _h, body = get(door, "/v1/models")  # the front door's own routes are untouched
    assert status == 200 and "day-model" in body

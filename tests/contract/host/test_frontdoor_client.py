"""The daemon's client of the front door (gpushift/host/frontdoor.py) against a real private bus and
the test front door (tests/support/fake_frontdoor.py): its answers, a front door that is absent,
one that owns the name and never answers (each call ends at its deadline), and a malformed status."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpushift.host.dbus import connect
from gpushift.host.frontdoor import BusFrontDoor

REPO = Path(__file__).resolve().parents[3]


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.lines.append((level, event, kw))


def start_front_door(procs: Any, address: str, d: Path, hang: bool = False) -> None:
    d.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "DBUS_SESSION_BUS_ADDRESS": address, "PYTHONPATH": str(REPO)}
    args = [
        sys.executable,
        "-m",
        "tests.support.fake_frontdoor",
        "--dir",
        str(d),
        *(["--hang"] if hang else []),
    ]
    p = procs.start(args, env=env)
    deadline = time.monotonic() + 20
    while not (d / "ready").exists():
        assert p.poll() is None and time.monotonic() < deadline, "the test front door did not start"
        time.sleep(0.02)


@pytest.fixture
def bus(start_bus: Any) -> Any:
    address = start_bus()
    b = connect("session", address)
    b.address = address
    try:
        yield b
    finally:
        b.con.close_sync(None)


def test_the_calls_and_their_answers(bus: Any, procs: Any, tmp_path: Path) -> None:
    d = tmp_path / "fd"
    start_front_door(procs, bus.address, d)
    (d / "in_flight.json").write_text('{"day": 3}')
    (d / "held.json").write_text('{"held": 2, "longest_s": 1.25}')
    log = Log()
    fd = BusFrontDoor(bus, timeout_s=5.0, log=log)
    assert fd.close("day") == 3
    assert fd.in_flight("day") == 3 and fd.in_flight("night") == 0
    assert fd.status() == {"listen": ["[::]:8000"], "held": 2, "in_flight": {"day": 3}, "closed": [],
                           "daemon": "connected", "requests": 0}  # fmt: skip
    assert fd.release("night") == (2, 1.25)
    assert [json.loads(x)["call"] for x in (d / "calls.jsonl").read_text().splitlines()] == [
        "Close", "InFlight", "InFlight", "Status", "Release",
    ]  # fmt: skip
    assert fd.last_error("release") is None and log.lines == []


def test_an_absent_front_door_answers_none_at_once_with_one_line(bus: Any) -> None:
    log = Log()
    fd = BusFrontDoor(bus, timeout_s=5.0, log=log)
    t0 = time.monotonic()
    assert fd.close("day") is None
    assert fd.release("night") is None
    assert time.monotonic() - t0 < 5.0  # nobody owns the name: the bus says so at once
    assert (fd.last_error("release") or "").startswith("Release: org.freedesktop.DBus.Error.NameHasNoOwner")
    assert [e for _lvl, e, _kw in log.lines] == ["frontdoor_call_failed", "frontdoor_call_failed"]
    for _ in range(5):  # the sampler's Status() every period: logged once while the error stays
        assert fd.status() is None
    assert [kw["call"] for _lvl, _e, kw in log.lines].count("status") == 1


def test_a_front_door_that_never_answers_costs_its_deadline(bus: Any, procs: Any, tmp_path: Path) -> None:
    start_front_door(procs, bus.address, tmp_path / "fd", hang=True)
    fd = BusFrontDoor(bus, timeout_s=0.5, log=Log())
    t0 = time.monotonic()
    assert fd.close("day") is None
    took = time.monotonic() - t0
    assert 0.4 <= took < 5.0, took  # the call's deadline, then None (generous upper bound: a busy machine)
    assert "Timeout" in (fd.last_error("close") or "") or "timed out" in (fd.last_error("close") or "")


def test_a_status_that_is_not_a_document_is_none(bus: Any, procs: Any, tmp_path: Path) -> None:
    d = tmp_path / "fd"
    start_front_door(procs, bus.address, d)
    fd = BusFrontDoor(bus, timeout_s=5.0, log=Log())
    assert fd.status() is not None
    for text, why in (("not json", "Expecting value"), ("[1, 2]", "a JSON list, not an object")):
        (d / "status.txt").write_text(text)
        assert fd.status() is None
        assert why in (fd.last_error("status") or ""), fd.last_error("status")

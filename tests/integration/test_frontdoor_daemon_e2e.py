"""The daemon's side of the front door contract, end to end: the real daemon under the sandbox's
systemd user manager and session bus, stand-in backends, and a test front door
(tests/support/fake_frontdoor.py) owning org.gpushift.FrontDoor1 on that bus, answering from
files this test writes and recording every call.

* busctl reads SwitchTarget, NextServed (a calendar exception ahead), Models and TimeZone, and a
  busctl monitor sees them change in PropertiesChanged through a switch;
* a switch with a request in flight through the front door waits for it: Close(old) first, InFlight
  while it drains, Release(new) last, and the ledger row has extra.frontdoor;
* a front door that owns the name and never answers costs each call bus_timeout_s, no more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpushift_env import Backend, GpushiftEnv, end, free_port

from tests.support import busctl as bc

USER = ["--user"]
#: The calendar exception ahead (2099-01-01 .. 2099-01-02, night): when night is next served.
EXCEPTION_START = 4070908800
SCHEDULE = "TZ=UTC\n0 0 1 1 * day\nexcept 2099-01-01 .. 2099-01-02 night far-away\n"


class FrontDoorEnv(GpushiftEnv):
    """GpushiftEnv with a [frontdoor] table (the daemon then calls org.gpushift.FrontDoor1)."""

    bus_timeout_s = 2.0

    def config_text(self) -> str:
        listen = f"127.0.0.1:{free_port()}"
        return super().config_text() + f'\n[frontdoor]\nlisten = ["{listen}"]\nbus_timeout_s = {self.bus_timeout_s}\n'


def start_front_door(sandbox: Any, d: Path, hang: bool = False) -> subprocess.Popen[bytes]:
    d.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **sandbox.env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [sys.executable, "-m", "tests.support.fake_frontdoor", "--dir", str(d), *(["--hang"] if hang else [])]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not (d / "ready").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            end(proc)
            raise AssertionError(f"the test front door did not start: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.05)
    return proc


def calls(d: Path, *names: str, since: float = 0.0) -> list[dict[str, Any]]:
    """The calls the test front door received (only ``names`` when given; from ``since``), in order."""
    try:
        lines = (d / "calls.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    got = [json.loads(x) for x in lines]
    return [c for c in got if (not names or c["call"] in names) and c["t"] >= since]


def make_env(sandbox: Any, name: str, **opts: Any) -> FrontDoorEnv:
    base = Path(sandbox.base_dir) / name
    base.mkdir(parents=True, exist_ok=True)
    (base / "schedule").write_text(SCHEDULE)
    day = Backend("day", free_port(), [0, 1], drain_timeout_s=60, extra_config=['models = ["day-model"]'])
    night = Backend("night", free_port(), [1], extra_config=['models = ["night-model"]'])
    return FrontDoorEnv(sandbox, base, [day, night], schedule=str(base / "schedule"), sample_interval_s=0.5, **opts)


def fold(changes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    states, state = [], {}
    for c in changes:
        state = {**state, **c}
        states.append(state)
    return states


def test_properties_and_a_drain_that_waits_for_the_front_doors_request(sandbox: Any) -> None:
    bc.require()
    d = Path(sandbox.base_dir) / "frontdoor"
    door = start_front_door(sandbox, d)
    try:
        env = make_env(sandbox, "gs").up()
        uenv = sandbox.env
        env.wait_for(lambda: env.status().get("active") == "day", 60, "the schedule's day backend")
        assert bc.get_property(USER, "SwitchTarget", env=uenv) == 's ""'
        assert bc.get_property(USER, "Models", env=uenv) == 'a{sas} 2 "day" 1 "day-model" "night" 1 "night-model"'
        assert bc.get_property(USER, "TimeZone", env=uenv) == 's "UTC"'
        assert bc.get_property(USER, "NextServed", env=uenv) == (
            f'a{{st}} 2 "day-model" 0 "night-model" {EXCEPTION_START}'
        )
        st = env.status()
        assert st["frontdoor"]["answered"] is True, st["frontdoor"]
        assert st["frontdoor"]["in_flight"] == {}
        assert "front door: [::]:8000 · held 0 · in flight 0" in env.cli("status").stdout

        # the daemon's first switch (off to day, at its start) released its held requests too
        assert [(c["call"], c["arg"]) for c in calls(d, "Close", "Release")] == [("Release", "day")]
        began = time.time()
        (d / "in_flight.json").write_text('{"day": 1}')  # one request in flight through the front door
        (d / "held.json").write_text('{"held": 2, "longest_s": 1.5}')
        monitor = bc.Monitor(USER, env=uenv)
        try:
            monitor.start(lambda: bc.call(USER, "GetStatus", env=uenv))
            switch = env.cli_popen("switch", "night", "--reason", "front door test")
            env.wait_for(lambda: len(calls(d, "InFlight", since=began)) >= 3, 60, "the drain asking InFlight(day)")
            time.sleep(1.0)
            assert switch.poll() is None, "the switch did not wait for the front door's request"
            released_at = time.time()
            (d / "in_flight.json").write_text('{"day": 0}')  # the request finished
            out, err = switch.communicate(timeout=120)
            assert switch.returncode == 0, (out, err)
            env.wait_for(
                lambda: any(s.get("SwitchTarget") == "" and s.get("ActiveBackend") == "night"
                            for s in fold(bc.properties_changed(monitor.snapshot()))),
                20, "the properties after the switch",
            )  # fmt: skip
            changes = bc.properties_changed(monitor.snapshot())
        finally:
            monitor.stop()

        seq = [(c["call"], c["arg"]) for c in calls(d, "Close", "InFlight", "Release", since=began)]
        assert seq[0] == ("Close", "day"), seq
        assert seq[-1] == ("Release", "night"), seq
        assert set(seq[1:-1]) == {("InFlight", "day")}, seq
        row = env.ledger()[0]
        full = env.ledger_row(row["id"])
        extra = full["extra"]
        assert extra["frontdoor"] == {
            "serving": "night",
            "held": 2,
            "longest_s": 1.5,
            "in_flight_at_close": 1,
            "closed": ["day"],
        }, extra
        (drain,) = extra["drain"]
        assert drain["in_flight_at_start"] == 1 and drain["in_flight_at_stop"] == 0 and not drain["timed_out"]
        close_t = calls(d, "Close", since=began)[0]["t"]
        assert drain["waited_s"] >= released_at - close_t - 0.5, (drain, released_at - close_t)
        assert calls(d, "Release", since=began)[0]["t"] >= released_at
        states = fold(changes)
        assert any(s.get("SwitchTarget") == "night" for s in states), changes
        assert states[-1]["SwitchTarget"] == ""
        # during the switch both are served now (day active, night its target); then a person's
        # switch is an override until the next boundary (next 1 January), where the schedule wants day
        served = [c["NextServed"] for c in changes if "NextServed" in c]
        new_year = int(datetime(datetime.now(timezone.utc).year + 1, 1, 1, tzinfo=timezone.utc).timestamp())
        assert {"night-model": 0, "day-model": 0} in served, served
        assert served[-1] == {"night-model": 0, "day-model": new_year}, served
        assert bc.get_property(USER, "NextServed", env=uenv) == f'a{{st}} 2 "day-model" {new_year} "night-model" 0'

    finally:
        end(door)


def test_a_front_door_that_never_answers_costs_each_call_its_timeout(sandbox: Any) -> None:
    d = Path(sandbox.base_dir) / "frontdoor"
    door = start_front_door(sandbox, d, hang=True)
    try:
        env = make_env(sandbox, "gs")
        env.bus_timeout_s = 1.0
        env.up()
        env.wait_for(lambda: env.status().get("active") == "day", 60, "the schedule's day backend")
        st = env.status()
        assert st["frontdoor"]["answered"] is False, st["frontdoor"]
        assert "front door: " in env.cli("status").stdout and "not answering" in env.cli("status").stdout
        began = time.time()
        t0 = time.monotonic()
        env.cli("switch", "night", "--reason", "silent front door", check=True)
        took = time.monotonic() - t0
        row = env.ledger_row(env.ledger()[0]["id"])
        extra = row["extra"]
        assert "Timeout" in extra["frontdoor"]["error"] or "timed out" in extra["frontdoor"]["error"], extra
        assert extra["frontdoor"]["in_flight_at_close"] is None
        (drain,) = extra["drain"]
        # Close waited its bus_timeout_s (1 s); the drain did not ask the silent front door again
        assert drain["waited_s"] < 1.0 + 2.0, drain
        assert [c["call"] for c in calls(d, "Close", "InFlight", "Release", since=began)] == ["Close", "Release"]
        assert row["outcome"] == "ok" and took < 60, (row["outcome"], took)
        durations = row["durations_s"]
        assert durations["drain"] < 3.0, durations
    finally:
        end(door)

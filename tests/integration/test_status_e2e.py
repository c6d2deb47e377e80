"""`gpushift status` against the real daemon: it answers from the sampler's latest sample, so a
backend whose health turns bad stops being reported as serving within a couple of sampling periods,
and a backend whose health endpoint hangs never slows status down (nothing is asked on the daemon's
main loop).  The shipped gpushift.service under a real systemd user manager, stand-in backends
whose /health the test turns bad through the stand-in's control endpoint."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpushift_env import Backend, GpushiftEnv, free_port

BUS_NAME = "org.gpushift.Switcher1"
OBJECT_PATH = "/org/gpushift/Switcher1"


def set_health(b: Backend, mode: str) -> None:
    """The stand-in's /health from now on: ok, fail (500) or hang (never answers)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{b.port}/_standin/health",
        data=json.dumps({"mode": mode}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert json.loads(r.read()) == {"mode": mode}


@pytest.fixture
def dbus_status(sandbox: Any) -> Iterator[Any]:
    """``dbus_status()`` → (seconds the GetStatus call took, the status dict), on a connection of its
    own per call (concurrent callers each have theirs, as separate monitoring scripts would).

    What is timed is the GetStatus call, not the connection: on a loaded 2-core machine the
    sandbox's dbus-daemon was seen to leave a new connection's authentication unanswered for 30 s
    and more (with GLib's client and with jeepney alike, while other connections were served; the
    daemon under test takes no part in authentication), so a connection that has not authenticated
    within 5 s is dropped and another one opened.  jeepney, not pydbus, so that concurrent callers
    share no GLib state."""
    from jeepney import DBusAddress, new_method_call
    from jeepney.io.blocking import open_dbus_connection
    from jeepney.wrappers import unwrap_msg

    address = DBusAddress(OBJECT_PATH, bus_name=BUS_NAME, interface=BUS_NAME)

    def connect() -> Any:
        for _ in range(11):
            try:
                return open_dbus_connection(bus=sandbox.bus_address, auth_timeout=5)
            except TimeoutError:
                continue
        raise AssertionError("no connection to the sandbox's bus authenticated within 11 tries of 5 s")

    def call() -> tuple[float, dict[str, Any]]:
        conn = connect()
        try:
            t0 = time.monotonic()
            reply = conn.send_and_get_reply(new_method_call(address, "GetStatus"), timeout=30)
            (text,) = unwrap_msg(reply)
            return time.monotonic() - t0, json.loads(text)
        finally:
            conn.close()

    yield call  # each call closes its own connection


def up(sandbox: Any, **opts: Any) -> tuple[GpushiftEnv, Backend]:
    a = Backend("a", free_port(), [0, 1], version="1.0.0")
    b = Backend("b", free_port(), [1], version="2.0.0")
    env = GpushiftEnv(sandbox, Path(sandbox.base_dir) / "gs", [a, b], **opts).up()
    env.cli("switch", "a", "--reason", "setup", check=True)
    return env, a


def test_status_stops_reporting_a_backend_as_serving_once_its_health_turns_bad(sandbox, dbus_status):
    period = 1.0
    env, a = up(sandbox, sample_interval_s=period)
    took, st = dbus_status()
    assert st["active"] == "a" and st["active_reason"] is None
    health = st["backends"]["a"]["health"]
    assert health["state"] == "ok" and health["age_s"] <= 2 * period
    assert all(g["age_s"] <= 2 * period for g in st["gpus"])
    # Who holds the memory, with how old those names are (the simulated GPUs name them every read).
    main_pid = st["backends"]["a"]["main_pid"]
    assert all(main_pid in [h["pid"] for h in g["holders"]] for g in st["gpus"])
    assert all(g["holders_age_s"] is not None and g["holders_age_s"] <= 2 * period for g in st["gpus"])
    assert st["sample"]["period_s"] == period

    set_health(a, "fail")
    t0 = time.monotonic()
    while True:
        _, st = dbus_status()
        if st["active"] is None:
            break
        assert time.monotonic() - t0 < 2 * period + 1.0, (
            f"still serving after 2 periods: {st['backends']['a']}"
        )
        time.sleep(0.05)
    assert st["running"] == ["a"]  # the unit still runs: status reports, it does not act
    assert st["active_reason"].startswith("a: health failing"), st["active_reason"]
    health = st["backends"]["a"]["health"]
    assert (health["ok"], health["status"], health["state"]) == (False, 500, "failing")
    human = env.cli("status").stdout
    assert "active:   unknown: a: health failing" in human and "health FAILING" in human

    # it keeps counting how long the failure lasts
    time.sleep(2 * period)
    _, st = dbus_status()
    assert st["backends"]["a"]["health"]["failing_for_s"] >= period

    set_health(a, "ok")
    t0 = time.monotonic()
    while dbus_status()[1]["active"] != "a":
        assert time.monotonic() - t0 < 2 * period + 1.0, "not serving again after 2 periods"
        time.sleep(0.05)


def test_status_stays_fast_while_a_backends_health_endpoint_hangs(sandbox, dbus_status):
    # The default sampling period (2 s); the config says nothing about sampling.
    env, a = up(sandbox)
    set_health(a, "hang")
    try:
        # Several callers at once (a person, a monitoring script...), repeatedly over a few periods:
        # every answer comes fast, because none of them waits for the hanging endpoint.
        worst = 0.0
        last: dict[str, Any] = {}
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            answers: list[tuple[float, dict[str, Any]]] = []
            errors: list[BaseException] = []

            def caller(out: list[Any] = answers, errs: list[BaseException] = errors) -> None:
                try:
                    out.append(dbus_status())
                except BaseException as e:  # shown in the assertion below, not lost in a thread
                    errs.append(e)

            callers = [threading.Thread(target=caller) for _ in range(3)]
            for t in callers:
                t.start()
            for t in callers:
                t.join(90)
            assert not errors, f"a status caller failed: {errors!r}"
            assert len(answers) == 3, "a status caller got no answer within 90 s"
            worst = max([worst, *(took for took, _ in answers)])
            last = answers[-1][1]
        assert worst < 1.0, f"a status call took {worst:.2f} s while a health endpoint hung"
        # ... and the hanging backend is not reported as serving
        assert last["active"] is None, last
        health = last["backends"]["a"]["health"]
        assert health["ok"] is not True and health["state"] in ("failing", "unknown"), health
        assert "a: health" in last["active_reason"]
        assert last["backends"]["a"]["active_state"] == "active"
    finally:
        set_health(a, "ok")  # let the hung connections go before the sandbox stops the unit
    assert env.cli("status").returncode == 0

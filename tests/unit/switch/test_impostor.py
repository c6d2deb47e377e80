"""A process outside the backend's unit answering on its port never makes a switch ok (issue 20).

The fake probe's impostor answers 200 and its own version to an unchecked request, and is refused
(naming it) when the request is checked against the unit's cgroup — what the real probe does
(tests/contract/host/test_peer.py, tests/integration/test_impostor_e2e.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpushift.config.schema import parse
from gpushift.switch import records
from gpushift.values import Caller, Outcome, Phase, Trigger, VersionInfo

DAY_PORT, NIGHT_PORT = 18000, 18080
WARMUP = 'warmup = { path = "/v1/completions", body = { prompt = "hi" } }\n'  # [backends.night] is last


def test_an_impostor_at_readiness_fails_the_start_naming_it_and_the_rollback_brings_day_back(
    world: Any,
) -> None:
    world.probe.set_impostor(NIGHT_PORT, pid=31337)
    res = world.switch("night")
    rec = world.record(res)
    assert not res.ok and res.failed_phase == Phase.READY.value
    assert rec.outcome == Outcome.ROLLED_BACK.value and world.running() == ["day"]
    assert (
        "PID 31337" in rec.message
        and "user nobody" in rec.message
        and "gpushift-night.service" in rec.message
    )
    assert rec.extra["foreign_answer"]["peers"][0]["pid"] == 31337
    assert rec.backend_version is None  # the impostor's version was never asked
    assert not [
        r for r in world.ledger.rows.values() if r.outcome == Outcome.OK.value and r.to_backend == "night"
    ]
    # Every readiness poll of night was checked against night's own cgroup.
    night = world.url("night")
    asked = [cg for url, cg in world.probe.checked if url == night]
    assert asked and set(asked) == {"/system.slice/gpushift-night.service"}


def test_a_version_answered_by_an_impostor_never_records_an_ok_launch(make_world: Callable[..., Any]) -> None:
    world = make_world()
    world.boot("night")
    imp = world.probe.set_impostor(DAY_PORT)
    world.probe.impostors.clear()  # health and warm-up reach day itself; only its /version is taken

    def version(url: Any, cmd: Any, timeout_s: float = 5.0, expect_cgroup: str | None = None) -> VersionInfo:
        world.probe.checked.append((url, expect_cgroup))
        return imp.version_info(expect_cgroup)

    world.probe.version = version
    res = world.switch("day")
    rec = world.record(res)
    assert not res.ok and res.failed_phase == Phase.VERSION.value
    assert rec.outcome == Outcome.ROLLED_BACK.value and world.running() == ["night"]
    assert rec.backend_version != imp.version and "PID 31337" in rec.message
    assert not [r for r in world.ledger.rows.values() if r.backend_version == imp.version]
    assert ("http://127.0.0.1:18000/version", "/system.slice/gpushift-day.service") in world.probe.checked


def test_a_warm_up_answered_by_an_impostor_fails_the_start(make_world: Callable[..., Any]) -> None:
    w = make_world()
    cfg = parse(w.toml + WARMUP, "/etc/gpushift/t.toml")
    w.config = cfg
    w.switcher.reconfigure(cfg)
    w.boot("day")
    imp = w.probe.set_impostor(NIGHT_PORT)
    w.probe.impostors.clear()  # readiness reaches night itself
    real = w.probe.warmup

    def warmup(req: Any, expect_cgroup: str | None = None) -> Any:
        w.probe.impostors[NIGHT_PORT] = imp  # the impostor is on the port by the time it is asked
        try:
            return real(req, expect_cgroup)
        finally:
            w.probe.impostors.clear()

    w.probe.warmup = warmup
    res = w.switch("night")
    rec = w.record(res)
    assert not res.ok and res.failed_phase == Phase.WARMUP.value
    assert rec.outcome == Outcome.ROLLED_BACK.value and w.running() == ["day"]
    assert rec.extra["warmup"]["foreign"]["peers"][0]["pid"] == imp.pid and "PID 31337" in rec.message


def test_a_relaunch_row_never_takes_an_impostor_s_version(world: Any) -> None:
    world.probe.set_impostor(DAY_PORT)
    rec = records.relaunch(world.ports, world.config, "0.0.0-test", "day", "relaunched by systemctl")
    assert rec.backend_version is None and rec.extra["foreign_answer"]["peers"][0]["pid"] == 31337
    assert "version not recorded" in (rec.message or "")


def test_without_an_impostor_every_check_passes_and_the_switch_is_ok(world: Any) -> None:
    res = world.switch("night")
    assert res.ok and world.running() == ["night"]
    assert all(cg == "/system.slice/gpushift-night.service" for _url, cg in world.probe.checked)


def test_a_relaunch_whose_port_an_impostor_took_is_a_failed_start_not_an_ok_one(world: Any) -> None:
    # day crashed; another user's process took its port before the keeper relaunches it.
    world.units.set_stopped(world.unit("day"))  # its memory goes with it
    world.units.set_failed(world.unit("day"), "exit-code")
    world.probe.set_impostor(DAY_PORT, pid=4444)
    ticket = world.switcher.request("day", "relaunch after a crash", Caller.daemon(), Trigger.WATCH)
    res = world.wait(ticket)
    rec = world.record(res)
    assert not res.ok and res.failed_phase == Phase.READY.value and rec.outcome == Outcome.FAILED.value
    assert "PID 4444" in rec.message and not world.running()  # stopped again, not left half-started
    assert not [r for r in world.ledger.rows.values() if r.outcome == Outcome.OK.value]

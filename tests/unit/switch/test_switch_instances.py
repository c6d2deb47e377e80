"""A backend of several instances switched as one (issue 23), against the stateful fakes.

The World's "night" becomes two instances, ``gpushift-night@0.service`` on GPU 0 (port 18081) and
``gpushift-night@1.service`` on GPU 1 (port 18082), each holding 6800 MiB while it runs; "day" (GPUs
0 and 1) serves at the start.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpushift.values import Outcome
from tests.support.instances import N0, N1, with_instances

_with_instances = with_instances


@pytest.fixture
def two(make_world: Any) -> Any:
    w = _with_instances(make_world(drain_reads=2))
    w.boot("day")
    return w


def _calls(world: Any, verb: str) -> list[str]:
    return [u for v, u in world.units.calls if v == verb]


def test_switch_to_instances_starts_both_after_the_gate_saw_both_gpus(two: Any) -> None:
    res = two.switch("night")
    assert res.ok, res
    assert sorted(_calls(two, "start")) == [N0, N1]
    assert two.units.is_running(N0) and two.units.is_running(N1)
    assert not two.units.is_running("gpushift-day.service")
    # the gate read GPUs 0 and 1 together until both were free, and only then the starts came
    stopped = two.log.first("units.stopped", "gpushift-day.service")
    first_start = min(two.log.first("units.start", N0), two.log.first("units.start", N1))
    gate = [e.args[0] for e in two.log.entries[stopped:first_start] if e.kind == "gpu.read"]
    assert gate and all(tuple(i) == (0, 1) for i in gate), gate
    rec = two.record(res)
    assert [r["index"] for r in rec.vram["released"]] == [0, 1]
    entries = rec.extra["instances"]
    assert [(e["unit"], e["gpus"], e["port"], e["outcome"]) for e in entries] == [
        (N0, [0], 18081, "ready"),
        (N1, [1], 18082, "ready"),
    ]
    assert entries[1]["argv"] == ["/opt/night/bin/server", "--port", "18082", "--instance", "1"]
    assert {"start", "ready"} <= set(entries[0]["durations_s"])
    assert rec.unit == N0 and rec.argv_running[-1] == "0"  # the first instance describes the backend


def test_switch_away_from_instances_stops_both_and_the_gate_waits_for_both(two: Any) -> None:
    assert two.switch("night").ok
    res = two.switch("day")
    assert res.ok, res
    assert sorted(_calls(two, "stop")[-2:]) == [N0, N1]
    assert not two.units.is_running(N0) and not two.units.is_running(N1)
    # day's preflight took both instances' memory as the backend's own, not another user's
    assert two.record(res).outcome == Outcome.OK.value


def test_switch_one_instance_failing_with_min_ready_all_rolls_back(two: Any) -> None:
    two.units.behave(N1, start_job_result="failed")
    res = two.switch("night")
    assert not res.ok and res.outcome == Outcome.ROLLED_BACK.value, res
    assert two.units.is_running("gpushift-day.service")
    assert not two.units.is_running(N0) and not two.units.is_running(N1)
    rec = two.record(res)
    assert "1 of 2 instances ready, 2 needed" in (rec.message or "")
    failed = [e for e in rec.extra["instances"] if e["outcome"] == "failed"]
    assert [(e["unit"], e["phase"]) for e in failed] == [(N1, "start")]
    assert failed[0]["evidence"]["unit"] == N1


def test_switch_one_instance_failing_with_min_ready_1_serves_and_names_it(make_world: Any) -> None:
    world = _with_instances(make_world(), min_ready=1)
    world.boot("day")
    world.units.behave(N1, start_job_result="failed")
    res = world.switch("night")
    assert res.ok and res.outcome == Outcome.OK.value, res
    assert world.units.is_running(N0) and not world.units.is_running(N1)
    assert world.switcher.running_backends() == ["night"]
    entries = world.record(res).extra["instances"]
    assert [e["outcome"] for e in entries] == ["ready", "failed"]
    assert "start job of gpushift-night@1.service" in entries[1]["error"]


def test_switch_first_instance_failing_with_min_ready_1_is_described_by_the_second(make_world: Any) -> None:
    world = _with_instances(make_world(), min_ready=1)
    world.boot("day")
    world.probe.set_health("http://127.0.0.1:18081/health", ok_after=None)  # never healthy
    res = world.switch("night")
    assert res.ok, res
    rec = world.record(res)
    assert rec.argv_running[-1] == "1"  # the serving instance's launch, not the failed one's
    entries = rec.extra["instances"]
    assert [e["outcome"] for e in entries] == ["failed", "ready"]
    assert entries[0]["phase"] == "ready" and entries[0]["stopped"] == "done"
    assert not world.units.is_running(N0)  # a failed instance does not keep its GPU


def test_switch_an_instance_unit_not_loaded_is_refused(two: Any) -> None:
    two.units.behave(N1, load_state="not-found")
    res = two.switch("night")
    assert res.outcome == Outcome.REFUSED.value, res
    assert f"unit {N1} of backend night is not-found" in res.message
    assert two.units.is_running("gpushift-day.service")


def test_status_names_the_failed_instance_in_text_and_json(make_world: Any) -> None:
    from gpushift.cli import render_status
    from gpushift.daemon.wiring import Components, status_report

    world = _with_instances(make_world(), min_ready=1)
    world.boot("day")
    world.units.behave(N1, start_job_result="failed")
    assert world.switch("night").ok
    st = status_report(Components(world.config, world.ports), {"running": True})
    assert [(e["unit"], e["outcome"], e["phase"]) for e in st["last_switch"]["instances"]] == [
        (N0, "ready", None),
        (N1, "failed", "start"),
    ]
    text = render_status(st)
    assert f"instance: {N0} (GPU 0, port 18081) ready" in text
    assert f"instance: {N1} (GPU 1, port 18082) FAILED in start: start job of {N1}" in text


def test_status_a_backend_whose_first_instance_failed_serves_on_the_second(make_world: Any) -> None:
    from gpushift.daemon.wiring import Components, status_report

    world = _with_instances(make_world(), min_ready=1)
    world.boot("day")
    world.units.behave(N0, start_job_result="failed")
    assert world.switch("night").ok
    st = status_report(Components(world.config, world.ports), {"running": True})
    assert st["active"] == "night", (st["active"], st.get("active_reason"))
    night = st["backends"]["night"]
    assert night["unit"] == N1 and night["active_state"] == "active"
    assert night["health"]["ok"] is True, night["health"]


def test_switch_away_from_instances_drains_every_instance(two: Any) -> None:
    assert two.switch("night").ok
    two.probe.set_in_flight("night", 3, step=0)  # each instance answers 3 and never finishes them
    polls = len(two.probe.in_flight_polls)
    res = two.switch("day")
    assert res.ok, res
    drain = two.record(res).extra["drain"][0]
    assert (drain["in_flight_at_start"], drain["in_flight_at_stop"], drain["timed_out"]) == (6, 6, True)
    assert (len(two.probe.in_flight_polls) - polls) % 2 == 0  # both instances at every poll

"""The sampler's health is the unit's own: an impostor on a running backend's port is never healthy
(issue 20).  The fake probe's impostor answers 200 unchecked and is refused, named, when checked."""

from __future__ import annotations

from typing import Any

from gpushift.sampler.sample import to_status
from gpushift.sampler.sampler import Sampler

DAY_PORT = 18000


def test_an_impostor_on_the_serving_backend_s_port_is_not_its_health(world: Any) -> None:
    world.probe.set_impostor(DAY_PORT, pid=4711)
    snap = Sampler(world.config, world.ports, period_s=2.0).sample_once()
    day = snap.backend("day")
    assert day is not None and day.health is not None and day.health.value is not None
    assert day.health.value.ok is False and day.health.value.foreign is not None
    status = to_status(snap, world.clock.monotonic())
    assert status["active"] is None and "PID 4711" in status["active_reason"]
    entry = status["backends"]["day"]["health"]
    assert entry["state"] == "failing" and entry["foreign"]["peers"][0]["pid"] == 4711
    # The sampler asked for day's health checked against day's own cgroup.
    assert {cg for _url, cg in world.probe.checked} == {"/system.slice/gpushift-day.service"}

"""The sampler and a backend of several instances (issue 23): each instance's health is asked once
a cycle, and the standing instance's figure is the backend's health (tests/support/instances.py:
"night" as two instances)."""

from __future__ import annotations

from typing import Any

from gpushift.sampler.sampler import Sampler
from tests.support.instances import N0, with_instances


def test_sampler_asks_each_instance_for_its_health_once_a_cycle(make_world: Any) -> None:
    w = with_instances(make_world())
    w.boot("day")
    assert w.switch("night").ok
    s = Sampler(w.config, w.ports, period_s=2.0)
    w.probe.health_polls.clear()
    night = s.sample_once().backend("night")
    assert sorted(w.probe.health_polls) == ["http://127.0.0.1:18081/health", "http://127.0.0.1:18082/health"]
    assert night is not None and night.unit == N0
    assert night.health is not None and night.health == dict(night.instance_health)[N0]
    assert night.health.value is not None and night.health.value.ok

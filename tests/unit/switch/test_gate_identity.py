"""The VRAM gate fails closed on what it cannot see: no GPU listed, a GPU gone, a GPU replaced."""

from __future__ import annotations

from typing import Any

from gpushift.values import Outcome


def test_gate_zero_gpus_listed_refuses_instead_of_passing_vacuously(make_world: Any) -> None:
    # day uses "all GPUs"; NVML lists none (a driver reloading): nothing can be proven released.
    world = make_world(day_gpus_line="")
    world.boot("night")
    world.gpu.count = 0
    res = world.switch("day")
    assert res.ok is False and res.outcome == Outcome.REFUSED.value, res
    assert "no GPU is visible" in res.message
    assert world.units.calls == [] and world.running() == ["night"]


def test_gate_gpu_gone_since_the_last_launch_keeps_the_switch_refused(make_world: Any) -> None:
    world = make_world(day_gpus_line="")
    world.boot("night")
    assert world.switch("day").ok  # the launch sees GPUs 0 and 1
    assert world.switch("night").ok
    world.gpu.count = 1  # GPU 1 fell off the bus: NVML lists GPU 0 only
    res = world.switch("day")
    assert res.outcome == Outcome.REFUSED.value and "GPU 1 is not visible" in res.message, res
    assert world.running() == ["night"]


def test_gate_gpu_with_a_new_uuid_refuses_until_accepted(make_world: Any) -> None:
    world = make_world()
    world.boot("night")
    assert world.switch("day").ok
    world.gpu.uuids[1] = "GPU-replaced-1"
    res = world.switch("night")
    assert res.outcome == Outcome.REFUSED.value
    assert "GPU-fake-1 -> GPU-replaced-1" in res.message and "accepted_gpu_uuids" in res.message
    assert world.running() == ["day"]

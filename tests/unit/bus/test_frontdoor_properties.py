"""The properties the front door reads (gpushift/bus/properties.py): SwitchTarget, NextServed by
model name, Models, TimeZone."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gpushift.bus.properties import Sources, by_model, values, zone_name
from gpushift.sampler.sampler import Sampler
from gpushift.schedule import parse_schedule
from gpushift.values import Mode, Phase

MODELS = {"day": ("qwen", "qwen-7b"), "night": ("llama", "qwen")}


def props(
    w: Any, current: Any = None, per_backend: Any = None, zone: str = ""
) -> tuple[dict[str, Any], list]:
    sampler = Sampler(w.config, w.ports, period_s=2.0)
    sampler.sample_once()
    asked: list[tuple[str, ...]] = []

    def next_served(serving: tuple[str, ...]) -> dict[str, int]:
        asked.append(serving)
        return dict(per_backend or {})

    src = Sources(
        backends=lambda: w.config.backends,
        sample=sampler.snapshot,
        monotonic=w.clock.monotonic,
        current=lambda: current,
        mode=lambda: Mode.SCHEDULE,
        next_switch=lambda: None,
        models=lambda: MODELS,
        next_served=next_served,
        zone=lambda: zone,
    )
    return values(src), asked


def test_next_served_by_model_name_the_earliest_of_its_backends(world: Any) -> None:
    p, asked = props(world, per_backend={"day": 0, "night": 1_796_000_400}, zone="Europe/Berlin")
    assert asked == [("day",)]  # what serves now: the active backend
    assert p["NextServed"] == {"llama": 1_796_000_400, "qwen": 0, "qwen-7b": 0}
    assert p["Models"] == {"day": ["qwen", "qwen-7b"], "night": ["llama", "qwen"]}
    assert p["TimeZone"] == "Europe/Berlin"
    assert p["SwitchTarget"] == ""


def test_during_a_switch_its_target_serves_now(world: Any) -> None:
    world.units.set_stopped(world.unit("day"))  # the old backend is stopped: ActiveBackend "off"
    run = SimpleNamespace(phase=Phase.START, target="night")
    p, asked = props(world, current=run, per_backend={"night": 0})
    assert asked == [("night",)]  # "off" is not a backend that serves
    assert (p["SwitchTarget"], p["ActiveBackend"]) == ("night", "off")
    assert p["NextServed"] == {"llama": 0, "qwen": 0}  # day's qwen-7b: never again, absent


def test_by_model_and_zone_name() -> None:
    assert by_model({"a": 5, "b": 3}, {"a": ["m", "x"], "b": ["m"], "c": ["y"]}) == {"m": 3, "x": 5}
    assert by_model({}, {"a": ["m"]}) == {}
    assert zone_name(parse_schedule("TZ=Europe/Berlin\n0 8 * * * day\n", backends=["day"])) == "Europe/Berlin"
    assert zone_name(None) == ""

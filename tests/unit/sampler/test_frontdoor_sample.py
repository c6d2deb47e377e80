"""The sampler asks the front door's Status() every period: the running backend's requests in flight
are the larger of its own count and the front door's (what status shows, what the busy-aware
boundaries read), and ``gpushift status`` shows the front door, or that it is not answering."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from gpushift.cli import render_status
from gpushift.config.schema import FrontDoorConfig
from gpushift.daemon.watch import BackendWatcher
from gpushift.daemon.wiring import compose_status
from gpushift.ledger.view import read_view
from gpushift.sampler.sampler import Sampler


@pytest.fixture
def fd(world: Any, fakes: Any) -> Any:
    door = fakes.FakeFrontDoor(world.log, world.clock)
    world.ports.frontdoor = door
    return door


def status(world: Any, sampler: Sampler) -> dict[str, Any]:
    config = replace(world.config, frontdoor=FrontDoorConfig(listen=("[::]:8000", "[::]:8080")))
    daemon = {"running": True, "state": "idle"}
    return compose_status(
        config, sampler.snapshot(), world.clock.monotonic(), daemon, read_view(world.ledger)
    )


def test_the_larger_count_is_the_backends_and_the_keeper_sees_it(world: Any, fd: Any) -> None:
    fd.set_in_flight("day", 2, step=0)  # requests through the front door; the backend's gauges say 0
    sampler = Sampler(world.config, world.ports, period_s=2.0)
    sample = sampler.sample_once()
    day = sample.backend("day")
    assert day is not None and day.in_flight is not None
    assert day.in_flight.value == 2 and day.idle_since is None
    watcher = BackendWatcher(world.ports, None, None)
    watcher.sampler = sampler
    assert watcher.busy("day") == (2, None)  # a boundary that waits for an idle moment waits
    fd.set_in_flight("day", 0, step=0)
    world.probe.set_in_flight("day", 1, step=0)
    assert sampler.sample_once().backend("day").in_flight.value == 1  # type: ignore[union-attr]
    world.probe.set_in_flight("day", 0, step=0)
    sampler.sample_once()  # both say 0: idle from now
    world.clock.advance(3.0)
    sampler.sample_once()
    assert watcher.busy("day") == (0, pytest.approx(3.0))
    assert [e.kind for e in world.log.entries].count("frontdoor.status") == 4  # once a sample


def test_status_shows_the_front_door(world: Any, fd: Any) -> None:
    fd.set_in_flight("day", 2, step=0)
    fd.hold(3, 1.0)
    sampler = Sampler(world.config, world.ports, period_s=2.0)
    sampler.sample_once()
    s = status(world, sampler)
    assert s["frontdoor"] == {
        "answered": True,
        "listen": ["[::]:8000", "[::]:8080"],
        "held": 3,
        "in_flight": {"day": 2},
        "closed": [],
        "daemon": "connected",
        "requests": 0,
        "age_s": 0.0,
    }
    assert s["backends"]["day"]["in_flight"]["requests"] == 2
    text = render_status(s)
    assert "front door: [::]:8000 [::]:8080 · held 3 · in flight day 2" in text.splitlines()


def test_status_shows_the_front_doors_view_of_each_instance(world: Any, fd: Any) -> None:
    fd.instances = {
        "night": [
            {"instance": "gs-night0.service", "up": True, "in_flight": 3},
            {"instance": "gs-night1.service", "up": False, "in_flight": 0},
        ],
        "bad": "not a list",  # another process's answer: what is not of its shape is left out
        "odd": [{"instance": 7}, "x", {"instance": "u", "up": "yes", "in_flight": -1}],
    }
    sampler = Sampler(world.config, world.ports, period_s=2.0)
    sampler.sample_once()
    s = status(world, sampler)
    assert s["frontdoor"]["instances"] == {
        "night": [
            {"instance": "gs-night0.service", "up": True, "in_flight": 3},
            {"instance": "gs-night1.service", "up": False, "in_flight": 0},
        ],
        "odd": [{"instance": "u", "up": None, "in_flight": None}],
    }
    lines = render_status(s).splitlines()
    assert "front door night: gs-night0.service up 3 · gs-night1.service DOWN 0" in lines, lines
    assert "front door odd: u ? ?" in lines, lines
    fd.instances = None  # a front door without a backend of several: no key, no line
    sampler.sample_once()
    s = status(world, sampler)
    assert "instances" not in s["frontdoor"]
    assert not [x for x in render_status(s).splitlines() if x.startswith("front door ")]


def test_status_says_when_the_front_door_does_not_answer(world: Any, fd: Any) -> None:
    fd.absent = True
    sampler = Sampler(world.config, world.ports, period_s=2.0)
    sampler.sample_once()
    s = status(world, sampler)
    assert s["frontdoor"]["answered"] is False
    assert "NameHasNoOwner" in s["frontdoor"]["error"]
    assert s["frontdoor"]["listen"] == ["[::]:8000", "[::]:8080"]  # from the config
    line = [x for x in render_status(s).splitlines() if x.startswith("front door:")]
    assert line == [f"front door: [::]:8000 [::]:8080 · not answering ({s['frontdoor']['error']})"]
    assert s["backends"]["day"]["in_flight"]["requests"] == 0  # the backend's own count stands
    # an answer older than two periods is not shown as the front door's state now
    fd.absent = False
    sampler.sample_once()
    world.clock.advance(5.0)
    s = status(world, sampler)
    assert s["frontdoor"]["answered"] is False and s["frontdoor"]["error"] == "no answer for 5.0 s"


def test_without_a_front_door_status_has_no_such_key(world: Any) -> None:
    sampler = Sampler(world.config, world.ports, period_s=2.0)
    sampler.sample_once()
    daemon = {"running": True, "state": "idle"}
    s = compose_status(
        world.config, sampler.snapshot(), world.clock.monotonic(), daemon, read_view(world.ledger)
    )
    assert "frontdoor" not in s
    assert "front door" not in render_status(s)

"""A backend of several instances in the front door's state (gpushift/frontdoor/state.py and
instances.py), without sockets: each instance is an upstream of its own (its health URL's origin,
loopback only), Status() and the metrics show each instance only when some backend has them, a
backend that starts serving again starts with every instance up, and the health watch marks
instances down and up."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from gpushift.config.schema import parse
from gpushift.config.types import Config, InstanceConfig
from gpushift.errors import ConfigError
from gpushift.frontdoor import instances
from gpushift.frontdoor.state import DoorState
from gpushift.frontdoor.view import DaemonView
from gpushift.frontdoor.wire import Origin

CONFIG = """
[frontdoor]

[backends.day]
kind = "llama-server"
unit = "day.service"
health_url = "http://127.0.0.1:8001/health"
models = ["day-model"]

[backends.night]
kind = "vllm"
unit = "night.service"
health_url = "http://127.0.0.1:8081/health"
models = ["night-model"]
"""

UNITS = ("gpushift-llama@0.service", "gpushift-llama@1.service")
SERVING_DAY = DaemonView(connected=True, active="day")
SERVING_NIGHT = DaemonView(connected=True, active="night")


def with_instances(urls: tuple[str, ...] = ("http://127.0.0.1:8101/health", "http://[::1]:8102/h")) -> Config:
    base = parse(CONFIG)
    members = tuple(InstanceConfig(u, url, (i,)) for i, (u, url) in enumerate(zip(UNITS, urls, strict=True)))
    day = replace(base.backends["day"], health_url="", instances=members)
    return replace(base, backends={**base.backends, "day": day})


def test_each_instance_is_an_upstream_of_its_own() -> None:
    d = DoorState(with_instances())
    day = d.backends["day"]
    assert [(i.name, i.origin, i.health_url) for i in day.instances] == [
        (UNITS[0], Origin("http", "127.0.0.1", 8101), "http://127.0.0.1:8101/health"),
        (UNITS[1], Origin("http", "::1", 8102), "http://[::1]:8102/h"),
    ]
    assert day.origin == day.instances[0].origin
    assert d.backends["night"].instances == ()
    assert "day" in d.pools and "night" not in d.pools


def test_an_instance_off_loopback_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"backends\.day\.instances\[1\]\.health_url"):
        DoorState(with_instances(("http://127.0.0.1:8101/health", "http://10.0.0.2:8102/health")))


def test_status_and_metrics_show_instances_only_when_a_backend_has_them() -> None:
    single = DoorState(parse(CONFIG))
    assert "instances" not in single.status()
    assert b"instance" not in single.observer.page()
    d = DoorState(with_instances())
    assert d.status()["instances"] == {
        "day": [
            {"instance": UNITS[0], "up": True, "in_flight": 0},
            {"instance": UNITS[1], "up": True, "in_flight": 0},
        ]
    }
    page = d.observer.page().decode()
    assert f'gpushift_frontdoor_instance_up{{backend="day",instance="{UNITS[1]}"}} 1.0' in page


def test_the_backends_count_in_flight_covers_every_instance() -> None:
    d = DoorState(with_instances())
    d.update(SERVING_DAY)
    for _ in range(3):
        assert d.admit("day-model").backend == "day"
        i = d.pools.pick("day")
        assert i is not None
        d.pools.begin("day", i)
    assert d.in_flight("day") == 3
    assert [x["in_flight"] for x in d.status()["instances"]["day"]] == [2, 1]


def test_a_backend_serving_again_starts_with_every_instance_up() -> None:
    d = DoorState(with_instances())
    d.update(SERVING_DAY)
    d.pools.refused("day", 0, "connect: ECONNREFUSED")
    assert d.status()["instances"]["day"][0]["up"] is False
    d.update(SERVING_DAY)  # still the same backend serving: the mark stays
    assert d.status()["instances"]["day"][0]["up"] is False
    d.update(SERVING_NIGHT)
    d.update(SERVING_DAY)  # a switch back to it
    assert d.status()["instances"]["day"][0]["up"] is True


def test_the_watch_asks_only_the_backends_in_use_and_marks_down_and_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(instances, "PROBE_PERIOD_S", 0.0)
    answers = {0: True, 1: False}
    asked: list[tuple[str, int]] = []
    rounds = asyncio.Event()

    async def probe(backend: str, i: int) -> bool:
        asked.append((backend, i))
        if len(asked) >= 6:
            rounds.set()
        return answers[i]

    async def scenario() -> list[bool]:
        d = DoorState(with_instances())
        d.watch_instances(probe)
        await asyncio.sleep(0.05)
        nothing_yet = list(asked)  # nothing serves: nothing asked
        d.update(SERVING_DAY)
        await asyncio.wait_for(rounds.wait(), 20)
        ups = [x["up"] for x in d.status()["instances"]["day"]]
        answers[1] = True
        asked.clear()
        rounds.clear()
        await asyncio.wait_for(rounds.wait(), 20)
        d.end()
        assert nothing_yet == []
        return [*ups, *(x["up"] for x in d.status()["instances"]["day"])]

    assert asyncio.run(scenario()) == [True, False, True, True]
    assert {b for b, _ in asked} == {"day"}

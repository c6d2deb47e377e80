"""The front door's state without any socket or bus (gpushift/frontdoor/state.py): what update(view)
changes, Close() counting what is in flight and nothing new going there, Release() sorting the held
requests and returning (held, longest), the Release's word kept until the daemon's view agrees, a
hold's deadline and bound, Status(), and a health_url off loopback refused."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from gpushift.config.schema import parse
from gpushift.errors import ConfigError
from gpushift.frontdoor import routing
from gpushift.frontdoor.answers import Answer
from gpushift.frontdoor.holding import Outcome
from gpushift.frontdoor.state import DoorState
from gpushift.frontdoor.view import DaemonView

T = TypeVar("T")

CONFIG = """
[frontdoor]
hold_timeout_s = {hold}
max_held = {max_held}

[backends.day]
kind = "vllm"
unit = "day.service"
health_url = "http://127.0.0.1:8001/health"
models = ["day-model"]

[backends.night]
kind = "llama-server"
unit = "night.service"
health_url = "http://[::1]:8081/health"
"""

SERVING_DAY = DaemonView(connected=True, active="day", models={"night": ("night-model",)})
SWITCHING = DaemonView(
    connected=True, active="day", switching=True, target="night", models={"night": ("night-model",)}
)


def door(hold: float = 60, max_held: int = 10) -> DoorState:
    d = DoorState(parse(CONFIG.format(hold=hold, max_held=max_held)))
    d.update(SERVING_DAY)
    return d


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_names_follow_the_daemons_models_and_forwards_are_counted() -> None:
    d = door()
    assert d.names.owners("night-model") == ("night",)
    assert d.admit("day-model") == routing.forward("day")
    assert d.in_flight("day") == 1
    d.finished("day")
    d.finished("day")  # never below 0
    assert d.in_flight("day") == 0
    assert d.admit("night-model").reason == routing.NOT_SERVED
    assert d.in_flight("night") == 0


def test_close_stops_new_forwards_and_counts_what_is_in_flight() -> None:
    async def scenario() -> None:
        d = door()
        assert d.admit(None).action == routing.FORWARD
        d.update(SWITCHING)
        assert d.admit("day-model").action == routing.FORWARD  # not closed yet: the old still serves
        assert await d.close("day") == 2
        assert d.admit("day-model").reason == routing.NOT_SERVED
        assert d.in_flight("day") == 2
        assert await d.close("nope") == 0 and d.status()["closed"] == ["day"]

    run(scenario())


def test_release_forwards_the_held_ones_the_new_backend_serves_and_answers_the_others() -> None:
    async def scenario() -> tuple[list[Outcome | Answer], tuple[int, float], DoorState]:
        d = door()
        d.update(SWITCHING)
        await d.close("day")
        tasks = [asyncio.ensure_future(d.hold(m, "night")) for m in ("night-model", None, "day-model")]
        await asyncio.sleep(0.05)
        assert d.status()["held"] == 3
        figures = await d.release("day")  # rolled back
        return [(await t)[0] for t in tasks], figures, d

    outcomes, (held, longest), d = run(scenario())
    assert held == 3 and longest >= 0.04
    night, none, day = (o for o in outcomes if isinstance(o, Outcome))
    assert night.decision.reason == routing.NOT_SERVED and night.released_from == "night"
    assert none.decision == routing.forward("day") and none.released_from is None
    assert day.decision == routing.forward("day")
    assert d.in_flight("day") == 2  # the two forwards, counted at the release
    assert d.status()["closed"] == [] and d.status()["held"] == 0


def test_the_releases_word_holds_until_the_daemons_view_agrees() -> None:
    async def scenario() -> None:
        d = door()
        d.update(SWITCHING)
        await d.close("day")
        await d.release("night")
        # SwitchInProgress still true, ActiveBackend still "day": the Release's word wins
        assert d.admit("night-model") == routing.forward("night")
        assert d.admit("day-model").reason == routing.NOT_SERVED
        d.update(DaemonView(connected=True, active="night", models=SWITCHING.models))  # caught up
        assert d.admit("night-model") == routing.forward("night")
        d.update(SWITCHING)  # a new switch began (no Close yet)
        assert d.admit("night-model").action == routing.HOLD

    run(scenario())


def test_a_hold_ends_at_hold_timeout_s_and_beyond_max_held() -> None:
    async def scenario() -> tuple[Outcome | Answer, Outcome | Answer, float]:
        d = door(hold=1, max_held=1)
        d.update(SWITCHING)
        first = asyncio.ensure_future(d.hold("night-model", "night"))
        await asyncio.sleep(0.01)
        full, _ = await d.hold("night-model", "night")
        timed_out, held_s = await first
        return full, timed_out, held_s

    full, timed_out, held_s = run(scenario())
    assert isinstance(full, Answer) and full.code == "too_many_held" and full.retry_after
    assert isinstance(timed_out, Answer) and timed_out.code == "hold_timeout" and held_s >= 1
    assert 1 <= (timed_out.retry_after or 0) <= 300  # night's start_timeout_s (300) less the hold


def test_a_held_client_gone_after_its_forward_does_not_leak_a_count() -> None:
    async def scenario() -> DoorState:
        d = door()
        d.update(SWITCHING)
        t = asyncio.ensure_future(d.hold("night-model", "night"))
        await asyncio.sleep(0.01)
        await d.release("night")  # forwarded: counted in flight ...
        t.cancel()  # ... and the client went away before its handler woke
        with pytest.raises(asyncio.CancelledError):
            await t
        return d

    assert run(scenario()).in_flight("night") == 0


def test_the_daemon_lost_forwards_to_the_last_serving_backend() -> None:
    d = door()
    d.update(DaemonView())  # lost: the last view's names are kept
    assert d.admit("day-model") == routing.forward("day")
    assert d.admit("night-model").reason == routing.NOT_SERVED
    assert d.status()["daemon"] == "lost" and d.status()["serving"] == "day"
    fresh = DoorState(parse(CONFIG.format(hold=60, max_held=10)))
    assert fresh.admit(None).reason == routing.DAEMON_LOST


def test_status_has_the_spec_keys() -> None:
    st = door().status()
    assert {"listen", "held", "in_flight", "closed", "daemon", "requests"} <= set(st)
    assert st["in_flight"] == {"day": 0, "night": 0} and st["daemon"] == "connected"


def test_a_health_url_off_loopback_is_refused_naming_it() -> None:
    text = CONFIG.format(hold=60, max_held=10).replace(
        "http://[::1]:8081/health", "http://10.1.2.3:8081/health"
    )
    with pytest.raises(
        ConfigError,
        match=r"backends\.night\.health_url: 'http://10\.1\.2\.3:8081/health' is not on a loopback",
    ):
        DoorState(parse(text))


def test_the_metrics_model_label_is_bounded() -> None:
    d = door()
    assert d.observer.label("day-model") == "day-model"
    assert d.observer.label("night-model") == "night-model"  # from the daemon's Models
    assert d.observer.label("anything-a-client-says") == "other"
    assert d.observer.label(None) == ""

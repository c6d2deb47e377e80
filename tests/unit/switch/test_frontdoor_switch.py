"""A switch and the front door (gpushift/switch/frontdoor.py) against the stateful fakes: Close at
the drain's start, the drain on the larger of the two counts, Release as every row closes with its
answer in ``extra.frontdoor``, and a front door that is absent or never answers costing at most
``bus_timeout_s`` a call.  The World's time is fake (tests/support/fakes.py)."""

from __future__ import annotations

from typing import Any

import pytest

from gpushift.values import OFF, Caller, Outcome, Phase


@pytest.fixture
def fd(world: Any, fakes: Any) -> Any:
    door = fakes.FakeFrontDoor(world.log, world.clock, timeout_s=5.0)
    world.ports.frontdoor = door
    return door


def _kinds(world: Any, *prefixes: str) -> list[tuple[str, tuple[Any, ...]]]:
    return [(e.kind, e.args) for e in world.log.entries if e.kind.startswith(prefixes)]


def test_close_first_then_the_drain_waits_for_the_front_doors_count_then_release(world: Any, fd: Any) -> None:
    fd.set_in_flight("day", 3, step=1)  # three requests through the front door; the backend says 0
    fd.hold(2, 1.25)
    res = world.switch("night")
    assert res.ok, res
    calls = [(k, a) for k, a in _kinds(world, "frontdoor.", "units.stop", "ledger.finish")]
    assert calls[0] == ("frontdoor.close", ("day",))
    stop = next(i for i, (k, _) in enumerate(calls) if k == "units.stop")
    assert [a for k, a in calls[1:stop]] == [("day",)] * 3  # InFlight until it said 0
    assert [(k, a) for k, a in calls[stop:] if k.startswith("frontdoor.")] == [
        ("frontdoor.release", ("night",))
    ]
    # the release comes after ready and the version (the new backend answered), before the row closes
    log = world.log
    assert log.last("probe.health") < log.last("probe.version") < log.first("frontdoor.release")
    assert log.first("frontdoor.release") < log.last("ledger.finish")
    rec = world.record(res)
    (drain,) = rec.extra["drain"]
    assert (drain["in_flight_at_start"], drain["in_flight_at_stop"], drain["timed_out"]) == (3, 0, False)
    assert drain["waited_s"] == pytest.approx(1.5)
    assert rec.extra["frontdoor"] == {
        "serving": "night",
        "held": 2,
        "longest_s": 1.25,
        "in_flight_at_close": 3,
        "closed": ["day"],
    }
    assert fd.released == ["night"] and fd.closed == {"day"}


def test_the_drain_waits_for_the_larger_count(world: Any, fd: Any) -> None:
    world.probe.set_in_flight("day", 4, step=1)  # the backend's own gauges: 4, 3, 2, 1, 0
    fd.set_in_flight("day", 1, step=1)  # the front door's: 1, then 0
    res = world.switch("night")
    (drain,) = world.record(res).extra["drain"]
    assert (drain["in_flight_at_start"], drain["in_flight_at_stop"]) == (4, 0)
    assert drain["waited_s"] == pytest.approx(2.0)
    # and the other way round: the backend says 0, the front door's request is still running
    fd.set_in_flight("night", 2, step=0)
    res = world.switch("day")
    (drain,) = world.record(res).extra["drain"]
    assert drain["timed_out"] is True and drain["in_flight_at_stop"] == 2
    assert 5.0 <= drain["waited_s"] <= 5.5  # night's drain_timeout_s


def test_the_front_doors_count_counts_when_the_backend_cannot_tell(world: Any, fd: Any) -> None:
    world.probe.set_in_flight("day", None)  # no gauges: before the front door, the drain did not wait
    fd.set_in_flight("day", 2, step=1)
    res = world.switch("night")
    (drain,) = world.record(res).extra["drain"]
    assert (drain["in_flight_at_start"], drain["in_flight_at_stop"]) == (2, 0)
    assert drain["waited_s"] == pytest.approx(1.0)


def test_now_skips_the_drain_but_still_closes_and_releases(world: Any, fd: Any) -> None:
    fd.set_in_flight("day", 5, step=0)
    res = world.switch("night", skip_drain=True)
    assert res.ok, res
    assert [k for k, _ in _kinds(world, "frontdoor.")] == ["frontdoor.close", "frontdoor.release"]
    rec = world.record(res)
    assert rec.extra["drain"] == [{"backend": "day", "skipped": True}]
    assert rec.extra["frontdoor"]["in_flight_at_close"] == 5
    assert rec.extra["frontdoor"]["serving"] == "night"


def test_a_rollback_releases_to_what_serves_again(world: Any, fd: Any) -> None:
    world.probe.set_health(world.url("night"), ok_after=None, before=503)
    res = world.switch("night")
    assert res.outcome == Outcome.ROLLED_BACK.value, res
    assert fd.released == ["day"]
    assert world.record(res).extra["frontdoor"]["serving"] == "day"


def test_a_failure_that_leaves_nothing_serving_releases_to_off(make_world: Any, fakes: Any) -> None:
    world = make_world(on_failure="stay")
    world.boot("day")
    fd = fakes.FakeFrontDoor(world.log, world.clock)
    world.ports.frontdoor = fd
    fd.hold(3, 9.0)
    world.probe.set_health(world.url("night"), ok_after=None, before=503)
    res = world.switch("night")
    assert res.outcome == Outcome.FAILED.value, res
    assert fd.released == [OFF]  # the held requests are answered: nothing will serve them
    assert world.record(res).extra["frontdoor"] == {
        "serving": OFF,
        "held": 3,
        "longest_s": 9.0,
        "in_flight_at_close": 0,
        "closed": ["day"],
    }


def test_a_switch_to_off_releases_off(world: Any, fd: Any) -> None:
    res = world.switch(OFF)
    assert res.ok, res
    assert fd.released == [OFF] and fd.closed == {"day"}


def test_a_cancel_during_the_drain_reopens_the_old_backend(world: Any, fd: Any) -> None:
    fd.set_in_flight("day", 4, step=0)
    cancelled: list[str] = []

    def cancel_while_draining(e: Any) -> None:
        if e.kind == "progress" and e.phase == Phase.DRAIN.value and not cancelled:
            cancelled.append(world.switcher.cancel(Caller(uid=1001, user="carol")))

    world.switcher.listeners.append(cancel_while_draining)
    res = world.switch("night")
    assert res.outcome == Outcome.CANCELLED.value, res
    assert fd.released == ["day"]  # nothing was stopped: day serves on, its door open again


def test_a_refused_switch_and_one_from_off_release_too(world: Any, fd: Any) -> None:
    world.gpu.add_foreign(1, pid=4242, mib=9318, command="python", user="bob")
    res = world.switch("night")
    assert res.outcome == Outcome.REFUSED.value
    assert fd.released == ["day"] and not fd.closed  # requests held while it was decided go on
    assert world.record(res).extra["frontdoor"]["in_flight_at_close"] is None
    world.gpu.remove_foreign(4242)
    world.switch(OFF)
    fd.released.clear()
    res = world.switch("night")  # nothing to drain, nothing closed: the held requests still go
    assert res.ok, res
    assert fd.released == ["night"]
    assert "closed" not in world.record(res).extra["frontdoor"]


def test_an_absent_front_door_changes_nothing_but_the_row(world: Any, fd: Any) -> None:
    fd.absent = True
    world.probe.set_in_flight("day", 2, step=1)
    res = world.switch("night")
    assert res.ok, res
    rec = world.record(res)
    (drain,) = rec.extra["drain"]
    assert (drain["in_flight_at_start"], drain["in_flight_at_stop"]) == (2, 0)  # the backend's own count
    assert rec.extra["frontdoor"]["error"].startswith("release: org.freedesktop.DBus.Error.ServiceUnknown")
    assert rec.extra["frontdoor"]["in_flight_at_close"] is None


def test_a_front_door_that_never_answers_costs_each_call_its_timeout_only(
    make_world: Any, world: Any, fakes: Any
) -> None:
    base = make_world()
    base.boot("day")
    baseline = base.switch("night")
    t_base = base.clock.elapsed
    fd = fakes.FakeFrontDoor(world.log, world.clock, timeout_s=5.0)
    fd.hang = True
    world.ports.frontdoor = fd
    res = world.switch("night")
    assert res.ok and baseline.ok, res
    calls = [k for k, _ in _kinds(world, "frontdoor.")]
    # Close got no answer and the backend says 0: the drain is over at once; then Release
    assert calls == ["frontdoor.close", "frontdoor.release"]
    assert world.clock.elapsed - t_base == pytest.approx(2 * 5.0)  # two calls, each its bus_timeout_s
    assert world.record(res).extra["frontdoor"]["error"] == "release: Timeout was reached"


def test_a_silent_front_door_is_not_asked_again_during_the_drain(world: Any, fd: Any) -> None:
    fd.hang = True
    world.probe.set_in_flight("day", 2, step=1)  # the backend's own requests: 2, 1, 0
    t0 = world.clock.elapsed
    res = world.switch("night")
    assert res.ok, res
    assert [k for k, _ in _kinds(world, "frontdoor.")] == ["frontdoor.close", "frontdoor.release"]
    (drain,) = world.record(res).extra["drain"]
    assert (drain["in_flight_at_start"], drain["in_flight_at_stop"]) == (2, 0)
    assert drain["waited_s"] == pytest.approx(5.0 + 1.0)  # Close's timeout, then the backend's drain
    assert world.clock.elapsed - t0 == pytest.approx(2 * 5.0 + 1.0)


def test_without_a_front_door_nothing_is_recorded(world: Any) -> None:
    res = world.switch("night")
    assert "frontdoor" not in world.record(res).extra


# --------------------------------------------------------------------------- the warm-up's model names


def _with_models(world: Any, names: tuple[str, ...]) -> None:
    from dataclasses import replace

    night = replace(world.config.backends["night"], models=names)
    world.config = replace(world.config, backends={**world.config.backends, "night": night})
    world.switcher.reconfigure(world.config)


def test_the_warm_up_compares_the_model_names_with_v1_models_and_never_fails_on_it(world: Any) -> None:
    _with_models(world, ("llama", "default-night"))
    url = "http://127.0.0.1:18080/v1/models"
    world.probe.model_lists[url] = ["llama"]
    res = world.switch("night")
    assert res.ok, res  # a mismatch is recorded, not a failure
    assert world.record(res).extra["model_names"] == {
        "expected": ["llama", "default-night"],
        "listed": ["llama"],
        "missing": ["default-night"],
    }
    warned = [e.detail for e in world.events_of(res.ticket) if "does not list" in e.detail]
    assert warned == [
        "warning: night does not list the model name(s) default-night at /v1/models (it lists llama)"
    ]
    assert world.log.last("probe.models") < world.log.first("probe.version")


def test_the_model_names_match_or_cannot_be_read(world: Any) -> None:
    _with_models(world, ("llama",))
    url = "http://127.0.0.1:18080/v1/models"
    world.probe.model_lists[url] = ["llama", "other"]
    res = world.switch("night")
    assert world.record(res).extra["model_names"] == {"expected": ["llama"], "listed": ["llama", "other"]}
    del world.probe.model_lists[url]
    world.switch("day")
    res = world.switch("night")
    assert res.ok, res
    assert world.record(res).extra["model_names"] == {"expected": ["llama"], "error": "HTTP 404"}


def test_no_model_names_known_no_look(world: Any) -> None:
    res = world.switch("night")  # a generic backend without models = [...]: nothing to compare
    assert "model_names" not in world.record(res).extra
    assert world.probe.models_calls == []

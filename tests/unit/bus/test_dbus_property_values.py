"""What the D-Bus properties say: who serves by the status rule, the mode, the switch in flight and
its phase, the next switch the daemon will make by itself (Keeper.next_switch: the mode taken into
account), the backends in config order; and the checks SwitchTo's a{sv} options pass first."""

from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest

from gpushift.bus import args as dbus_args
from gpushift.bus.properties import Sources, values
from gpushift.errors import InvalidArgument
from gpushift.keeper import Keeper, Override
from gpushift.sampler.sampler import Sampler
from gpushift.schedule import parse_schedule
from gpushift.values import OFF, Mode, Phase

UTC = timezone.utc
SCHEDULE = "TZ=UTC\n0 8 * * * day\n0 20 * * * night\n0 0 * * * night\n"
NOON = datetime(2026, 3, 2, 12, tzinfo=UTC)


def at(day: int, hour: int) -> datetime:
    return datetime(2026, 3, day, hour, tzinfo=UTC)


# --------------------------------------------------------------------------- the values


def props(w: Any, current: Any = None, mode: Mode = Mode.SCHEDULE, nxt: Any = None) -> dict[str, Any]:
    sampler = Sampler(w.config, w.ports, period_s=2.0)
    sampler.sample_once()
    src = Sources(
        backends=lambda: w.config.backends,
        sample=sampler.snapshot,
        monotonic=w.clock.monotonic,
        current=lambda: current,
        mode=lambda: mode,
        next_switch=lambda: nxt,
    )
    return values(src)


def test_values_of_an_idle_daemon_serving_day(world: Any) -> None:
    assert props(world, nxt=("night", at(2, 20))) == {
        "ActiveBackend": "day",
        "Mode": "schedule",
        "SwitchInProgress": False,
        "Phase": "",
        "NextSwitch": ("night", int(at(2, 20).timestamp())),
        "Backends": ["day", "night"],
        "SwitchTarget": "",
        "NextServed": {},
        "Models": {},
        "TimeZone": "",
        "Instances": {},
    }


def test_active_backend_follows_the_status_rule(world: Any) -> None:
    w = world
    w.probe.set_health(w.url("day"), ok_after=None, before=503, unit=w.unit("day"))
    assert props(w)["ActiveBackend"] == ""  # the unit runs, its health fails: not known to serve
    w.units.set_stopped(w.unit("day"))
    assert props(w)["ActiveBackend"] == OFF  # every unit known stopped (as during a release)


def test_switch_in_flight_gives_its_phase_and_no_next_switch_is_zero(world: Any) -> None:
    run = SimpleNamespace(phase=Phase.RELEASE, target="night")
    p = props(world, current=run, mode=Mode.HOLD, nxt=None)
    assert (p["SwitchInProgress"], p["Phase"], p["Mode"], p["NextSwitch"]) == (
        True,
        "release",
        "hold",
        ("", 0),
    )


# --------------------------------------------------------------------------- Keeper.next_switch


class _Switcher:
    def add_listener(self, listener: Any) -> None:
        pass


class _Store:
    def load(self) -> Override | None:
        return None

    def save(self, override: Override | None) -> None:
        pass


def keeper(schedule: str | None, override: Override | None = None, now: datetime = NOON) -> Keeper:
    sched = parse_schedule(schedule, backends=["day", "night"]) if schedule is not None else None
    k = Keeper(_Switcher(), sched, _Store(), now=lambda: now, monotonic=lambda: 0.0)  # type: ignore[arg-type]
    k.override = override
    return k


def override(mode: Mode, backend: str, until: datetime | None) -> Override:
    return Override(mode=mode, backend=backend, until=until, set_by="alice", set_at=NOON)


def test_next_switch_follows_the_schedule() -> None:
    assert keeper(SCHEDULE).next_switch() == ("night", at(2, 20))
    assert keeper(SCHEDULE).mode() is Mode.SCHEDULE


def test_next_switch_is_none_without_schedule_during_a_hold_or_an_endless_override() -> None:
    assert keeper(None).next_switch() is None
    assert keeper(None).mode() is Mode.MANUAL
    assert keeper(SCHEDULE, override(Mode.HOLD, "night", None)).next_switch() is None
    assert keeper(SCHEDULE, override(Mode.OVERRIDE, "night", None)).next_switch() is None
    assert keeper("TZ=UTC\n0 8 * * * day\n").next_switch() is None  # nothing else ever wanted


def test_next_switch_during_an_override_is_what_the_schedule_wants_when_it_ends() -> None:
    # night until 20:00: the schedule then wants night too, so the next switch is day at 08:00
    assert keeper(SCHEDULE, override(Mode.OVERRIDE, "night", at(2, 20))).next_switch() == ("day", at(3, 8))
    # off until 20:00: at its end the schedule wants night
    assert keeper(SCHEDULE, override(Mode.OVERRIDE, OFF, at(2, 20))).next_switch() == ("night", at(2, 20))
    # an override whose end has passed (the tick has not run yet): the schedule's wish, due
    assert keeper(SCHEDULE, override(Mode.OVERRIDE, OFF, at(2, 11))).next_switch() == ("day", at(2, 11))


def test_next_switch_and_mode_do_not_wait_for_the_keepers_lock() -> None:
    k = keeper(SCHEDULE)
    with k._lock:  # a tick in progress on another thread holds it; reads here must not block
        import threading

        got: list[Any] = []
        t = threading.Thread(target=lambda: got.append((k.mode(), k.next_switch())))
        t.start()
        t.join(5)
    assert got == [(Mode.SCHEDULE, ("night", at(2, 20)))]


# --------------------------------------------------------------------------- SwitchTo's options


def switch_to(options: Any) -> dict[str, Any]:
    return dbus_args.check("SwitchTo", "day", options)


def test_switch_to_options_decode_into_the_daemons_options() -> None:
    assert switch_to(
        {"reason": "r", "now": True, "restart": False, "when_idle": True, "until": 1_893_456_000}
    ) == {
        "reason": "r",
        "now": True,
        "restart": False,
        "when_idle": True,
        "until": "2030-01-01T00:00:00+00:00",
    }
    assert switch_to({"until": "2026-12-01 08:00", "hold": False}) == {
        "until": "2026-12-01 08:00",
        "hold": False,
        "reason": "",
    }
    assert switch_to({}) == {"reason": ""}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"later": True}, "option 'later': unknown"),
        ({"now": 1}, "option now: expected a boolean (b)"),
        ({"until": True}, "option until: expected a string (s) or an integer (x)"),
        ({"until": 1.5}, "option until: expected"),
        ({"reason": ["a"]}, "option reason: expected a string (s)"),
        ({"hold": True, "until": "2026-12-01 08:00"}, "exclude each other"),
        ({"hold": True, "until": 1_893_456_000}, "exclude each other"),
        ({"until": 99_999_999_999_999_999}, "is not a time in UNIX seconds"),
        ({"reason": "x" * 5000}, "reason"),
        ({"reason": "two\nlines"}, "reason"),
        ("now", "options: expected a dictionary a{sv}"),
    ],
)
def test_switch_to_options_refused(options: Any, message: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        switch_to(options)
    assert message in str(e.value)


def test_check_refuses_malformed_arguments_of_every_member() -> None:
    assert dbus_args.check("Switch", "day", "why") == {"reason": "why"}
    assert dbus_args.check("SwitchWithOptions", "day", '{"now": true}') == {"now": True, "reason": ""}
    assert dbus_args.check("Cancel") == {}
    for member, args, message in (
        ("Switch", ("", "why"), "backend"),
        ("SwitchTo", ("-h", {}), "backend"),
        ("SwitchTo", ("day", {"nope": 1}), "unknown"),
        ("SwitchWithOptions", ("day", 5), "options"),
        ("SwitchTo", ("day",), "takes a backend and one more argument"),
        ("Cancel", ("extra",), "takes no arguments"),
    ):
        with pytest.raises(InvalidArgument, match=message):
            dbus_args.check(member, *args)


def test_the_clients_variant_types_round_trip_through_the_services_decoding() -> None:
    options = {"reason": "r", "now": True, "hold": True, "until": "2026-12-01 08:00"}
    typed = dbus_args.variant_types({k: v for k, v in options.items() if k != "hold"})
    assert typed == {"reason": ("s", "r"), "now": ("b", True), "until": ("s", "2026-12-01 08:00")}
    assert dbus_args.variant_types({"until": 5}) == {"until": ("x", 5)}
    with pytest.raises(InvalidArgument):
        dbus_args.variant_types({"colour": "red"})


def test_instances_property_shows_each_instance_of_a_backend_of_several(make_world: Any) -> None:
    from tests.support.instances import N0, N1, with_instances

    world = with_instances(make_world(), min_ready=1)
    world.boot("day")
    world.units.behave(N1, start_job_result="failed")
    assert world.switch("night").ok
    assert props(world)["Instances"] == {"night": [(N0, "active", "ok"), (N1, "failed", "")]}

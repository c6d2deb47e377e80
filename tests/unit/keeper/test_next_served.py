"""When the keeper next serves each backend by itself (gpushift/keeper/served.py, D-Bus NextServed):
served now, the schedule's changes, an override's end, a hold, a deferral, a calendar exception;
and Keeper.next_served computing again only when what it depends on changed."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from gpushift.keeper import Keeper, Override
from gpushift.keeper import keeper as keeper_mod
from gpushift.keeper.decide import Deferral
from gpushift.keeper.served import next_served
from gpushift.schedule import parse_schedule
from gpushift.values import OFF, Mode

UTC = timezone.utc
SCHEDULE = "TZ=UTC\n0 8 * * * day\n0 20 * * * night\n"
NOON = datetime(2026, 3, 2, 12, tzinfo=UTC)
BACKENDS = ("day", "night", "spare")


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 3, day, hour, minute, tzinfo=UTC)


def sched(text: str = SCHEDULE) -> Any:
    return parse_schedule(text, backends=list(BACKENDS))


def ov(mode: Mode, backend: str, until: datetime | None) -> Override:
    return Override(mode=mode, backend=backend, until=until, set_by="alice", set_at=NOON)


def served(schedule: Any = None, override: Any = None, deferral: Any = None, serving: Any = ("day",)) -> Any:
    return next_served(NOON, schedule, override, deferral, BACKENDS, serving)


def test_the_schedule_ahead() -> None:
    s = served(sched())
    assert s.at == {"day": None, "night": at(2, 20)}  # spare: never named, so absent
    assert s.seconds() == {"day": 0, "night": int(at(2, 20).timestamp())}
    assert s.until == at(2, 20)  # the next boundary: then it is computed again


def test_a_switch_in_flight_serves_its_target_now() -> None:
    # during the switch to night nothing is active; day comes back at 08:00 tomorrow
    assert served(sched(), serving=("night",)).at == {"night": None, "day": at(3, 8)}


def test_a_hold_an_endless_override_or_no_schedule_leave_only_what_serves() -> None:
    assert served(sched(), ov(Mode.HOLD, "night", None), serving=("night",)).at == {"night": None}
    assert served(sched(), ov(Mode.OVERRIDE, "night", None), serving=("night",)).at == {"night": None}
    assert served(None).at == {"day": None}
    assert served(None).until is None


def test_an_override_counts_from_its_end() -> None:
    # night until 15:00: the schedule then wants day (served at 15:00), night comes at 20:00
    s = served(sched(), ov(Mode.OVERRIDE, "night", at(2, 15)), serving=("night",))
    assert s.at == {"night": None, "day": at(2, 15)}
    assert s.until == at(2, 15)
    # off until 21:00: at its end the schedule wants night; day the morning after
    s = served(sched(), ov(Mode.OVERRIDE, OFF, at(2, 21)), serving=())
    assert s.at == {"night": at(2, 21), "day": at(3, 8)}


def test_a_calendar_exception_in_the_way() -> None:
    text = SCHEDULE + "except 2026-03-02 18:00 .. 2026-03-03 12:00 spare works\n"
    s = served(sched(text))
    # spare from 18:00; night's 20:00 is inside the exception, so night waits for the 3rd's 20:00
    assert s.at == {"day": None, "spare": at(2, 18), "night": at(3, 20)}


def test_a_deferral_serves_its_target_by_its_deadline() -> None:
    d = Deferral(key=at(2, 11), target="night", since=NOON, since_mono=0.0, limit_s=600.0, idle_s=5.0)
    s = served(sched(), deferral=d)
    assert s.at["night"] == NOON + timedelta(seconds=600)
    assert s.until == NOON + timedelta(seconds=600)
    assert served(None, deferral=d).at == {"day": None, "night": NOON + timedelta(seconds=600)}


def test_a_backend_the_schedule_never_names_again_stops_the_search() -> None:
    s = served(sched("TZ=UTC\n0 8 * * * day\n"), serving=())
    assert s.at == {}  # day is in effect but not serving, and no change is ever ahead


class _Switcher:
    def add_listener(self, listener: Any) -> None:
        pass


class _Store:
    def load(self) -> Override | None:
        return None

    def save(self, override: Override | None) -> None:
        pass


def test_keeper_computes_again_only_when_its_inputs_change(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [NOON]
    k = Keeper(_Switcher(), sched(), _Store(), now=lambda: now[0], monotonic=lambda: 0.0)  # type: ignore[arg-type]
    calls: list[datetime] = []
    real = keeper_mod.next_served

    def counting(t: datetime, *a: Any) -> Any:
        calls.append(t)
        return real(t, *a)

    monkeypatch.setattr(keeper_mod, "next_served", counting)
    first = k.next_served(BACKENDS, ("day",))
    assert first == {"day": 0, "night": int(at(2, 20).timestamp())}
    for minute in range(1, 120):  # a read every second (here: every minute) for two hours
        now[0] = NOON + timedelta(minutes=minute)
        assert k.next_served(BACKENDS, ("day",)) == first
    assert len(calls) == 1
    k.next_served(BACKENDS, ())  # what serves changed (a switch began)
    k.override = ov(Mode.HOLD, "day", None)  # a person's hold
    k.next_served(BACKENDS, ())
    assert len(calls) == 3
    k.override = None
    now[0] = at(2, 20)  # the instant it held until
    assert k.next_served(BACKENDS, ("night",)) == {"night": 0, "day": int(at(3, 8).timestamp())}
    assert len(calls) == 4
    k.set_schedule(sched())  # a reload: a new schedule object, even with the same text
    k.next_served(BACKENDS, ("night",))
    assert len(calls) == 5

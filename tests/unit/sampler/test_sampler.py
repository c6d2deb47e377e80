"""The sampler: one immutable sample of units, health, GPUs and in-flight requests, each figure with
its age; stale figures are unknown, a failing or hanging adapter costs only its own figure, and the
thread stops when asked.  Against the stateful fakes (tests/support/fakes.py): the ``world`` fixture has
"day" (GPUs 0+1) serving and "night" stopped."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from gpushift.errors import SystemdError
from gpushift.host.proc import SystemClock
from gpushift.sampler.sample import Sample, to_status, verdict
from gpushift.sampler.sampler import HOLDERS_EVERY_PERIODS, HOLDERS_MOVE_MIB, Sampler, health_timeout_s
from gpushift.values import OFF, Health

PERIOD = 2.0


def sampler(w: Any, period_s: float = PERIOD, real_clock: bool = False) -> Sampler:
    ports = replace(w.ports, clock=SystemClock()) if real_clock else w.ports
    return Sampler(w.config, ports, period_s=period_s)


def status_of(w: Any, s: Sampler) -> dict[str, Any]:
    return to_status(s.snapshot(), w.clock.monotonic())


# --------------------------------------------------------------------------- contents and ages


def test_sampler_sample_holds_every_figure_stamped_with_when_it_was_taken(world: Any) -> None:
    w = world
    w.probe.set_in_flight("day", 3, step=0)
    s = sampler(w)
    assert s.snapshot().seq == 0  # nothing sampled yet
    snap = s.sample_once()
    now = w.clock.monotonic()
    assert snap is s.snapshot() and snap.seq == 1 and snap.taken_at == now
    day, night = snap.backend("day"), snap.backend("night")
    assert day is not None and night is not None
    assert day.state is not None and day.state.value is not None
    assert (day.state.value.active_state, day.state.value.main_pid) == (
        "active",
        w.units.units[w.unit("day")].main_pid,
    )
    assert day.state.value.main_start_us == int(w.clock.now().timestamp() * 1e6)
    assert day.health is not None and day.health.value == Health(True, 200, "ok")
    assert day.in_flight is not None and day.in_flight.value == 3
    assert night.state is not None and night.state.value is not None and not night.state.value.running
    assert night.health is None and night.in_flight is None  # not polled: its unit does not run
    assert w.url("night") not in w.probe.health_polls
    assert snap.gpus is not None and snap.gpus.value is not None
    assert [r.used_mib for r in snap.gpus.value] == [14500.0, 14500.0]
    for fig in (day.state, day.health, day.in_flight, night.state, snap.gpus):
        assert fig.at == now and fig.error is None


def test_sampler_status_shows_the_serving_backend_with_each_figures_age(world: Any) -> None:
    w = world
    s = sampler(w)
    s.sample_once()
    w.clock.advance(1.5)
    st = status_of(w, s)
    assert st["active"] == "day" and st["active_reason"] is None and st["running"] == ["day"]
    day = st["backends"]["day"]
    assert (day["active_state"], day["age_s"]) == ("active", 1.5)
    assert day["health"] == {
        "ok": True,
        "status": 200,
        "state": "ok",
        "detail": "ok",
        "age_s": 1.5,
        "failing_for_s": None,
    }
    assert day["main_started_at"] is not None
    assert st["backends"]["night"]["health"] is None
    assert [(g["index"], g["state"], g["age_s"]) for g in st["gpus"]] == [(0, "held", 1.5), (1, "held", 1.5)]
    assert st["sample"] == {"period_s": PERIOD, "seq": 1, "age_s": 1.5}


def test_sampler_figure_older_than_two_periods_is_unknown_never_its_old_value(world: Any) -> None:
    w = world
    s = sampler(w)
    s.sample_once()
    w.clock.advance(2 * PERIOD)  # exactly two periods: still known
    assert status_of(w, s)["active"] == "day"
    w.clock.advance(0.5)
    st = status_of(w, s)
    assert st["active"] is None
    assert "last read 4.5 s ago" in st["active_reason"]
    day = st["backends"]["day"]
    assert day["active_state"] == "unknown" and "unit state unknown" in day["error"] and day["age_s"] == 4.5
    assert (
        day["health"]["ok"] is None
        and day["health"]["state"] == "unknown"
        and day["health"]["status"] is None
    )
    for g in st["gpus"]:
        assert (g["used_mib"], g["holders"], g["state"], g["age_s"]) == (None, [], "unknown", 4.5)
        assert g["total_mib"] == 16384.0  # a fact of the GPU, not a figure


def test_sampler_stale_health_alone_makes_the_backend_not_serving(world: Any) -> None:
    w = world
    s = sampler(w, period_s=0.5)  # stale after 1 s
    s.sample_once()
    gate = threading.Event()
    real_health = w.probe.health

    def hung(url: str, timeout_s: float = 2.0, expect_cgroup: str | None = None) -> Health:
        gate.wait(20)
        return real_health(url, timeout_s, expect_cgroup)

    w.probe.health = hung  # type: ignore[method-assign]
    try:
        w.clock.advance(1.5)
        snap = s.sample_once()  # the unit is read again; the health read hangs past the cycle
    finally:
        gate.set()
    day = snap.backend("day")
    assert day is not None and day.state is not None and day.state.at == w.clock.monotonic()
    st = to_status(snap, w.clock.monotonic())
    assert st["active"] is None and st["active_reason"] == "day: health unknown: last answer 1.5 s ago"
    assert st["backends"]["day"]["health"]["state"] == "unknown"
    assert st["backends"]["day"]["health"]["age_s"] == 1.5


# --------------------------------------------------------------------------- who serves


def test_verdict_off_when_every_unit_is_known_stopped(world: Any) -> None:
    w = world
    w.units.set_stopped(w.unit("day"))
    s = sampler(w)
    st = to_status(s.sample_once(), w.clock.monotonic())
    assert (st["active"], st["running"], st["active_reason"]) == (OFF, [], None)


def test_verdict_unknown_before_the_first_sample(world: Any) -> None:
    v = verdict(sampler(world).snapshot(), world.clock.monotonic())
    assert v.active is None and v.reason == "nothing sampled yet"


def test_verdict_activating_unit_is_not_serving(world: Any) -> None:
    w = world
    w.units.behave(w.unit("day"), active_state="activating", sub_state="start")
    st = to_status(sampler(w).sample_once(), w.clock.monotonic())
    assert st["active"] is None and st["running"] == ["day"]
    assert st["active_reason"] == "day is activating (start), not serving"


def test_verdict_two_running_units_are_a_conflict_with_a_warning(world: Any) -> None:
    w = world
    w.units.set_running(w.unit("night"))
    st = to_status(sampler(w).sample_once(), w.clock.monotonic())
    assert st["active"] is None and st["running"] == ["day", "night"]
    assert st["warning"] == "more than one backend is running: day, night"


def test_verdict_unknown_when_systemd_cannot_be_asked_about_another_unit(world: Any) -> None:
    w = world
    real_state = w.units.state

    def state(unit: str) -> Any:
        if unit == w.unit("night"):
            raise SystemdError("systemd: load gpushift-night.service: no answer")
        return real_state(unit)

    w.units.state = state  # type: ignore[method-assign]
    st = to_status(sampler(w).sample_once(), w.clock.monotonic())
    assert st["active"] is None and "night: systemd: load gpushift-night.service" in st["active_reason"]
    assert st["backends"]["night"]["error"] == "systemd: load gpushift-night.service: no answer"
    assert st["backends"]["day"]["health"]["ok"] is True


# --------------------------------------------------------------------------- unhealthy_since


def test_sampler_unhealthy_since_counts_continuous_failure_while_active(world: Any) -> None:
    w = world
    s = sampler(w)
    assert s.sample_once().backends[0].unhealthy_since is None
    w.clock.advance(1)
    w.probe.set_health(w.url("day"), ok_after=None, before=503)
    first_failure = w.clock.monotonic()
    assert s.sample_once().backends[0].unhealthy_since == first_failure
    w.clock.advance(3)
    snap = s.sample_once()
    assert snap.backends[0].unhealthy_since == first_failure  # still the first failure
    st = to_status(snap, w.clock.monotonic())
    assert st["active"] is None and st["active_reason"].startswith("day: health failing for 3.0 s (HTTP 503")
    assert st["backends"]["day"]["health"]["failing_for_s"] == 3.0
    assert st["backends"]["day"]["health"]["state"] == "failing"
    # an OK answer clears it
    w.probe.set_health(w.url("day"), ok_after=0)
    assert s.sample_once().backends[0].unhealthy_since is None


def test_sampler_unhealthy_since_cleared_when_the_unit_stops_or_restarts(world: Any) -> None:
    w = world
    s = sampler(w)
    w.probe.set_health(w.url("day"), ok_after=None, before=503)
    assert s.sample_once().backends[0].unhealthy_since is not None
    w.units.set_stopped(w.unit("day"))
    snap = s.sample_once()
    assert snap.backends[0].unhealthy_since is None and snap.backends[0].health is None
    # a new main process loads its model again: its failures count from its own first answer
    w.units.set_running(w.unit("day"))
    s.sample_once()
    w.clock.advance(5)
    w.units.set_stopped(w.unit("day"))
    w.units.set_running(w.unit("day"))
    assert s.sample_once().backends[0].unhealthy_since == w.clock.monotonic()


def test_sampler_unhealthy_since_not_set_while_the_unit_is_still_activating(world: Any) -> None:
    w = world
    w.units.behave(w.unit("day"), active_state="activating", sub_state="start")
    w.probe.set_health(w.url("day"), ok_after=None, before=503)
    snap = sampler(w).sample_once()
    day = snap.backends[0]
    assert day.health is not None and day.health.value is not None and day.health.value.status == 503
    assert day.unhealthy_since is None  # loading the model is not a failure


# --------------------------------------------------------------------------- errors and hangs


def test_sampler_adapter_raising_becomes_that_figures_error_and_the_thread_goes_on(world: Any) -> None:
    w = world
    s = sampler(w, period_s=0.5, real_clock=True)
    broken = {"gpu": True}
    real_read = w.gpu.read

    def read(indices: Any = None, holders: bool = True) -> Any:
        if broken["gpu"]:
            raise RuntimeError("NVML library vanished")
        return real_read(indices, holders)

    w.gpu.read = read  # type: ignore[method-assign]
    s.start()
    try:
        snap = s.wait_next(5)
        assert snap is not None and snap.gpus is not None
        assert snap.gpus.value is None and snap.gpus.error == "RuntimeError: NVML library vanished"
        day = snap.backend("day")
        assert day is not None and day.health is not None and day.health.value is not None
        assert day.health.value.ok  # the other figures were read
        st = to_status(snap, snap.gpus.at)
        assert st["gpus"] == [
            {
                "error": "cannot read GPUs: RuntimeError: NVML library vanished",
                "state": "unknown",
                "age_s": 0.0,
            }
        ]
        broken["gpu"] = False
        later = s.wait_next(5)
        assert later is not None and s.running
        later = s.wait_next(5)  # a cycle that started after the repair
        assert later is not None and later.gpus is not None and later.gpus.error is None
    finally:
        assert s.stop()


def test_sampler_hung_read_costs_only_its_own_figure_and_is_not_started_twice(world: Any) -> None:
    w = world
    s = sampler(w, period_s=0.5, real_clock=True)
    release = threading.Event()
    calls: list[str] = []
    real_health = w.probe.health

    def health(url: str, timeout_s: float = 2.0, expect_cgroup: str | None = None) -> Health:
        calls.append(url)
        if len(calls) > 1:
            release.wait(20)  # hangs (past its own timeout) until the test lets go
        return real_health(url, timeout_s, expect_cgroup)

    w.probe.health = health  # type: ignore[method-assign]
    s.start()
    try:
        assert s.wait_next(5) is not None  # the first answer: OK
        t0 = time.monotonic()
        for _ in range(6):  # 3 s of cycles while the second health read hangs
            assert s.wait_next(5) is not None
        assert time.monotonic() - t0 < 5  # cycles kept their pace
        snap = s.snapshot()
        assert snap.gpus is not None and snap.gpus.age(time.monotonic()) < 1.0  # other figures stay fresh
        st = to_status(snap, time.monotonic())
        assert st["backends"]["day"]["health"]["state"] == "unknown"  # never the old OK
        assert st["active"] is None and "health unknown" in st["active_reason"]
        assert calls.count(w.url("day")) == 2  # the hung lane was not started again
    finally:
        release.set()
        assert s.stop()


def test_sampler_snapshot_does_not_wait_for_a_cycle_in_progress(world: Any) -> None:
    w = world
    s = sampler(w, period_s=30)  # a long period: the next cycle waits up to 12 s for its unit lanes
    first = s.sample_once()
    entered, release = threading.Event(), threading.Event()
    real_state = w.units.state

    def state(unit: str) -> Any:
        entered.set()
        release.wait(20)
        return real_state(unit)

    w.units.state = state  # type: ignore[method-assign]
    t = threading.Thread(target=s.sample_once)
    t.start()
    try:
        assert entered.wait(5)
        t0 = time.monotonic()
        assert s.snapshot() is first
        assert time.monotonic() - t0 < 0.5
    finally:
        release.set()
        t.join(20)


def test_sampler_stop_ends_and_joins_the_thread(world: Any) -> None:
    w = world
    s = sampler(w, period_s=0.5, real_clock=True)
    s.start()
    assert s.wait_next(5) is not None
    assert s.stop(5) is True
    assert not s.running
    seq = s.snapshot().seq
    assert s.wait_next(1.0) is None and s.snapshot().seq == seq  # no cycle after the stop


def test_sampler_health_timeout_stays_inside_the_period(world: Any) -> None:
    assert [health_timeout_s(p) for p in (0.5, 2.0, 60.0)] == [0.2, 0.8, 2.0]
    w = world
    seen: list[float] = []
    real_health = w.probe.health

    def health(url: str, timeout_s: float = 2.0, expect_cgroup: str | None = None) -> Health:
        seen.append(timeout_s)
        return real_health(url, timeout_s, expect_cgroup)

    w.probe.health = health  # type: ignore[method-assign]
    sampler(w, period_s=1.0).sample_once()
    assert seen == [0.4]


def test_sampler_reconfigure_follows_the_new_backends(world: Any) -> None:
    from gpushift.config.schema import parse

    w = world
    s = sampler(w)
    s.sample_once()
    only_day = parse(w.toml.split("[backends.night]")[0], "/etc/gpushift/unit-test.toml")
    s.reconfigure(only_day)
    snap = s.sample_once()
    assert [b.name for b in snap.backends] == ["day"]
    assert isinstance(snap, Sample) and snap.period_s == PERIOD


def test_sampler_reads_every_unit_in_one_call_and_its_failure_is_each_units_error(world: Any) -> None:
    w = world
    calls: list[list[str]] = []
    real_states = w.units.states
    broken = {"on": False}

    def states(units: list[str]) -> Any:
        calls.append(list(units))
        if broken["on"]:
            raise SystemdError("systemd: list: no answer")
        return real_states(units)

    w.units.states = states  # type: ignore[method-assign]
    s = sampler(w)
    s.sample_once()
    assert calls == [[w.unit("day"), w.unit("night")]]  # one call a cycle for every backend unit
    broken["on"] = True
    w.clock.advance(1)
    st = to_status(s.sample_once(), w.clock.monotonic())
    assert st["backends"]["day"]["error"] == "systemd: list: no answer"
    assert st["backends"]["night"]["error"] == "systemd: list: no answer"
    assert st["active"] is None and "systemd could not be asked" in st["active_reason"]
    assert st["gpus"][0]["used_mib"] == 14500.0  # the other figures were read


# --------------------------------------------------------------------------- GPU holders


def holder_pids(snap: Sample, gpu: int) -> list[int]:
    assert snap.gpus is not None and snap.gpus.value is not None
    return [h.pid for h in snap.gpus.value[gpu].holders]


def test_sampler_names_gpu_holders_again_when_memory_moves_and_now_and_then(world: Any) -> None:
    w = world
    s = sampler(w)
    day_pid = w.units.units[w.unit("day")].main_pid
    s.sample_once()
    assert w.gpu.holder_reads == 1
    w.clock.advance(PERIOD)
    snap = s.sample_once()
    # Memory did not move: read without the /proc scan, the holders carried with their own age.
    assert w.gpu.holder_reads == 1 and holder_pids(snap, 0) == [day_pid]
    st = to_status(snap, w.clock.monotonic())
    assert st["gpus"][0]["used_mib"] == 14500.0 and st["gpus"][0]["age_s"] == 0.0
    assert st["gpus"][0]["holders_age_s"] == PERIOD and st["gpus"][0]["holders"][0]["pid"] == day_pid
    # Somebody takes memory: named in that very cycle.
    w.gpu.add_foreign(0, pid=777, mib=HOLDERS_MOVE_MIB + 1)
    w.clock.advance(PERIOD)
    snap = s.sample_once()
    assert w.gpu.holder_reads == 2 and 777 in holder_pids(snap, 0)
    assert to_status(snap, w.clock.monotonic())["gpus"][0]["holders_age_s"] == 0.0
    # ... and gives it back: the names follow.
    w.gpu.remove_foreign(777)
    w.clock.advance(PERIOD)
    assert holder_pids(s.sample_once(), 0) == [day_pid] and w.gpu.holder_reads == 3
    # A process that opens the GPU without taking memory is named at the latest after this long.
    w.gpu.add_foreign(1, pid=778, mib=0)
    for _ in range(HOLDERS_EVERY_PERIODS - 1):
        w.clock.advance(PERIOD)
        assert 778 not in holder_pids(s.sample_once(), 1)
    w.clock.advance(PERIOD)
    assert 778 in holder_pids(s.sample_once(), 1) and w.gpu.holder_reads == 4


def test_sampler_names_gpu_holders_again_when_a_backend_was_relaunched_with_the_same_memory(
    world: Any,
) -> None:
    w = world
    s = sampler(w)
    old_pid = w.units.units[w.unit("day")].main_pid
    assert holder_pids(s.sample_once(), 0) == [old_pid]
    w.units.set_stopped(w.unit("day"))  # restarted between two cycles: same memory, another process
    new_pid = w.units.set_running(w.unit("day"))
    w.clock.advance(PERIOD)
    snap = s.sample_once()
    assert new_pid != old_pid and holder_pids(snap, 0) == [new_pid] and holder_pids(snap, 1) == [new_pid]
    assert to_status(snap, w.clock.monotonic())["gpus"][0]["holders_age_s"] == 0.0
    w.clock.advance(PERIOD)
    reads = w.gpu.holder_reads
    assert holder_pids(s.sample_once(), 0) == [new_pid] and w.gpu.holder_reads == reads  # settled again


def test_sampler_names_holders_on_every_read_of_the_simulated_provider_and_after_a_failure(
    world: Any,
) -> None:
    w = world
    w.gpu.simulated = True  # its memory IS its holders: every read scans anyway
    s = sampler(w)
    for _ in range(3):
        s.sample_once()
        w.clock.advance(PERIOD)
    assert w.gpu.holder_reads == 3
    w.gpu.simulated = False
    w.gpu.incomplete = {0: (4242,)}  # not every process could be looked at: look again every time
    s = sampler(w)
    for _ in range(3):
        s.sample_once()
        w.clock.advance(PERIOD)
    assert w.gpu.holder_reads == 6
    w.gpu.incomplete = {}
    s.sample_once()
    assert w.gpu.holder_reads == 7
    w.gpu.error = "NVML: gone"
    w.clock.advance(PERIOD)
    assert to_status(s.sample_once(), w.clock.monotonic())["gpus"][0]["state"] == "unknown"
    w.gpu.error = None
    w.clock.advance(PERIOD)
    s.sample_once()  # the GPUs are back: their holders are named at once
    assert w.gpu.holder_reads == 9


def test_sampler_lanes_are_joined_by_the_cycle_alone(world: Any, monkeypatch: Any) -> None:
    """Two threads joining one thread race inside CPython's Thread.join (python/cpython#116372:
    ``AssertionError`` or ``RuntimeError: release unlocked lock`` out of a join): the soak saw both
    fail a sampler cycle when the GPU lane joined the units lane while the cycle did.  Only the
    thread running the cycle may join, or ask ``is_alive`` of, a lane."""
    callers: list[tuple[str, str]] = []
    join, is_alive = threading.Thread.join, threading.Thread.is_alive

    def record(t: threading.Thread) -> None:
        if t.name.startswith("sampler-"):
            callers.append((threading.current_thread().name, t.name))

    def joining(self: threading.Thread, timeout: float | None = None) -> None:
        record(self)
        join(self, timeout)

    def asking(self: threading.Thread) -> bool:
        record(self)
        return is_alive(self)

    monkeypatch.setattr(threading.Thread, "join", joining)
    monkeypatch.setattr(threading.Thread, "is_alive", asking)
    s = sampler(world)
    for _ in range(3):  # the first names the holders; the next ones ask the units lane for main PIDs
        s.sample_once()
        world.clock.advance(PERIOD)
    assert any(lane == "sampler-units" for _, lane in callers)
    assert {who for who, _ in callers} == {threading.current_thread().name}, sorted(set(callers))


def test_sampler_each_instance_has_its_own_unhealthy_since_cleared_by_a_new_process(make_world: Any) -> None:
    from tests.support.instances import N0, N1, with_instances

    w = with_instances(make_world())
    w.boot("day")
    assert w.switch("night").ok
    s = sampler(w)
    assert s.sample_once().backend("night").instance_unhealthy == ()  # type: ignore[union-attr]
    w.probe.hang("http://127.0.0.1:18082/health")  # instance 1 stops answering, its unit active
    hung_at = w.clock.monotonic()
    s.sample_once()
    w.clock.advance(7)
    night = s.sample_once().backend("night")
    assert night is not None and night.instance_unhealthy == ((N1, hung_at),)  # N0 answers: not listed
    w.units.set_stopped(N1)
    w.units.set_running(N1)  # a new process answers again
    assert s.sample_once().backend("night").instance_unhealthy == ()  # type: ignore[union-attr]
    assert w.units.is_running(N0)


@pytest.mark.parametrize(("min_ready", "serves"), [(1, True), (2, False)])
def test_sampler_verdict_counts_the_instances_that_answer_against_min_ready(
    make_world: Any, min_ready: int, serves: bool
) -> None:
    from tests.support.instances import with_instances

    w = with_instances(make_world(), min_ready=min_ready)
    w.boot("day")
    assert w.switch("night").ok
    s = sampler(w)
    assert verdict(s.sample_once(), w.clock.monotonic()).active == "night"
    w.probe.hang("http://127.0.0.1:18081/health")  # the first instance (the representative) hangs
    v = verdict(s.sample_once(), w.clock.monotonic())
    assert v.active == ("night" if serves else None), v
    if not serves:
        assert v.reason == f"night: 1 of 2 instances answer their health ({min_ready} needed)"

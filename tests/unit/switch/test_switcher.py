"""The switch state machine against stateful fakes: every ordering rule, timeout and failure policy.

The World (tests/support/fakes.py) has two backends: "day" on GPUs 0 and 1 (14500 MiB each) and
"night" on GPU 1 (6800 MiB); poll interval 0.5 s, release_timeout_s 20, start timeouts 60 (day)
and 30 (night), drain_timeout_s 10 (day).  Time is fake: it moves only when the switcher sleeps, so
timeouts are asserted exactly, and a test of a 30 s timeout takes milliseconds.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest

from gpushift.errors import (
    NothingToCancel,
    SwitchFailed,
    SwitchInProgress,
    SystemdError,
    UnknownBackend,
    VramNotReleased,
)
from gpushift.values import OFF, Caller, Outcome, Phase, VersionInfo


def _gate_reads(world: Any, after: int, before: int, gpu: int) -> list[float | None]:
    """used_mib of ``gpu`` in every GPU read between two log positions."""
    out = []
    for e in world.log.entries[after + 1 : before]:
        if e.kind == "gpu.read" and gpu in e.args[0]:
            out.append(e.args[1][e.args[0].index(gpu)])
    return out


def _event_time(world: Any, ticket: str, phase: Phase, nth: int = 0) -> float:
    evs = [e for e in world.events_of(ticket) if e.kind == "progress" and e.phase == phase.value]
    assert len(evs) > nth, f"no {phase.value} progress event #{nth}: {world.phases(ticket)}"
    return float(evs[nth].elapsed_s)


# --------------------------------------------------------------------------- the happy path


def test_switcher_switch_stops_current_and_starts_target(world: Any) -> None:
    res = world.switch("night", reason="evening", user="alice")
    assert res.ok is True, res
    assert res.outcome == Outcome.OK.value
    assert (res.from_backend, res.to_backend) == ("day", "night")
    assert world.running() == ["night"]
    assert world.unit_calls() == [("stop", "day"), ("start", "night")]
    rec = world.record(res)
    assert rec.outcome == Outcome.OK.value
    assert (rec.from_backend, rec.to_backend) == ("day", "night")
    assert (rec.requested_by, rec.uid, rec.reason, rec.trigger) == ("alice", 1000, "evening", "manual")
    assert rec.finished_at is not None and rec.finished_at >= rec.started_at
    assert rec.failed_phase is None
    assert world.switcher.current() is None


def test_switcher_intent_row_is_written_before_the_first_stop(world: Any) -> None:
    world.probe.set_in_flight("day", 2)
    res = world.switch("night")
    begin = world.log.first("ledger.begin")
    assert begin >= 0, world.log.kinds()
    assert begin < world.log.first("units.stop")
    # drain comes after the intent too: the row exists before anything is done to the backend
    assert begin < world.log.first("probe.in_flight")
    intent = world.ledger.intents[res.ledger_id]
    assert intent.outcome == Outcome.PENDING.value
    assert intent.finished_at is None
    assert (intent.from_backend, intent.to_backend) == ("day", "night")
    assert intent.argv_configured, "the intent row already names the command about to be launched"
    # and exactly one row for the switch, finished once
    assert list(world.ledger.rows) == [res.ledger_id]
    assert [r.id for r in world.ledger.finishes] == [res.ledger_id]


def test_switcher_gate_is_read_only_after_the_stop_job_finished(world: Any) -> None:
    world.units.behave(world.unit("day"), stop_duration_s=4.0)
    res = world.switch("night")
    assert res.ok, res
    stop, stopped = world.log.first("units.stop", world.unit("day")), world.log.first("units.stopped")
    assert 0 <= stop < stopped
    assert "gpu.read" not in [e.kind for e in world.log.entries[stop:stopped]]
    assert world.log.first("gpu.read") < stop  # preflight read, before the stop
    assert any(e.kind == "gpu.read" for e in world.log.entries[stopped:])
    assert world.record(res).durations_s["stop"] == pytest.approx(4.0)


def test_switcher_gate_polls_until_vram_released_then_starts(make_world: Any) -> None:
    world = make_world(drain_reads=3)
    world.boot("day")
    res = world.switch("night")
    assert res.ok, res
    stopped = world.log.first("units.stopped", world.unit("day"))
    start = world.log.first("units.start", world.unit("night"))
    assert 0 <= stopped < start
    used = _gate_reads(world, stopped, start, gpu=1)
    # three reads still see day's 14500 MiB on GPU 1, the fourth sees it gone, and only then: start
    assert used == [14500.0, 14500.0, 14500.0, 0.0]
    rec = world.record(res)
    # three waits of the fast cadence (the gate polls memory only, every fast_poll_interval_s)
    assert rec.durations_s["release"] == pytest.approx(3 * world.config.daemon.fast_poll_interval_s)
    assert [r["used_mib"] for r in rec.vram["released"]] == [0.0]
    assert [r["used_mib"] for r in rec.vram["before"]] == [14500.0]


def test_switcher_gate_watches_only_the_target_gpus(make_world: Any) -> None:
    world = make_world(drain_reads=2)
    world.boot("day")
    world.switch("night")
    stopped = world.log.first("units.stopped")
    start = world.log.first("units.start")
    gate_reads = [e.args[0] for e in world.log.entries[stopped:start] if e.kind == "gpu.read"]
    assert gate_reads and all(indices == (1,) for indices in gate_reads), gate_reads


# --------------------------------------------------------------------------- preflight refusals


def test_switcher_foreign_holder_on_target_gpu_refuses_and_touches_nothing(world: Any) -> None:
    world.gpu.add_foreign(1, pid=4242, mib=9318, command="python", user="bob")
    res = world.switch("night")
    assert res.ok is False
    assert res.outcome == Outcome.REFUSED.value
    assert res.failed_phase == Phase.PREFLIGHT.value
    # scripts can tell "another job holds the GPU" from other refusals (CLI exit 8)
    assert res.error == VramNotReleased.dbus_name()
    assert "pid 4242" in res.message and "python" in res.message and "bob" in res.message
    assert world.units.calls == []
    assert world.running() == ["day"]
    rec = world.record(res)
    assert rec.outcome == Outcome.REFUSED.value
    assert "pid 4242" in (rec.message or "") and "python" in (rec.message or "")
    assert len(world.ledger.rows) == 1


def _orphan_until(world: Any, gpu: int, mib: float, until_s: float | None) -> None:
    """``mib`` on ``gpu`` that no process holds (a backend that has just ended), gone once the fake
    clock has run ``until_s`` (None: never)."""
    world.gpu.baseline_mib[gpu] = mib
    read = world.gpu.read

    def reading(*args: Any, **kw: Any) -> Any:
        if until_s is not None and world.clock.elapsed >= until_s:
            world.gpu.baseline_mib.pop(gpu, None)
        return read(*args, **kw)

    world.gpu.read = reading


def test_switcher_memory_no_process_holds_is_waited_for_then_the_switch_runs(world: Any) -> None:
    # A switch right after another: the stopped backend's memory is still being freed by the driver.
    _orphan_until(world, 1, 4000.0, until_s=world.clock.elapsed + 2.0)
    ticket = world.request("night")
    res = world.wait(ticket)
    assert res.ok, res
    assert world.running() == ["night"]
    said = [e.detail for e in world.events_of(ticket) if e.kind == "progress" and e.phase == "preflight"]
    assert any("no process has the device open" in m and "waiting up to 10s" in m for m in said), said
    assert [g["used_mib"] for g in world.record(res).vram["before"]] == [14500.0]  # day's own, no orphan


def test_switcher_memory_no_process_holds_refuses_after_the_orphan_wait(world: Any) -> None:
    _orphan_until(world, 1, 4000.0, until_s=None)
    t0 = world.clock.elapsed
    res = world.switch("night")
    assert res.outcome == Outcome.REFUSED.value and res.error == VramNotReleased.dbus_name()
    assert "no process has the device open" in res.message
    assert 10.0 <= world.clock.elapsed - t0 < 11.0  # gpu.orphan_wait_s, then the refusal
    assert world.units.calls == [] and world.running() == ["day"]


def test_switcher_memory_a_live_process_holds_refuses_without_waiting(world: Any) -> None:
    world.gpu.add_foreign(1, pid=4242, mib=9318, command="python", user="bob")
    t0 = world.clock.elapsed
    res = world.switch("night")
    assert res.outcome == Outcome.REFUSED.value and "pid 4242" in res.message
    assert world.clock.elapsed - t0 < 1.0


def test_switcher_foreign_holder_on_gpu_the_target_does_not_use_does_not_block(world: Any) -> None:
    world.gpu.add_foreign(0, pid=4242, mib=9318)  # night uses GPU 1 only
    res = world.switch("night")
    assert res.ok, res
    assert world.running() == ["night"]


def test_switcher_device_open_without_memory_does_not_block(world: Any) -> None:
    world.gpu.add_foreign(1, pid=812, mib=0, command="nvidia-persistenced", user="root")
    world.gpu.add_foreign(1, pid=813, mib=0, command="nvidia-smi", user="carol")
    res = world.switch("night")
    assert res.ok, res
    assert world.running() == ["night"]


def test_switcher_own_memory_not_attributed_per_process_does_not_refuse(make_world: Any) -> None:
    world = make_world()
    # NVML may not report per-process memory for the backend: its share cannot be attributed
    world.gpu.allocate(world.unit("day"), (0, 1), 14500, report_per_process=False)
    world.boot("day")
    res = world.switch("night")
    assert res.ok, res


def test_switcher_unknown_reading_in_preflight_refuses(world: Any) -> None:
    world.gpu.error = "NVML_ERROR_UNKNOWN: Failed to initialize NVML"
    res = world.switch("night")
    assert res.outcome == Outcome.REFUSED.value
    assert "unknown" in res.message and "Failed to initialize NVML" in res.message
    assert world.units.calls == []
    assert world.running() == ["day"]


def test_switcher_incomplete_holder_list_decides_nothing_memory_does(world: Any) -> None:
    # A process whose open files cannot be read is named, but the gate decides on memory: day's
    # memory is all there is, so the switch goes ahead and the gate opens once day's VRAM is back.
    world.gpu.incomplete[1] = (31337,)
    res = world.switch("night")
    assert res.ok, res
    assert world.running() == ["night"]


def test_switcher_target_unit_not_loaded_refuses(world: Any) -> None:
    world.units.behave(world.unit("night"), load_state="not-found")
    res = world.switch("night")
    assert res.outcome == Outcome.REFUSED.value
    assert world.unit("night") in res.message and "not-found" in res.message
    assert world.units.calls == []
    assert world.running() == ["day"]


# --------------------------------------------------------------------------- the VRAM gate after the stop


def test_switcher_unknown_reading_after_stop_keeps_gate_closed(world: Any) -> None:
    def nvml_dies_at_stop(e: Any) -> None:
        if e.kind == "progress" and e.phase == Phase.STOP.value:
            world.gpu.errors[1] = "NVML_ERROR_GPU_IS_LOST"

    world.switcher.listeners.append(nvml_dies_at_stop)
    res = world.switch("night")
    assert res.ok is False
    assert res.outcome == Outcome.FAILED.value
    assert res.failed_phase == Phase.RELEASE.value
    assert res.error == VramNotReleased.dbus_name()
    assert "unknown" in res.message and "NVML_ERROR_GPU_IS_LOST" in res.message
    # fail closed: neither the target nor the rollback was started on an unknown GPU
    assert world.unit_calls() == [("stop", "day")]
    assert world.running() == []
    # it waited release_timeout_s for the target, then again for the way back
    assert world.clock.elapsed >= 2 * 20
    assert world.record(res).outcome == Outcome.FAILED.value


def test_switcher_gate_timeout_with_orphan_nothing_started(world: Any) -> None:
    # the stopped backend leaves a child outside its cgroup holding GPU 1 (vllm#55510-like)
    world.gpu.orphan_on_stop(world.unit("day"), gpu=1, pid=5151, mib=9318, command="python", user="svc")
    res = world.switch("night")
    assert res.ok is False
    assert res.outcome == Outcome.FAILED.value
    assert res.failed_phase == Phase.RELEASE.value
    assert res.error == VramNotReleased.dbus_name()
    assert "pid 5151" in res.message and "python" in res.message
    # the rollback to day watches GPU 1 as well: it cannot pass the gate, so nothing is started
    assert world.unit_calls() == [("stop", "day")]
    assert world.running() == []
    rec = world.record(res)
    assert rec.outcome == Outcome.FAILED.value
    assert "pid 5151" in (rec.message or "")
    assert "rollback" in rec.extra and "error" in rec.extra["rollback"]
    # the gate waited its full release_timeout_s for the target, not less
    t_release = _event_time(world, res.ticket, Phase.RELEASE)
    t_rollback = _event_time(world, res.ticket, Phase.ROLLBACK)
    assert t_rollback - t_release >= 20


def test_switcher_rollback_waits_for_the_target_vram_to_drain(make_world: Any) -> None:
    world = make_world(drain_reads=3)
    world.boot("day")
    world.probe.set_health(world.url("night"), ok_after=None, before=503)
    res = world.switch("night")
    assert res.outcome == Outcome.ROLLED_BACK.value, res
    stop_night = world.log.first("units.stopped", world.unit("night"))
    start_day = world.log.first("units.start", world.unit("day"))
    assert 0 <= stop_night < start_day
    used = _gate_reads(world, stop_night, start_day, gpu=1)
    assert used[-1] == 0.0 and all(u and u > 256 for u in used[:-1]), used
    assert len(used) == 4


# --------------------------------------------------------------------------- readiness and failure policy


def test_switcher_target_exiting_at_once_is_noticed_at_next_poll_and_rolled_back(world: Any) -> None:
    world.units.behave(world.unit("night"), crash_after_s=0.0, crash_result="exit-code")
    res = world.switch("night")
    assert res.ok is False
    assert res.outcome == Outcome.ROLLED_BACK.value
    assert res.failed_phase == Phase.READY.value
    assert res.systemd_result == "exit-code"
    assert world.running() == ["day"]
    assert world.unit_calls() == [("stop", "day"), ("start", "night"), ("start", "day")]
    t_start = _event_time(world, res.ticket, Phase.START)
    t_rollback = _event_time(world, res.ticket, Phase.ROLLBACK)
    assert t_rollback - t_start <= 0.5  # one poll interval, not start_timeout_s (30)
    rec = world.record(res)
    assert (rec.outcome, rec.failed_phase, rec.systemd_result) == ("rolled_back", "ready", "exit-code")
    assert rec.extra["rollback"].get("ok") is True


def test_switcher_target_crashing_while_loading_is_noticed_within_one_poll(world: Any) -> None:
    world.units.behave(world.unit("night"), crash_after_s=3.0, crash_result="signal")
    world.probe.set_health(world.url("night"), ok_after=None, before=503)
    res = world.switch("night")
    assert res.outcome == Outcome.ROLLED_BACK.value
    assert res.systemd_result == "signal"
    t_ready = _event_time(world, res.ticket, Phase.READY)
    t_rollback = _event_time(world, res.ticket, Phase.ROLLBACK)
    assert 3.0 <= t_rollback - t_ready <= 3.5


def test_switcher_target_never_healthy_rolls_back_after_start_timeout(world: Any) -> None:
    world.probe.set_health(world.url("night"), ok_after=None, before=503)
    res = world.switch("night")
    assert res.ok is False
    assert res.outcome == Outcome.ROLLED_BACK.value
    assert res.failed_phase == Phase.READY.value
    assert res.error == SwitchFailed.dbus_name()
    assert "30s" in res.message and "503" in res.message
    t_ready = _event_time(world, res.ticket, Phase.READY)
    t_rollback = _event_time(world, res.ticket, Phase.ROLLBACK)
    assert 30.0 <= t_rollback - t_ready <= 30.5
    # the half-started target is stopped before the previous backend comes back
    assert world.unit_calls() == [("stop", "day"), ("start", "night"), ("stop", "night"), ("start", "day")]
    assert world.running() == ["day"]
    assert world.record(res).outcome == Outcome.ROLLED_BACK.value


def test_switcher_target_refusing_connections_times_out_too(world: Any) -> None:
    world.probe.set_health(world.url("night"), ok_after=None, before="refuse")
    res = world.switch("night")
    assert res.outcome == Outcome.ROLLED_BACK.value
    assert "30s" in res.message


def test_switcher_target_healthy_after_some_polls_succeeds(world: Any) -> None:
    world.probe.set_health(world.url("night"), ok_after=6, before=503)
    res = world.switch("night")
    assert res.ok, res
    # a backend ready within its first seconds is polled at the fast cadence
    assert world.record(res).durations_s["ready"] == pytest.approx(
        6 * world.config.daemon.fast_poll_interval_s
    )


def test_switcher_slow_loader_is_polled_fast_at_first_then_with_back_off(make_world: Any) -> None:
    world = make_world(night_start_timeout_s=120, on_failure="stay")
    world.boot("day")
    world.probe.set_health(world.url("night"), ok_after=None, before=503)  # loads "forever"
    res = world.switch("night")
    assert res.failed_phase == Phase.READY.value
    polls = [e.t for e in world.log.of("probe.health")]
    t0 = polls[0]
    d = world.config.daemon
    early = [t for t in polls if t - t0 < 1.0]
    late = [t for t in polls if t - t0 >= 60.0]
    assert len(early) >= 0.9 / d.fast_poll_interval_s  # the first second: the fast cadence
    # a minute in, no faster than poll_interval_s (a 5-minute vLLM load is not hammered)
    assert len(late) <= (polls[-1] - t0 - 60.0) / d.poll_interval_s + 2
    gaps = [b - a for a, b in zip(polls, polls[1:], strict=False)]
    assert max(gaps) <= d.poll_interval_s + 1e-9 and gaps == sorted(gaps)  # it only slows down


def test_switcher_stay_policy_leaves_everything_stopped(make_world: Any) -> None:
    world = make_world(on_failure="stay")
    world.boot("day")
    world.probe.set_health(world.url("night"), ok_after=None, before=503)
    res = world.switch("night")
    assert res.ok is False
    assert res.outcome == Outcome.FAILED.value
    assert res.failed_phase == Phase.READY.value
    assert "stay" in res.message
    assert world.running() == []
    assert world.unit_calls() == [("stop", "day"), ("start", "night"), ("stop", "night")]
    assert world.record(res).outcome == Outcome.FAILED.value


def test_switcher_start_job_failure_rolls_back_with_systemd_result(world: Any) -> None:
    world.units.behave(world.unit("night"), start_job_result="failed", start_failure_result="exit-code")
    res = world.switch("night")
    assert res.outcome == Outcome.ROLLED_BACK.value
    assert res.failed_phase == Phase.START.value
    assert res.systemd_result == "exit-code"
    assert "failed" in res.message
    assert world.running() == ["day"]


def test_switcher_resets_a_start_limited_unit_before_starting(world: Any) -> None:
    world.units.set_failed(world.unit("night"), "start-limit")
    res = world.switch("night")
    assert res.ok, res
    calls = world.units.calls
    assert calls.index(("reset_failed", world.unit("night"))) < calls.index(("start", world.unit("night")))


@pytest.mark.parametrize(
    "behaviour",
    [
        {"stop_leaves_running": True, "stop_job_result": "done"},
        {"stop_leaves_running": True, "stop_job_result": "timeout"},
        {"stop_job_result": "failed"},
    ],
)
def test_switcher_failed_stop_starts_nothing(world: Any, behaviour: dict[str, Any]) -> None:
    world.units.behave(world.unit("day"), **behaviour)
    res = world.switch("night")
    assert res.ok is False
    assert res.outcome == Outcome.FAILED.value
    assert res.failed_phase == Phase.STOP.value
    assert world.unit("day") in res.message
    assert world.unit_calls() == [("stop", "day")]
    assert ("start", world.unit("night")) not in world.units.calls


def test_switcher_failure_with_nothing_running_before_leaves_all_stopped(make_world: Any) -> None:
    world = make_world()
    world.boot(None)
    world.probe.set_health(world.url("night"), ok_after=None)
    res = world.switch("night")
    assert res.outcome == Outcome.FAILED.value
    assert world.running() == []
    assert world.unit_calls() == [("start", "night"), ("stop", "night")]


def test_switcher_rollback_whose_previous_backend_fails_too_says_nothing_serves(world: Any) -> None:
    world.probe.set_health(world.url("night"), ok_after=None)

    def day_breaks_on_the_way_back(e: Any) -> None:
        if e.kind == "progress" and e.phase == Phase.ROLLBACK.value:
            world.units.behave(world.unit("day"), crash_after_s=0.0, crash_result="core-dump")

    world.switcher.listeners.append(day_breaks_on_the_way_back)
    res = world.switch("night")
    assert res.outcome == Outcome.FAILED.value
    assert "nothing is serving" in res.message
    assert "core-dump" in res.message
    assert world.running() == []
    assert world.unit_calls() == [("stop", "day"), ("start", "night"), ("stop", "night"), ("start", "day")]


# --------------------------------------------------------------------------- requests


def test_switcher_switch_to_active_backend_is_ok_without_row_or_unit_calls(world: Any) -> None:
    res = world.switch("day")
    assert res.ok is True
    assert res.already is True
    assert res.outcome == Outcome.OK.value
    assert "day" in res.message and "already" in res.message
    assert world.ledger.rows == {}
    assert world.units.calls == []
    assert world.running() == ["day"]


def test_switcher_off_when_nothing_runs_is_already_done(make_world: Any) -> None:
    world = make_world()
    world.boot(None)
    res = world.switch(OFF)
    assert res.ok is True and res.already is True
    assert world.ledger.rows == {} and world.units.calls == []


@pytest.mark.parametrize(("active", "gpus"), [("day", (0, 1)), ("night", (1,))])
def test_switcher_off_stops_active_and_gates_its_gpus(
    make_world: Any, active: str, gpus: tuple[int, ...]
) -> None:
    world = make_world(drain_reads=2)
    world.boot(active)
    res = world.switch(OFF)
    assert res.ok, res
    assert world.running() == []
    assert world.unit_calls() == [("stop", active)]
    stopped = world.log.first("units.stopped")
    gate = [e for e in world.log.entries[stopped:] if e.kind == "gpu.read"]
    assert [e.args[0] for e in gate] == [gpus] * 3  # two reads still held, the third released
    assert all(u == 0.0 for u in gate[-1].args[1])
    rec = world.record(res)
    assert (rec.from_backend, rec.to_backend, rec.outcome) == (active, OFF, Outcome.OK.value)


def test_switcher_off_with_orphan_fails_naming_it(world: Any) -> None:
    world.gpu.orphan_on_stop(world.unit("day"), gpu=0, pid=6161, mib=2048, command="torchrun", user="dave")
    res = world.switch(OFF)
    assert res.ok is False
    assert res.failed_phase == Phase.RELEASE.value
    assert "pid 6161" in res.message and "torchrun" in res.message


def test_switcher_unknown_backend_touches_nothing(world: Any) -> None:
    with pytest.raises(UnknownBackend) as exc:
        world.request("dusk")
    msg = str(exc.value)
    assert "dusk" in msg and "day" in msg and "night" in msg
    assert world.log.entries == []
    assert world.units.state_reads == [] and world.units.calls == []
    assert world.ledger.rows == {}
    assert world.switcher.current() is None


def test_switcher_second_request_while_one_runs_is_refused(world: Any) -> None:
    held = threading.Event()
    day = world.units.behave(world.unit("day"), hold_stop=held)
    first = world.request("night", user="alice")
    try:
        assert day.stop_entered.wait(10), "the first switch never reached its stop"
        with pytest.raises(SwitchInProgress) as exc:
            world.request("day", user="bob")
        msg = str(exc.value)
        assert first in msg and "night" in msg and "alice" in msg
        with pytest.raises(SwitchInProgress):
            world.request(OFF, user="bob")
        cur = world.switcher.current()
        assert cur is not None and cur.ticket == first and cur.phase == Phase.STOP.value
    finally:
        held.set()
    res = world.wait(first)
    assert res.ok, res
    assert len(world.ledger.rows) == 1
    assert world.unit_calls() == [("stop", "day"), ("start", "night")]
    assert {e.ticket for e in world.events} == {first}


def test_switcher_slot_is_free_again_after_a_failed_switch(world: Any) -> None:
    world.probe.set_health(world.url("night"), ok_after=None)
    assert world.switch("night").ok is False
    world.probe.set_health(world.url("night"), ok_after=0)
    res = world.switch("night")
    assert res.ok, res
    assert world.running() == ["night"]


def test_switcher_preflight_asks_systemd_now_not_a_cache(world: Any) -> None:
    # somebody ran `systemctl stop` on day after gpushift started day
    world.units.set_stopped(world.unit("day"))
    res = world.switch("night")
    assert res.ok, res
    assert res.from_backend is None
    assert world.unit_calls() == [("start", "night")]
    # and somebody ran `systemctl start night`... then asking for night is already done
    res2 = world.switch("night")
    assert res2.already is True


@pytest.mark.parametrize(
    ("policy", "outcome", "running"), [("rollback", "rolled_back", ["day"]), ("stay", "failed", [])]
)
def test_switcher_cancel_during_readiness_applies_failure_policy(
    make_world: Any, policy: str, outcome: str, running: list[str]
) -> None:
    world = make_world(on_failure=policy)
    world.boot("day")
    world.probe.set_health(world.url("night"), ok_after=None, before=503)
    cancelled: list[str] = []

    def cancel_when_loading(e: Any) -> None:
        if e.kind == "progress" and e.phase == Phase.READY.value and not cancelled:
            cancelled.append(world.switcher.cancel(Caller(uid=1001, user="carol")))

    world.switcher.listeners.append(cancel_when_loading)
    res = world.switch("night")
    assert cancelled == [res.ticket]
    assert res.ok is False
    assert res.outcome == outcome
    assert res.failed_phase == Phase.READY.value
    assert "cancelled by carol" in res.message
    assert world.running() == running
    # noticed at the next poll, not after start_timeout_s
    t_ready = _event_time(world, res.ticket, Phase.READY)
    t_rollback = _event_time(world, res.ticket, Phase.ROLLBACK) if policy == "rollback" else None
    if t_rollback is not None:
        assert t_rollback - t_ready <= 0.5


# --------------------------------------------------------------------------- drain


def test_switcher_drain_waits_for_in_flight_requests(world: Any) -> None:
    world.probe.set_in_flight("day", 3, step=1)
    res = world.switch("night")
    assert res.ok, res
    polls = world.log.of("probe.in_flight")
    assert [e.args[1] for e in polls] == [3, 2, 1, 0]
    # the stop comes after the poll that saw 0
    assert world.log.last("probe.in_flight") < world.log.first("units.stop")
    rec = world.record(res)
    (drain,) = rec.extra["drain"]
    assert drain["backend"] == "day"
    assert (drain["in_flight_at_start"], drain["in_flight_at_stop"], drain["timed_out"]) == (3, 0, False)
    assert drain["waited_s"] == pytest.approx(1.5)
    assert rec.durations_s["drain"] == pytest.approx(1.5)


def test_switcher_drain_stops_anyway_after_drain_timeout(world: Any) -> None:
    world.probe.set_in_flight("day", 2, step=0)  # a request that never ends
    res = world.switch("night")
    assert res.ok, res
    (drain,) = world.record(res).extra["drain"]
    assert drain["timed_out"] is True
    assert drain["in_flight_at_stop"] == 2
    assert 10.0 <= drain["waited_s"] <= 10.5  # day's drain_timeout_s
    assert world.unit_calls() == [("stop", "day"), ("start", "night")]


def test_switcher_skip_drain_does_not_ask_in_flight(world: Any) -> None:
    world.probe.set_in_flight("day", 5, step=0)
    res = world.switch("night", skip_drain=True)
    assert res.ok, res
    assert world.probe.in_flight_polls == []
    assert world.record(res).extra["drain"] == [{"backend": "day", "skipped": True}]


def test_switcher_drain_with_unknown_in_flight_does_not_wait(world: Any) -> None:
    world.probe.set_in_flight("day", None)
    res = world.switch("night")
    assert res.ok, res
    assert world.record(res).durations_s["drain"] == 0


# --------------------------------------------------------------------------- what the record keeps


def test_switcher_records_argv_configured_and_as_run_and_version(world: Any) -> None:
    world.probe.set_version(
        ["night-server", "--version"], VersionInfo("b4321 (abc123)", "command", "version: b4321")
    )
    res = world.switch("night")
    assert res.ok, res
    assert res.backend_version == "b4321 (abc123)"
    rec = world.record(res)
    assert rec.argv_configured == ["/opt/night/bin/server", "--port", "${PORT}", "--model", "/models/night"]
    assert rec.argv_running == ["/opt/night/bin/server", "--port", "18080", "--model", "/models/night"]
    assert (rec.backend_version, rec.version_source) == ("b4321 (abc123)", "command")
    assert rec.unit == world.unit("night")
    assert rec.unit_path == f"/etc/systemd/system/{world.unit('night')}"
    assert rec.gpushift_version == "0.0.0-test"
    assert set(rec.vram) >= {"before", "released", "ready"}
    assert [r["used_mib"] for r in rec.vram["ready"]] == [6800.0]
    assert set(rec.durations_s) >= {"preflight", "drain", "stop", "release", "start", "ready", "version"}
    assert rec.gpu_facts["gpus"] and rec.gpu_facts["driver_version"] == "580.0.0"
    # the argv as run came from the running main process, and went to launch_info
    main_pid = world.units.units[world.unit("night")].main_pid
    assert ("host.cmdline", (main_pid,)) in [(e.kind, e.args) for e in world.log.entries]
    assert world.host.launch_calls[-1][1] == rec.argv_running
    assert rec.extra["launch"]["unit"] == world.unit("night")


def test_switcher_version_by_url(make_world: Any) -> None:
    world = make_world()
    world.boot("night")
    world.probe.set_version(
        "http://127.0.0.1:18000/version", VersionInfo("0.6.3", "url", '{"version":"0.6.3"}')
    )
    res = world.switch("day")
    assert res.ok, res
    assert (world.record(res).backend_version, world.record(res).version_source) == ("0.6.3", "url")


def test_switcher_launch_info_failure_does_not_fail_the_switch(world: Any) -> None:
    world.host.launch_error = OSError("unit file vanished")
    res = world.switch("night")
    assert res.ok, res
    assert "unit file vanished" in world.record(res).extra["launch_error"]


# --------------------------------------------------------------------------- listeners


def test_switcher_listeners_get_phases_in_order_and_one_finished(world: Any) -> None:
    world.probe.set_in_flight("day", 1)
    res = world.switch("night")
    evs = world.events_of(res.ticket)
    assert world.phases(res.ticket) == [
        Phase.PREFLIGHT.value,
        Phase.INTENT.value,
        Phase.DRAIN.value,
        Phase.STOP.value,
        Phase.RELEASE.value,
        Phase.START.value,
        Phase.READY.value,
        Phase.VERSION.value,
    ]
    finished = [e for e in evs if e.kind == "finished"]
    assert len(finished) == 1 and evs[-1] is finished[0]
    assert finished[0].ok is True and finished[0].phase == Phase.DONE.value
    assert finished[0].result.outcome == Outcome.OK.value
    times = [e.elapsed_s for e in evs]
    assert times == sorted(times)


def test_switcher_listeners_hear_rollback_after_failure(world: Any) -> None:
    world.probe.set_health(world.url("night"), ok_after=None)
    res = world.switch("night")
    phases = world.phases(res.ticket)
    assert phases.index(Phase.READY.value) < phases.index(Phase.ROLLBACK.value)
    (finished,) = [e for e in world.events_of(res.ticket) if e.kind == "finished"]
    assert finished.ok is False and finished.result.outcome == Outcome.ROLLED_BACK.value


def test_switcher_broken_listener_does_not_break_the_switch(world: Any) -> None:
    def broken(e: Any) -> None:
        raise RuntimeError("listener bug")

    world.switcher.listeners.insert(0, broken)
    res = world.switch("night")
    assert res.ok, res
    assert world.running() == ["night"]


# --------------------------------------------------------------------------- edges


def test_switcher_cancel_during_drain_leaves_the_current_backend_serving(world: Any) -> None:
    world.probe.set_in_flight("day", 4, step=0)  # a long request keeps the drain waiting
    cancelled: list[str] = []

    def cancel_while_draining(e: Any) -> None:
        if e.kind == "progress" and e.phase == Phase.DRAIN.value and not cancelled:
            cancelled.append(world.switcher.cancel(Caller(uid=1001, user="carol")))

    world.switcher.listeners.append(cancel_while_draining)
    res = world.switch("night")
    assert cancelled == [res.ticket]
    assert res.ok is False
    assert "cancelled by carol" in res.message
    # nothing was stopped yet when the cancel came: day must still serve, untouched
    assert world.units.calls == []
    assert world.running() == ["day"]
    rec = world.record(res)
    assert rec.outcome == Outcome.CANCELLED.value  # a person aborted it; nothing had changed yet
    assert rec.failed_phase == Phase.DRAIN.value


def test_switcher_cancel_without_a_switch_raises_nothing_to_cancel(world: Any) -> None:
    with pytest.raises(NothingToCancel):
        world.switcher.cancel(Caller(uid=0, user="root"))


def test_switcher_target_that_cannot_be_stopped_after_failure_blocks_the_rollback(world: Any) -> None:
    world.probe.set_health(world.url("night"), ok_after=None)
    world.units.behave(world.unit("night"), stop_leaves_running=True)
    res = world.switch("night")
    assert res.outcome == Outcome.FAILED.value
    # day must not be started while night may still hold GPU 1
    assert world.unit_calls() == [("stop", "day"), ("start", "night"), ("stop", "night")]
    assert world.unit("night") in res.message


def test_switcher_port_error_during_start_finishes_the_row_and_rolls_back(world: Any) -> None:
    world.units.behave(world.unit("night"), start_raises=SystemdError("StartUnit: Access denied"))
    res = world.switch("night")
    assert res.ok is False
    assert "Access denied" in res.message
    rec = world.ledger.rows[max(world.ledger.rows)]
    # "no launch without a record": the row is completed, not left pending for ever
    assert rec.outcome != Outcome.PENDING.value
    assert rec.failed_phase == Phase.START.value
    assert world.running() == ["day"]


def test_switcher_target_already_running_beside_another_keeps_target(world: Any) -> None:
    # both units active (somebody ran `systemctl start night` on a host without Conflicts=)
    world.units.set_running(world.unit("night"))
    res = world.switch("night")
    assert res.ok, res
    assert world.running() == ["night"]
    assert ("stop", "day") in world.unit_calls()


# --------------------------------------------------------------------------- what gpushift established


def test_switcher_established_backend_follows_each_outcome(make_world: Any) -> None:
    world = make_world(on_failure="rollback")
    world.boot("day")
    world.switcher.adopt("day")
    assert world.switcher.snapshot() == (False, "day")
    world.gpu.add_foreign(1, pid=4242, mib=9318)
    assert world.switch("night").outcome == Outcome.REFUSED.value
    assert world.switcher.snapshot() == (False, "day")  # refused: nothing changed
    world.gpu.remove_foreign(4242)
    world.probe.set_health(world.url("night"), ok_after=None)
    assert world.switch("night").outcome == Outcome.ROLLED_BACK.value
    assert world.switcher.snapshot() == (False, "day")
    world.probe.set_health(world.url("night"), ok_after=0)
    assert world.switch("night").outcome == Outcome.OK.value
    assert world.switcher.snapshot() == (False, "night")
    assert world.switch(OFF).outcome == Outcome.OK.value
    assert world.switcher.snapshot() == (False, OFF)


def test_switcher_established_is_off_after_a_stay_failure(make_world: Any) -> None:
    world = make_world(on_failure="stay")
    world.boot("day")
    world.probe.set_health(world.url("night"), ok_after=None)
    assert world.switch("night").outcome == Outcome.FAILED.value
    assert world.switcher.snapshot() == (False, OFF)
    assert world.running() == []


def test_switcher_adopt_does_not_override_a_switch_in_flight(world: Any) -> None:
    held = threading.Event()
    day = world.units.behave(world.unit("day"), hold_stop=held)
    ticket = world.request("night")
    try:
        assert day.stop_entered.wait(10)
        assert world.switcher.snapshot()[0] is True
        world.switcher.adopt("day")
        assert world.switcher.snapshot() == (True, None)
    finally:
        held.set()
    assert world.wait(ticket).ok
    assert world.switcher.snapshot() == (False, "night")


def test_switcher_note_external_records_a_finished_row_with_the_running_argv(world: Any) -> None:
    # somebody ran `systemctl stop day; systemctl start night` behind gpushift's back
    world.units.set_stopped(world.unit("day"))
    world.units.set_running(world.unit("night"))
    world.switcher.note_external("day", "night")
    (rec,) = world.ledger.rows.values()
    assert (rec.trigger, rec.outcome, rec.from_backend, rec.to_backend) == ("external", "ok", "day", "night")
    assert rec.argv_running == ["/opt/night/bin/server", "--port", "18080", "--model", "/models/night"]
    assert rec.argv_configured[2] == "${PORT}"
    assert rec.finished_at is not None
    assert world.log.kinds().count("ledger.begin") == 1 and world.log.kinds().count("ledger.finish") == 1
    assert world.switcher.snapshot() == (False, "night")
    assert world.units.calls == []  # it records, it does not undo


def test_switcher_port_error_during_stop_fails_without_starting(world: Any) -> None:
    world.units.behave(world.unit("day"), stop_raises=SystemdError("StopUnit: connection to systemd lost"))
    res = world.switch("night")
    assert res.ok is False
    assert res.outcome == Outcome.FAILED.value
    assert "connection to systemd lost" in res.message
    assert ("start", world.unit("night")) not in world.units.calls
    assert world.record(res).outcome == Outcome.FAILED.value


def test_switcher_internal_error_finishes_the_row_and_frees_the_slot(world: Any) -> None:
    world.probe.version_error = RuntimeError("probe bug")
    res = world.wait(world.request("night"))
    assert res.ok is False
    assert "probe bug" in res.message
    (rec,) = world.ledger.rows.values()
    assert rec.outcome == Outcome.FAILED.value  # never left pending until the next daemon start
    assert rec.failed_phase == Phase.VERSION.value
    assert world.switcher.current() is None
    world.probe.version_error = None
    assert world.switch("day").ok is True


def test_switcher_cancel_before_any_stop_keeps_established_backend(world: Any) -> None:
    # the keeper must not mistake the still-running backend for a person's systemctl afterwards
    world.probe.set_in_flight("day", 4, step=0)

    def cancel_while_draining(e: Any) -> None:
        if e.kind == "progress" and e.phase == Phase.DRAIN.value:
            with contextlib.suppress(Exception):
                world.switcher.cancel(Caller(uid=1001, user="carol"))

    world.switcher.adopt("day")
    world.switcher.listeners.append(cancel_while_draining)
    res = world.switch("night")
    assert res.outcome == Outcome.CANCELLED.value and res.touched is False
    assert world.switcher.snapshot() == (False, "day")


def test_switcher_crash_into_auto_restart_is_noticed_at_the_next_poll(world: Any) -> None:
    # a backend unit with Restart=on-failure that crashed while loading sits in activating/auto-restart
    world.probe.set_health(world.url("night"), ok_after=None)

    def crash(e: Any) -> None:
        if e.kind == "progress" and e.phase == Phase.READY.value:
            u = world.units.units[world.unit("night")]
            u.active_state, u.sub_state, u.result = "activating", "auto-restart", "exit-code"

    world.switcher.listeners.append(crash)
    t0 = world.clock.monotonic()
    res = world.switch("night")
    assert res.failed_phase == Phase.READY.value and "auto-restart" in res.message
    assert world.clock.monotonic() - t0 < world.config.backends["night"].start_timeout_s

"""The keeper watches a backend of several instances as one (issue 23): an instance that exits by
itself between switches is a ledger row of its own; while ``min_ready`` instances still run the
backend serves on, with fewer it is relaunched through the whole gate."""

from __future__ import annotations

from typing import Any

from gpushift_unit_fakes import MemoryOverrideStore  # loaded by tests/unit/conftest.py

from gpushift.daemon.settings import watch_settings
from gpushift.keeper import Keeper
from tests.support.instances import N0, N1, with_instances


def _serving(make_world: Any, min_ready: int) -> tuple[Any, Keeper]:
    world = with_instances(make_world(), min_ready=min_ready)
    world.boot("day")
    assert world.switch("night").ok
    keeper = Keeper(
        world.switcher,
        None,
        MemoryOverrideStore(),
        now=world.clock.now,
        monotonic=world.clock.monotonic,
        settings=watch_settings(world.config),
    )
    keeper.tick()  # the first look: both instances seen running
    assert world.switcher.wait(20)
    return world, keeper


def _crash(world: Any, unit: str) -> None:
    """``unit`` exits by itself (failed), and its memory goes with its process."""
    world.units.set_failed(unit, "exit-code")
    world.gpu.unit_event("crashed", world.units.units[unit])


def _rows(world: Any) -> list[Any]:
    return [world.ledger.rows[i] for i in sorted(world.ledger.rows)]


def test_keeper_an_instance_crash_is_its_own_row_and_only_it_is_relaunched(make_world: Any) -> None:
    world, keeper = _serving(make_world, min_ready=1)
    before = len(_rows(world))
    n0_pid = world.units.units[N0].main_pid
    _crash(world, N1)
    keeper.tick()
    assert world.switcher.wait(20)
    rows = _rows(world)[before:]
    assert [(r.trigger, r.outcome) for r in rows] == [("watch", "crashed"), ("recovery", "ok")], rows
    row = rows[0]
    assert row.unit == N1 and row.to_backend == "night"  # it still serves
    assert row.extra["incident"]["unit"] == N1 and row.extra["incident"]["serving"] is True
    assert row.extra["evidence"]["unit"] == N1
    assert "1 of 2 instances of night run (1 needed)" in (row.message or "")
    # the relaunch started the crashed instance alone, after the gate saw its GPU free
    relaunch = rows[1]
    assert relaunch.extra["relaunched"] == [N1]
    assert [e["outcome"] for e in relaunch.extra["instances"]] == ["ready", "ready"]
    assert world.units.is_running(N0) and world.units.is_running(N1)
    assert world.units.units[N0].main_pid == n0_pid  # the serving instance was not touched
    assert [u for v, u in world.units.calls if v == "stop"][-1:] != [N0]
    keeper.tick()  # nothing more to do
    assert world.switcher.wait(20)
    assert len(_rows(world)) == before + 2


def test_keeper_fewer_than_min_ready_running_relaunches_the_backend_through_the_gate(make_world: Any) -> None:
    world, keeper = _serving(make_world, min_ready=2)
    before = len(_rows(world))
    _crash(world, N1)
    keeper.tick()
    assert world.switcher.wait(20)
    rows = _rows(world)[before:]
    assert [(r.trigger, r.outcome) for r in rows] == [("watch", "crashed"), ("recovery", "ok")], rows
    assert rows[0].to_backend == "off" or rows[0].extra["incident"]["serving"] is False
    relaunch = rows[1]
    assert relaunch.to_backend == "night" and relaunch.extra.get("relaunch") is True
    assert [e["outcome"] for e in relaunch.extra["instances"]] == ["ready", "ready"]
    assert world.units.is_running(N0) and world.units.is_running(N1)


def test_keeper_an_instance_that_failed_at_the_switch_is_no_crash(make_world: Any) -> None:
    world = with_instances(make_world(), min_ready=1)
    world.boot("day")
    world.units.behave(N0, start_job_result="failed")  # the first instance: the backend's own unit
    assert world.switch("night").ok
    keeper = Keeper(
        world.switcher,
        None,
        MemoryOverrideStore(),
        now=world.clock.now,
        monotonic=world.clock.monotonic,
        settings=watch_settings(world.config),
    )
    before = len(_rows(world))
    for _ in range(2):
        summary = keeper.tick()
        assert world.switcher.wait(20)
    assert len(_rows(world)) == before, _rows(world)[before:]  # no crash, no "external change"
    assert "night serves" in summary, summary
    assert world.units.is_running(N1)


def test_keeper_a_relaunch_whose_instance_crashes_again_ends_failed_with_its_row_closed(
    make_world: Any,
) -> None:
    world, keeper = _serving(make_world, min_ready=2)
    before = len(_rows(world))
    world.units.behave(N1, crash_after_s=0.0)  # it exits at once, now and after every start
    keeper.tick()
    assert world.switcher.wait(20)
    rows = _rows(world)[before:]
    assert [(r.trigger, r.outcome) for r in rows] == [("watch", "crashed"), ("recovery", "failed")], rows
    assert "internal error" not in (rows[1].message or ""), rows[1].message
    assert not world.units.is_running(N0) and not world.units.is_running(N1)

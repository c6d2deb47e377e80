"""A hung instance of a backend of several (issue 23): its unit active, its health failing for
``unhealthy_after_s``.  It is a ledger row of its own naming its unit; while ``min_ready`` other
instances are healthy it is restarted alone, with fewer the backend is relaunched through the
gate.  The keeper sees the health through the daemon's watch on a real sampler over the fakes."""

from __future__ import annotations

from typing import Any

from gpushift_unit_fakes import MemoryOverrideStore  # loaded by tests/unit/conftest.py

from gpushift.daemon.settings import watch_settings
from gpushift.daemon.watch import BackendWatcher
from gpushift.host.nulllog import NULL_LOG
from gpushift.keeper import Keeper
from gpushift.sampler.sampler import Sampler
from tests.support.instances import N0, N1, with_instances

URL = {N0: "http://127.0.0.1:18081/health", N1: "http://127.0.0.1:18082/health"}
PERIOD = 2.0


def _serving(make_world: Any, min_ready: int) -> tuple[Any, Keeper, Sampler]:
    world = with_instances(make_world(), min_ready=min_ready)
    world.boot("day")
    assert world.switch("night").ok
    sampler = Sampler(world.config, world.ports, period_s=PERIOD)
    watch = BackendWatcher(world.ports, None, NULL_LOG)
    watch.sampler = sampler
    keeper = Keeper(
        world.switcher,
        None,
        MemoryOverrideStore(),
        now=world.clock.now,
        monotonic=world.clock.monotonic,
        watch=watch,
        settings=watch_settings(world.config),
    )
    sampler.sample_once()
    keeper.tick()  # the first look: both instances seen running
    assert world.switcher.wait(20)
    return world, keeper, sampler


def _hang_for(world: Any, sampler: Sampler, units: tuple[str, ...], seconds: float) -> None:
    """``units`` stop answering their health (their units stay active) for ``seconds``."""
    for u in units:
        world.probe.hang(URL[u])
    sampler.sample_once()
    world.clock.advance(seconds)
    sampler.sample_once()


def _rows(world: Any) -> list[Any]:
    return [world.ledger.rows[i] for i in sorted(world.ledger.rows)]


def _unhealthy_after(world: Any) -> float:
    return float(world.config.backends["night"].unhealthy_after_s)


def test_keeper_a_hung_instance_is_its_own_row_and_only_it_is_restarted(make_world: Any) -> None:
    world, keeper, sampler = _serving(make_world, min_ready=1)
    before = len(_rows(world))
    n0_pid, n1_pid = (world.units.units[u].main_pid for u in (N0, N1))
    _hang_for(world, sampler, (N1,), _unhealthy_after(world) + 5)
    keeper.tick()
    assert world.switcher.wait(20)
    rows = _rows(world)[before:]
    assert [(r.trigger, r.outcome) for r in rows] == [("watch", "unhealthy"), ("recovery", "ok")], rows
    row = rows[0]
    assert row.unit == N1 and row.to_backend == "night"  # it still serves on N0
    assert row.extra["incident"]["unit"] == N1 and row.extra["incident"]["serving"] is True
    assert f"{N1} has not answered its health URL" in (row.message or "")
    assert "1 of 2 instances of night run and answer (1 needed)" in (row.message or "")
    relaunch = rows[1]
    assert relaunch.extra["restarted"] == [N1] and relaunch.extra["relaunched"] == [N1]
    assert relaunch.extra.get("relaunch") is not True  # not the whole backend
    assert [e["outcome"] for e in relaunch.extra["instances"]] == ["ready", "ready"]
    assert world.units.units[N0].main_pid == n0_pid  # the healthy instance was not touched
    assert world.units.units[N1].main_pid != n1_pid  # the hung one is a new process
    assert N0 not in [u for v, u in world.units.calls if v == "stop"]
    sampler.sample_once()  # the new process answers: nothing more to do
    keeper.tick()
    assert world.switcher.wait(20)
    assert len(_rows(world)) == before + 2


def test_keeper_a_hung_instance_within_the_limit_is_no_incident(make_world: Any) -> None:
    world, keeper, sampler = _serving(make_world, min_ready=1)
    before = len(_rows(world))
    _hang_for(world, sampler, (N1,), _unhealthy_after(world) - 5)
    keeper.tick()
    assert world.switcher.wait(20)
    assert len(_rows(world)) == before


def test_keeper_fewer_than_min_ready_healthy_relaunches_the_backend_through_the_gate(make_world: Any) -> None:
    world, keeper, sampler = _serving(make_world, min_ready=2)
    before = len(_rows(world))
    n0_pid = world.units.units[N0].main_pid
    _hang_for(world, sampler, (N1,), _unhealthy_after(world) + 5)
    keeper.tick()
    assert world.switcher.wait(20)
    rows = _rows(world)[before:]
    assert [(r.trigger, r.outcome) for r in rows] == [("watch", "unhealthy"), ("recovery", "ok")], rows
    assert rows[0].unit == N1 and rows[0].extra["incident"]["serving"] is False
    assert "1 of 2 instances of night run and answer (2 needed)" in (rows[0].message or "")
    relaunch = rows[1]
    assert relaunch.to_backend == "night" and relaunch.extra.get("relaunch") is True
    assert [e["outcome"] for e in relaunch.extra["instances"]] == ["ready", "ready"]
    assert world.units.units[N0].main_pid != n0_pid  # the whole backend went through the gate
    assert world.units.is_running(N0) and world.units.is_running(N1)


def test_keeper_every_instance_hung_relaunches_the_backend(make_world: Any) -> None:
    world, keeper, sampler = _serving(make_world, min_ready=1)
    before = len(_rows(world))
    _hang_for(world, sampler, (N0, N1), _unhealthy_after(world) + 5)
    keeper.tick()
    assert world.switcher.wait(20)
    rows = _rows(world)[before:]
    assert [(r.trigger, r.outcome) for r in rows] == [("watch", "unhealthy"), ("recovery", "ok")], rows
    assert rows[0].unit == N0 and "0 of 2 instances of night run and answer" in (rows[0].message or "")
    assert rows[1].extra.get("relaunch") is True
    assert world.units.is_running(N0) and world.units.is_running(N1)

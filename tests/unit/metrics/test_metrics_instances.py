"""/metrics with a backend of several instances (issue 23): the memory of every instance is the
backend's own, never a foreign process's."""

from __future__ import annotations

from typing import Any

from test_metrics import Scrape, gpu  # this directory's scrape of a World

from tests.support.instances import with_instances

MIB = 2**20


def test_metrics_count_every_instance_s_memory_as_the_backend_s_not_foreign(make_world: Any) -> None:
    world = with_instances(make_world())
    world.boot("day")
    assert world.switch("night").ok
    scrape = Scrape(world)
    scrape.sampler.sample_once()
    m = scrape()
    assert m["gpushift_gpu_memory_used_bytes"] == {gpu(0): 6800 * MIB, gpu(1): 6800 * MIB}
    assert m["gpushift_vram_held_by_foreign_process"] == {gpu(0): 0, gpu(1): 0}
    assert m["gpushift_vram_foreign_used_bytes"] == {gpu(0): 0, gpu(1): 0}


def test_metrics_and_status_show_each_instance_s_unit(make_world: Any) -> None:
    from gpushift.cli import render_status
    from gpushift.daemon.wiring import Components, status_report
    from tests.support.instances import N0, N1

    world = with_instances(make_world(), min_ready=1)
    world.boot("day")
    world.units.behave(N1, start_job_result="failed")
    assert world.switch("night").ok
    scrape = Scrape(world)
    scrape.sampler.sample_once()
    m = scrape()
    series = m["gpushift_backend_instance_unit_active"]
    assert {dict(k)["unit"]: v for k, v in series.items()} == {N0: 1.0, N1: 0.0}
    assert {dict(k)["backend"] for k in series} == {"night"}
    st = status_report(Components(world.config, world.ports), {"running": True})
    entries = st["backends"]["night"]["instances"]
    assert [(e["unit"], e["active_state"], e["health"]) for e in entries] == [
        (N0, "active", "ok"),
        (N1, "failed", None),
    ]
    assert {dict(k)["unit"]: v for k, v in m["gpushift_backend_instance_up"].items()} == {N0: 1.0}
    assert "instances" not in st["backends"]["day"]
    text = render_status(st)
    assert f"    instance {N0}" in text and "failed/failed" in text, text


def test_metrics_and_status_show_an_instance_whose_health_fails(make_world: Any) -> None:
    from gpushift.daemon.wiring import Components, status_report
    from tests.support.instances import N0, N1

    world = with_instances(make_world())
    world.boot("day")
    assert world.switch("night").ok
    world.probe.set_health("http://127.0.0.1:18082/health", ok_after=None, before=503)
    scrape = Scrape(world)
    scrape.sampler.sample_once()
    m = scrape()
    assert {dict(k)["unit"]: v for k, v in m["gpushift_backend_instance_up"].items()} == {N0: 1.0, N1: 0.0}
    st = status_report(Components(world.config, world.ports), {"running": True})
    assert [e["health"] for e in st["backends"]["night"]["instances"]] == ["ok", "failing"]

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

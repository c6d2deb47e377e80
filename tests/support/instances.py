"""The unit-test World's "night" as a backend of two instances (issue 23): ``gpushift-night@0.service``
on GPU 0 (port 18081) and ``gpushift-night@1.service`` on GPU 1 (port 18082), each holding 6800 MiB
while it runs."""

from __future__ import annotations

from typing import Any

from gpushift.config.schema import parse

N0, N1 = "gpushift-night@0.service", "gpushift-night@1.service"
INSTANCES = f"""instances = [
  {{ unit = "{N0}", health_url = "http://127.0.0.1:18081/health", gpus = [0] }},
  {{ unit = "{N1}", health_url = "http://127.0.0.1:18082/health", gpus = [1] }},
]
"""


def with_instances(world: Any, min_ready: int | None = None) -> Any:
    """Turn ``world``'s "night" into the two instances (their units, memory and health scripted)."""
    text = world.toml.replace(
        'unit = "gpushift-night.service"\nhealth_url = "http://127.0.0.1:18080/health"\n', INSTANCES
    ).replace("gpus = [1]\n", "" if min_ready is None else f"min_ready = {min_ready}\n")
    world.config = parse(text, "/etc/gpushift/unit-test.toml")
    world.switcher.reconfigure(world.config)
    for n, (unit, port) in enumerate(((N0, "18081"), (N1, "18082"))):
        world.units.add(
            unit,
            exec_start=("/opt/night/bin/server", "--port", port),
            argv_running=("/opt/night/bin/server", "--port", port, "--instance", str(n)),
            fragment_path="/etc/systemd/system/gpushift-night@.service",
        )
        world.gpu.allocate(unit, (n,), 6800.0)
        world.probe.set_health(f"http://127.0.0.1:{port}/health", ok_after=0, unit=unit)
    return world

"""Which GPUs a backend runs on (how the messages name them: :mod:`gpushift.backends.rules`)."""

from __future__ import annotations

from collections.abc import Mapping

from gpushift.config.schema import BackendConfig
from gpushift.values import GpuInfo, HostGpuFacts


def backend_gpus(backend: BackendConfig, env: Mapping[str, str], facts: HostGpuFacts) -> tuple[GpuInfo, ...]:
    """The GPUs a backend runs on: its configured ``gpus``, else those ``CUDA_VISIBLE_DEVICES``
    names (by index or UUID), else every GPU of the host.  Indices the host lacks are left out."""
    by_index = {g.index: g for g in facts.gpus}
    if backend.gpus is not None:
        return tuple(by_index[i] for i in backend.gpus if i in by_index)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        chosen: list[GpuInfo] = []
        for item in (s.strip() for s in visible.split(",")):
            if item.isdigit() and int(item) in by_index:
                chosen.append(by_index[int(item)])
            else:
                chosen.extend(g for g in facts.gpus if item and g.uuid.startswith(item))
        return tuple(chosen)
    return facts.gpus

"""Which GPUs a backend runs on, and how the doctor's messages name them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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


def gpu_count(backend: BackendConfig, env: Mapping[str, str], facts: HostGpuFacts) -> int:
    """How many GPUs the backend is given (counted as configured, even those the host lacks)."""
    if backend.gpus is not None:
        return len(backend.gpus)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([s for s in visible.split(",") if s.strip()])
    return len(facts.gpus)


def cc_text(cc: tuple[int, int]) -> str:
    """A compute capability as people write it: ``7.0``."""
    return f"{cc[0]}.{cc[1]}"


def oldest(gpus: Sequence[GpuInfo]) -> GpuInfo | None:
    """The GPU with the lowest known compute capability (what a multi-GPU launch is limited by)."""
    known = [g for g in gpus if g.compute_capability is not None]
    return min(known, key=lambda g: g.compute_capability or (0, 0)) if known else None


def names(gpus: Sequence[GpuInfo]) -> str:
    """``GPU 0 (Tesla V100-PCIE-16GB), GPU 1 (...)``."""
    return ", ".join(f"GPU {g.index} ({g.name})" for g in gpus)

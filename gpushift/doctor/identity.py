"""GPU identity — the doctor's rules that keep the VRAM gate watching the right cards.

Two ways the gate can end up watching the wrong GPU:

* a GPU changed since the last launch: it vanished (a driver reloading, a GPU fallen off the bus)
  or its UUID changed (a replaced card, a reordered bus) — refused until the new UUID is listed in
  ``[gpu] accepted_gpu_uuids``;
* a backend unit selects its GPUs by index (``CUDA_VISIBLE_DEVICES=0,1``) without
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` on a host whose GPUs differ: CUDA numbers GPUs fastest first by
  default, NVML (and so the gate) in PCI bus order, so index 0 may not be the same card for both
  (CUDA_DEVICE_ORDER in the CUDA C Programming Guide's environment variables).  UUIDs
  (``CUDA_VISIBLE_DEVICES=GPU-…``) name the same card for both.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from gpushift.config.schema import BackendConfig
from gpushift.doctor.findings import (
    ERROR,
    GPU_IDENTITY_CHANGED,
    GPU_ORDER_AMBIGUOUS,
    GPUS_MISMATCH,
    WARNING,
    Finding,
)
from gpushift.doctor.gpus import backend_gpus
from gpushift.values import GpuInfo, HostGpuFacts


def identity_problems(
    facts: HostGpuFacts, known: Mapping[int, str], accepted: Collection[str], needed: Collection[int]
) -> list[str]:
    """GPUs whose identity does not match the last launch (fail closed, with what to do).

    ``known`` is index → UUID as the last launch saw them; ``needed`` the indices a switch gates on.
    A GPU that was seen before and is not listed now, or whose UUID changed (a replaced card, or a
    reordered bus: the gate would watch the wrong card) is a problem until its new UUID is listed
    in ``[gpu] accepted_gpu_uuids``.
    """
    now = {g.index: g.uuid for g in facts.gpus}
    out: list[str] = []
    for i in sorted(set(needed) | set(known)):
        old = known.get(i)
        if i not in now:
            if i in needed or old is not None:
                was = f" (it was {old} at the last launch)" if old else ""
                out.append(
                    f"GPU {i} is not visible{was}: the driver may be reloading or the GPU fell off the bus"
                )
            continue
        if old is not None and now[i] != old and now[i] not in accepted:
            out.append(
                f"GPU {i} changed identity since the last launch: {old} -> {now[i]} (a replaced card or a "
                f'reordered bus); if that is intended, add "{now[i]}" to [gpu] accepted_gpu_uuids and reload'
            )
    return out


def _heterogeneous(gpus: Sequence[GpuInfo]) -> bool:
    return len({(g.name, g.total_mib, g.compute_capability) for g in gpus}) > 1


def identity_rules(
    name: str,
    backend: BackendConfig,
    env: Mapping[str, str],
    facts: HostGpuFacts,
    known: Mapping[int, str] | None,
    accepted: Collection[str],
) -> list[Finding]:
    """The identity findings of one backend (see the module docstring)."""
    out: list[Finding] = []
    if known is not None and not facts.error:
        needed = backend.gpus if backend.gpus is not None else tuple(sorted(known))
        for problem in identity_problems(facts, known, accepted, needed):
            out.append(
                Finding(
                    ERROR,
                    GPU_IDENTITY_CHANGED,
                    name,
                    problem,
                    "check the card (nvidia-smi -L); if the change is intended, accept the new UUID in "
                    "[gpu] accepted_gpu_uuids and run `gpushift reload`",
                )
            )
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return out
    items = [s.strip() for s in visible.split(",") if s.strip()]
    by_index = any(i.isdigit() for i in items)
    pci_order = env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
    if by_index and not pci_order and _heterogeneous(facts.gpus):
        kinds = "; ".join(f"GPU {g.index} {g.name}" for g in facts.gpus)
        out.append(
            Finding(
                ERROR,
                GPU_ORDER_AMBIGUOUS,
                name,
                f"CUDA_VISIBLE_DEVICES={visible} selects GPUs by index in CUDA's order (fastest first), "
                f"while NVML and the VRAM gate count in PCI bus order; on this host of different GPUs "
                f"({kinds}) the gate could watch another card than the one the backend uses",
                "add Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID to the unit, or name the GPUs by UUID "
                "(CUDA_VISIBLE_DEVICES=GPU-…, see nvidia-smi -L)",
            )
        )
    elif backend.gpus is not None and (pci_order or not by_index or not _heterogeneous(facts.gpus)):
        chosen = sorted(g.index for g in backend_gpus(replace(backend, gpus=None), env, facts))
        if chosen and chosen != sorted(backend.gpus):
            out.append(
                Finding(
                    WARNING,
                    GPUS_MISMATCH,
                    name,
                    f"the gate watches GPU {', '.join(map(str, backend.gpus))} (gpus in the config) but the "
                    f"unit's CUDA_VISIBLE_DEVICES={visible} selects GPU {', '.join(map(str, chosen))}",
                    "make [backends.NAME] gpus and the unit's CUDA_VISIBLE_DEVICES name the same cards",
                )
            )
    return out

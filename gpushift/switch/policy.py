"""Pure rules of a switch — which GPUs a gate watches, what blocks a preflight, when the gate opens.

No I/O here: every function takes readings and returns a verdict, so every rule is unit-tested with
plain values.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from gpushift.config.schema import Config
from gpushift.safetext.terminal import fmt_mib
from gpushift.values import OFF, GateState, GpuReading, Holder


def gate_gpus(
    config: Config, target: str, previous: Iterable[str], all_gpus: Sequence[int]
) -> tuple[int, ...]:
    """The GPUs whose VRAM must be free before ``target`` starts.

    For a backend: the GPUs it uses.  For ``off``: the GPUs of the backends being stopped (all GPUs
    when nothing was running, so ``switch off`` still proves the host is free).
    """
    everything = tuple(all_gpus)
    if target != OFF:
        return config.gpus_of(target, everything)
    out: list[int] = []
    for name in previous:
        for i in config.gpus_of(name, everything):
            if i not in out:
                out.append(i)
    return tuple(sorted(out)) if out else everything


def _holder_phrase(h: Holder) -> str:
    amount = f": {fmt_mib(h.used_mib)}" if h.used_mib else ""
    return f"{h.describe()}{amount}"


def describe_reading(r: GpuReading, residual_mib: float, simulated: bool = False) -> str:
    """Why a GPU does not count as released, in one line a person can act on.

    e.g. ``VRAM on GPU 1 still held by pid 4242 (python, user bob): 9.1 GiB``.
    """
    sim = " (SIMULATED)" if simulated else ""
    state = r.state(residual_mib)
    if state is GateState.RELEASED:
        return f"GPU {r.index}{sim} released ({fmt_mib(r.used_mib)} used)"
    if r.error is not None:
        return f"VRAM on GPU {r.index}{sim} unknown: {r.error}"
    unseen = ""
    if not r.holders_complete:
        pids = ", ".join(str(p) for p in r.unreadable_pids[:5])
        unseen = f"; the open files of pid {pids} cannot be read (run gpushift as root to see every holder)"
    holders = sorted(r.holders, key=lambda h: -(h.used_mib or 0.0))
    if holders:
        who = "; ".join(_holder_phrase(h) for h in holders)
        return (
            f"VRAM on GPU {r.index}{sim} still held by {who} (GPU total used {fmt_mib(r.used_mib)}){unseen}"
        )
    return (
        f"VRAM on GPU {r.index}{sim} still held: {fmt_mib(r.used_mib)} used, "
        f"no process seen with the device open{unseen}"
    )


@dataclass(frozen=True)
class GateVerdict:
    """The VRAM gate's answer for a set of GPUs."""

    open: bool
    blocking: tuple[GpuReading, ...]
    message: str
    unknown: bool = False  # closed because something could not be read or seen, not because it is held


def gate(
    readings: Sequence[GpuReading],
    residual_mib: float,
    simulated: bool = False,
    expected: Collection[int] = (),
) -> GateVerdict:
    """Open only when EVERY watched GPU is visible and reads RELEASED.

    Fails closed: an unreadable GPU (NVML error, driver gone) is never released; a GPU in
    ``expected`` that is missing from the readings, or no reading at all (NVML lists no GPU: a
    driver reloading, a GPU fallen off the bus), keeps the gate closed instead of passing vacuously.
    """
    seen = {r.index for r in readings}
    missing = sorted(set(expected) - seen)
    blocking = tuple(r for r in readings if r.state(residual_mib) is not GateState.RELEASED)
    problems = [describe_reading(r, residual_mib, simulated) for r in blocking]
    sim = " (SIMULATED)" if simulated else ""
    problems += [f"GPU {i}{sim} is not visible (the GPU provider does not list it)" for i in missing]
    if not readings and not missing:
        problems.append(f"no GPU is visible{sim}: cannot prove that any VRAM was released")
    if not problems:
        return GateVerdict(True, (), "released")
    unknown = (
        bool(missing) or not readings or any(r.state(residual_mib) is GateState.UNKNOWN for r in blocking)
    )
    return GateVerdict(False, blocking, "; ".join(problems), unknown)


@dataclass(frozen=True)
class PreflightVerdict:
    ok: bool
    message: str
    foreign: tuple[Holder, ...] = ()
    #: Every refusing GPU holds memory that no live process has open: what a process that has just
    #: ended leaves for a moment while the driver frees it (the preflight waits a little for that).
    orphaned: bool = False


def foreign_memory(
    readings: Sequence[GpuReading],
    own_units: Collection[str],
    own_pids: Collection[int],
    residual_mib: float,
    simulated: bool = False,
) -> PreflightVerdict:
    """Refuse a switch when the target's GPUs hold memory the running backends do not account for.

    ``own_units``/``own_pids`` are the units and processes of the backends that this switch will
    stop: their memory goes away with the stop.  Memory beyond that (another user's job) would keep
    the gate closed after we had already stopped the current backend, so we refuse BEFORE touching
    anything.  Processes that merely have the device open and hold nothing (nvidia-persistenced,
    nvidia-smi, DCGM) never block; when memory is held, every live foreign process with the device
    open is named.  A GPU that cannot be read refuses too (fail closed).
    """
    problems: list[str] = []
    foreign_all: list[Holder] = []
    orphaned = True
    sim = " (SIMULATED)" if simulated else ""
    for r in readings:
        if r.state(residual_mib) is GateState.UNKNOWN:
            problems.append(describe_reading(r, residual_mib, simulated))
            orphaned = False
            continue
        assert r.used_mib is not None
        own = [h for h in r.holders if (h.unit in own_units) or (h.pid in own_pids)]
        foreign = [h for h in r.holders if h not in own]
        own_known = sum(h.used_mib or 0.0 for h in own)
        own_unknown = any(h.used_mib is None for h in own)
        foreign_known = sum(h.used_mib or 0.0 for h in foreign)
        unexplained = r.used_mib - own_known
        if foreign_known > residual_mib:
            blocked = True
        elif own_unknown:
            # The backend's share is not reported per process: we cannot attribute the total, and
            # only a foreign process reported as holding memory is a reason to refuse.  The gate
            # after the stop still guards the start.
            blocked = False
        else:
            blocked = unexplained > residual_mib
        if blocked:
            foreign_all.extend(foreign)
            if any(h.used_mib is None or h.used_mib > 0 for h in foreign):
                orphaned = False  # a live process may hold it: not a moment's leftover
            if foreign:
                who = "; ".join(
                    _holder_phrase(h) for h in sorted(foreign, key=lambda h: -(h.used_mib or 0.0))
                )
                problems.append(f"VRAM on GPU {r.index}{sim} held by a process outside the backends: {who}")
            else:
                problems.append(
                    f"VRAM on GPU {r.index}{sim}: {fmt_mib(unexplained)} in use that no backend accounts for "
                    "and no process has the device open"
                )
    if problems:
        return PreflightVerdict(False, "; ".join(problems), tuple(foreign_all), orphaned)
    return PreflightVerdict(True, "no foreign VRAM holders")


def running_backends(states: dict[str, bool]) -> list[str]:
    """Backends whose units systemd reports as running, in config order."""
    return [name for name, running in states.items() if running]

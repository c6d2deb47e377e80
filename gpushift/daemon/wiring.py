"""Composition: build every adapter from the config, and compose the status report.

Used by the daemon (which owns the switch) and by the CLI when the daemon is down (it then reads
what it can itself: units, health, GPUs, ledger).  Sits between the adapters and the two entry
points.  Both compose the report with :func:`compose_status`: the daemon from its sampler's latest
sample, the CLI from a one-shot read (:func:`status_report`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpushift import __version__
from gpushift.config.schema import Config
from gpushift.errors import GpushiftError, SystemdError
from gpushift.host.nulllog import NULL_LOG
from gpushift.ledger.view import LedgerView, RememberingLedger, read_view
from gpushift.ports import GpuProbe, Ledger, Ports, UnitControl, states_one_by_one
from gpushift.sampler.sample import Sample, frontdoor_entry, to_status
from gpushift.values import OFF, UnitState


@dataclass
class Components:
    config: Config
    ports: Ports
    bus: Any = None

    def ledger_view(self) -> LedgerView:
        """The ledger's newest rows and health: from memory where the ledger remembers them (the
        daemon's), else read now."""
        ledger = self.ports.ledger
        return ledger.view() if isinstance(ledger, RememberingLedger) else read_view(ledger)


def make_gpu(config: Config) -> GpuProbe:
    if config.gpu.provider == "simulated":
        from gpushift.host.simgpu import SimulatedGpuProbe

        return SimulatedGpuProbe(config)
    from gpushift.host.nvml import NvmlGpuProbe

    return NvmlGpuProbe()


def make_ledger(config: Config, log: Any = None, readonly: bool = False) -> Ledger:
    from gpushift.ledger import SqliteLedger

    if readonly:
        return SqliteLedger.open_readonly(config.ledger_path, spool_dir=config.daemon.runtime_dir)
    return SqliteLedger(config.ledger_path, spool_dir=config.daemon.runtime_dir, log=log)


class UnreachableUnits:
    """Stands in for systemd when the bus cannot be reached (the CLI's local status view):
    every question answers with the reason, so status shows it per backend."""

    def __init__(self, why: str) -> None:
        self.why = why

    def state(self, unit: str) -> Any:
        raise SystemdError(self.why)

    def states(self, units: Sequence[str]) -> dict[str, UnitState | GpushiftError]:
        return states_one_by_one(self.state, units)

    def start(self, unit: str, timeout_s: float) -> Any:
        raise SystemdError(self.why)

    def stop(self, unit: str, timeout_s: float) -> Any:
        raise SystemdError(self.why)

    def reset_failed(self, unit: str) -> None:
        raise SystemdError(self.why)

    def processes(self, unit: str) -> list[int]:
        raise SystemdError(self.why)


def build(
    config: Config, log: Any = None, readonly_ledger: bool = False, tolerate_no_bus: bool = False
) -> Components:
    """Connect to the bus and build every adapter (nothing of this happens at import).

    With ``tolerate_no_bus`` (the CLI's own status view) an unreachable bus is not fatal: the
    units then answer with the reason, and GPUs and ledger are still read.
    """
    from gpushift.backends.probe import HttpBackendProbe
    from gpushift.host import systemd
    from gpushift.host.dbus import connect
    from gpushift.host.peer import PeerFinder
    from gpushift.host.proc import ProcHost, SystemClock

    units: UnitControl
    bus = None
    try:
        bus = connect(config.daemon.bus)
        units = systemd.SystemdUnits(bus)
    except GpushiftError as e:
        if not tolerate_no_bus:
            raise
        units = UnreachableUnits(f"systemd not reachable: {e}")
    from gpushift.switch.runstore import JsonRunStore

    ledger = make_ledger(config, log, readonly_ledger)
    ports = Ports(
        runs=JsonRunStore(config.daemon.state_dir, config.daemon.runtime_dir, log=log),
        units=units,
        gpu=make_gpu(config),
        # Who holds the server end of each checked request: only the unit's own process counts.
        probe=HttpBackendProbe(peers=PeerFinder()),
        # The writer keeps its newest rows in memory: the daemon's status does no I/O.
        ledger=ledger if readonly_ledger else RememberingLedger(ledger),
        host=ProcHost(),
        clock=SystemClock(),
    )
    if isinstance(units, systemd.SystemdUnits):
        from gpushift.host.hookunits import SystemdHookRunner

        ports.hooks = SystemdHookRunner(units, config.daemon.runtime_dir)  # [hooks]: transient units
    if config.frontdoor is not None and bus is not None:
        from gpushift.host.frontdoor import BusFrontDoor

        # [frontdoor]: the drain closes the old backend there, a switch's end releases the held
        # requests, the sampler asks its status (docs/frontdoor.md); without the table, never called
        ports.frontdoor = BusFrontDoor(bus, config.frontdoor.bus_timeout_s, log=log or NULL_LOG)
    return Components(config=config, ports=ports, bus=bus)


def compose_status(
    config: Config, sample: Sample, now_mono: float, daemon: dict[str, Any], ledger: LedgerView
) -> dict[str, Any]:
    """Everything `gpushift status` shows, as one JSON-able dict, from a sample and a ledger view.

    The one composition of the status report: the daemon feeds it its sampler's latest sample and
    the ledger view it keeps in memory (no I/O), the CLI a one-shot read of its own.  Every part
    that cannot be read says so in its own ``error`` field instead of failing the whole.
    """
    part = to_status(sample, now_mono)
    active = part["active"]
    last = ledger.last()
    last_dict = last.to_dict() if last else None
    if last_dict:
        extra = last_dict.get("extra") or {}
        for k in ("vram", "gpu_facts", "extra"):
            last_dict.pop(k, None)
        if isinstance(extra.get("warmup"), dict):
            last_dict["warmup"] = extra["warmup"]  # the proof of inference of the last launch
        if isinstance(extra.get("instances"), list):  # a backend of several: each instance's outcome
            last_dict["instances"] = [
                {k: e.get(k) for k in ("unit", "gpus", "port", "outcome", "phase", "error")}
                for e in extra["instances"]
                if isinstance(e, dict)
            ]
    since = ledger.since(active) if active and active != OFF else None
    out: dict[str, Any] = {
        "daemon": daemon,
        "active": active,
        "active_reason": part["active_reason"],
        "running": part["running"],
        "since": since.isoformat() if since else None,
        "backends": part["backends"],
        "gpus": part["gpus"],
        "simulated": part["simulated"],
        "last_switch": last_dict,
        "ledger": dict(ledger.health),
        "version": __version__,
        "config": config.path,
        "now": datetime.now().astimezone().isoformat(timespec="seconds"),
        "sample": part["sample"],
    }
    if "warning" in part:
        out["warning"] = part["warning"]
    if config.frontdoor is not None:  # what the front door's Status() said at the last sample
        out["frontdoor"] = frontdoor_entry(sample, now_mono, config.frontdoor.listen)
    return out


def status_report(c: Components, daemon: dict[str, Any]) -> dict[str, Any]:
    """The status report from a one-shot read of units, health, GPUs and ledger (the CLI's own view
    while the daemon is down): the same fields as the daemon's."""
    from gpushift.sampler.sampler import Sampler

    sample = Sampler(c.config, c.ports).sample_once()
    return compose_status(c.config, sample, c.ports.clock.monotonic(), daemon, c.ledger_view())

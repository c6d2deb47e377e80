"""Composition: build every adapter from the config, and compose the status report.

Used by the daemon (which owns the switch) and by the CLI when the daemon is down (it then reads
what it can itself: units, GPUs, ledger).  Sits between the adapters and the two entry points.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from . import __version__
from .config import Config
from .errors import GpushiftError, SystemdError
from .model import OFF, GateState, Outcome
from .ports import BackendProbe, Clock, GpuProbe, Host, Ledger, UnitControl


@dataclass
class Components:
    config: Config
    units: UnitControl
    gpu: GpuProbe
    probe: BackendProbe
    ledger: Ledger
    host: Host
    clock: Clock
    bus: Any = None


def make_gpu(config: Config) -> GpuProbe:
    if config.gpu.provider == "simulated":
        from .adapters.simgpu import SimulatedGpuProbe

        return SimulatedGpuProbe(config)
    from .adapters.nvml import NvmlGpuProbe

    return NvmlGpuProbe()


def make_ledger(config: Config, log: Any = None, readonly: bool = False) -> Ledger:
    from .adapters.ledger import SqliteLedger

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
    from .adapters import systemd as systemd
    from .adapters.bus import connect
    from .adapters.host import ProcHost, SystemClock
    from .adapters.http_probe import HttpBackendProbe

    units: UnitControl
    bus = None
    try:
        bus = connect(config.daemon.bus)
        units = systemd.SystemdUnits(bus)
    except GpushiftError as e:
        if not tolerate_no_bus:
            raise
        units = UnreachableUnits(f"systemd not reachable: {e}")
    return Components(
        config=config,
        units=units,
        gpu=make_gpu(config),
        probe=HttpBackendProbe(),
        ledger=make_ledger(config, log, readonly_ledger),
        host=ProcHost(),
        clock=SystemClock(),
        bus=bus,
    )


def _since(ledger: Ledger, active: str) -> str | None:
    """When ``active`` last became the serving backend, from the ledger."""
    try:
        rows = ledger.list(limit=50)
    except Exception:
        return None
    for r in rows:
        if r.outcome == Outcome.OK.value and r.to_backend == active and r.finished_at:
            return r.finished_at.isoformat()
        if r.outcome == Outcome.ROLLED_BACK.value and r.from_backend == active and r.finished_at:
            return r.finished_at.isoformat()
    return None


def status_report(c: Components, daemon: dict[str, Any], health_timeout_s: float = 0.5) -> dict[str, Any]:
    """Everything `gpushift status` shows, as one JSON-able dict.

    Every part that cannot be read says so in its own ``error`` field instead of failing the whole.
    """
    cfg = c.config
    backends: dict[str, Any] = {}
    running: list[str] = []
    for name, b in cfg.backends.items():
        entry: dict[str, Any] = {"unit": b.unit, "kind": b.kind, "gpus": list(b.gpus) if b.gpus else "all"}
        try:
            st = c.units.state(b.unit)
            entry.update(
                load_state=st.load_state,
                active_state=st.active_state,
                sub_state=st.sub_state,
                result=st.result,
                main_pid=st.main_pid or None,
            )
            if st.running:
                running.append(name)
                h = c.probe.health(b.health_url, health_timeout_s)
                entry["health"] = {"ok": h.ok, "status": h.status, "detail": h.detail[:120]}
            else:
                entry["health"] = None
        except GpushiftError as e:
            entry["error"] = str(e)
        backends[name] = entry
    gpus: list[dict[str, Any]] = []
    try:
        for r in c.gpu.read(None):
            d = r.to_dict()
            d["state"] = r.state(cfg.gpu.residual_mib).value
            d["simulated"] = c.gpu.simulated
            if c.gpu.simulated:
                d["name"] = d["name"] if "SIMULATED" in d["name"] else f"SIMULATED {d['name']}"
            gpus.append(d)
    except Exception as e:
        gpus = [{"error": f"cannot read GPUs: {e!r}", "state": GateState.UNKNOWN.value}]
    last: dict[str, Any] | None = None
    ledger_health: dict[str, Any]
    try:
        rec = c.ledger.last()
        last = rec.to_dict() if rec else None
        if last:
            for k in ("vram", "gpu_facts", "extra"):
                last.pop(k, None)
        ledger_health = c.ledger.health()
    except Exception as e:
        ledger_health = {"state": "unreadable", "error": repr(e)}
    active: str | None
    unknown = any("error" in b for b in backends.values())
    if len(running) == 1:
        active = running[0]
    elif not running and not unknown:
        active = OFF
    else:
        active = None  # several run, or systemd could not be asked about some
    out: dict[str, Any] = {
        "daemon": daemon,
        "active": active,
        "running": running,
        "since": _since(c.ledger, active) if active and active != OFF else None,
        "backends": backends,
        "gpus": gpus,
        "simulated": c.gpu.simulated,
        "last_switch": last,
        "ledger": ledger_health,
        "version": __version__,
        "config": cfg.path,
        "now": datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    if len(running) > 1:
        out["warning"] = f"more than one backend is running: {', '.join(running)}"
    return out

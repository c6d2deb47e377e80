"""The ports the switcher talks through.  Adapters implement them; tests use stateful fakes.

Adapters translate foreign exceptions at their edge: a method here either returns a value or raises
a :class:`gpushift.errors.GpushiftError`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from gpushift.errors import GpushiftError
from gpushift.values import (
    GpuReading,
    Health,
    HookOutcome,
    HookSpec,
    HostGpuFacts,
    JobResult,
    SwitchRecord,
    UnitState,
    VersionInfo,
    WarmupRequest,
    WarmupResult,
)


class UnitControl(Protocol):
    """systemd, for the backend units."""

    def state(self, unit: str) -> UnitState:
        """Asked of systemd at this moment (never cached): the gate of every decision."""
        ...

    def states(self, units: Sequence[str]) -> Mapping[str, UnitState | GpushiftError]:
        """Every unit's state for a watcher that asks every period (the sampler): as current as
        :meth:`state` for what it fills in — load, active and sub state, ``result``, ``main_pid``,
        ``main_start_us``, ``exec_main_code``/``exec_main_status``, ``n_restarts`` — but the unit's
        configuration (``exec_start``, ``environment``, ``fragment_path``, ...) is left empty.
        A unit that cannot be read maps to its error; the call itself does not raise for one."""
        ...

    def start(self, unit: str, timeout_s: float) -> JobResult:
        """StartUnit and wait for the job's JobRemoved (replace mode)."""
        ...

    def stop(self, unit: str, timeout_s: float) -> JobResult:
        """StopUnit and wait for the job's JobRemoved (replace mode)."""
        ...

    def reset_failed(self, unit: str) -> None: ...

    def processes(self, unit: str) -> list[int]:
        """PIDs in the unit's cgroup (GetUnitProcesses)."""
        ...


class GpuProbe(Protocol):
    """NVML or the simulated provider."""

    simulated: bool

    def facts(self) -> HostGpuFacts: ...

    def read(self, indices: Sequence[int] | None = None, holders: bool = True) -> list[GpuReading]:
        """One reading per GPU (all GPUs when ``indices`` is None). Never raises for NVML faults:
        a GPU that cannot be read comes back with ``error`` set (state UNKNOWN).

        ``holders=False``: memory only, without naming who holds it (no ``/proc`` scan, no process
        lists) — the VRAM gate's fast polls.  A provider whose memory figure IS its holders'
        (the simulated one) may scan anyway."""
        ...


class BackendProbe(Protocol):
    """The backends' HTTP endpoints (and version commands)."""

    def health(self, url: str, timeout_s: float = 2.0) -> Health: ...

    def version(
        self, version_url: str | None, version_command: Sequence[str] | None, timeout_s: float = 5.0
    ) -> VersionInfo: ...

    def in_flight(self, backend: Any) -> int | None:
        """Requests running or waiting on the backend; None when it cannot be told."""
        ...

    def warmup(self, request: WarmupRequest) -> WarmupResult:
        """Send a warm-up request (a first completion) and time it; never raises."""
        ...

    def models(
        self, url: str, headers: Mapping[str, str], timeout_s: float = 5.0
    ) -> tuple[list[str] | None, str | None]:
        """The model names a backend's ``/v1/models`` lists (``data[].id``), or (None, why not);
        never raises."""
        ...


class Ledger(Protocol):
    """The deployment ledger (SQLite)."""

    def begin(self, record: SwitchRecord) -> int:
        """Write the intent row (before anything is stopped) and return its id."""
        ...

    def finish(self, record: SwitchRecord) -> None:
        """Complete the row ``record.id`` with everything the switch learned."""
        ...

    def mark_interrupted(self, now: datetime) -> list[int]:
        """Mark every unfinished row ``interrupted``; return their ids."""
        ...

    def last(self) -> SwitchRecord | None: ...

    def get(self, row_id: int) -> SwitchRecord | None: ...

    def list(self, limit: int = 20, **filters: Any) -> list[SwitchRecord]: ...

    def health(self) -> dict[str, Any]:
        """``{"state": "ok"|"degraded", "pending": N, "error": ...}`` for status."""
        ...


class Clock(Protocol):
    def now(self) -> datetime:
        """Aware UTC datetime."""
        ...

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class Host(Protocol):
    """What the switcher needs to know about the host's processes and files."""

    def cmdline(self, pid: int) -> list[str]:
        """The argv a process actually runs with (``/proc/PID/cmdline``); [] when gone."""
        ...

    def launch_info(self, unit: UnitState, argv: Sequence[str]) -> dict[str, Any]:
        """Unit file and drop-in hashes, environment, model file fingerprints, host facts."""
        ...

    def unit_log(self, unit: str, lines: int) -> dict[str, Any]:
        """The unit's last ``lines`` log lines from the journal (``{"source", "lines"}``; a host
        without a journal says so in ``error``).  Never raises."""
        ...


class RunStore(Protocol):
    """Where the switch in flight is written down, so that a daemon that restarts in the middle
    of it can converge (``SwitchRun.to_dict()``)."""

    def save(self, run: dict[str, Any]) -> None:
        """Write atomically and durably (fsync) before returning; raise OSError when it cannot."""
        ...

    def load(self) -> dict[str, Any] | None:
        """The unfinished run left by a previous daemon, or None."""
        ...

    def clear(self) -> None: ...


class HookRunner(Protocol):
    """Runs a configured hook outside the daemon (a transient systemd unit in production)."""

    def run(self, spec: HookSpec, cancelled: Callable[[], bool], beat: Callable[[], None]) -> HookOutcome:
        """Run ``spec`` and wait for it to end (at most its ``timeout_s``, plus the time a stop
        takes).  ``cancelled`` is asked while it waits: when it says yes the hook is stopped and
        the outcome is ``cancelled``.  ``beat`` is called at least once a second (the worker's
        heartbeat).  Never raises: a hook that cannot be run comes back as ``error``."""
        ...


class Doctor(Protocol):
    """The preflight doctor: (config, target, GPU facts) → findings (``gpushift check``'s rules).  The
    config lives in a layer above this module, which does not import it.  ``states``: the backends' units as
    the preflight just read them, by backend name (not asked again)."""

    def __call__(
        self, config: Any, target: str, facts: HostGpuFacts, states: Mapping[str, UnitState] | None = None
    ) -> Sequence[Any]: ...


class FrontDoorPort(Protocol):
    """The front door (``org.gpushift.FrontDoor1``, docs/frontdoor.md), as the daemon calls it.

    Each call is bounded by ``[frontdoor] bus_timeout_s``.  None of them raises: a front door that
    is absent, slow or failing answers None (and the adapter logs one line), so a switch never
    fails or waits longer for it; :meth:`last_error` says why for the ledger row.
    """

    timeout_s: float  # each call's deadline (``bus_timeout_s``; a reload sets it)

    def close(self, backend: str) -> int | None:
        """Stop forwarding new requests to ``backend``; the requests still in flight there."""
        ...

    def in_flight(self, backend: str) -> int | None:
        """The requests the front door has in flight on ``backend`` now."""
        ...

    def release(self, serving: str) -> tuple[int, float] | None:
        """Forward the held requests ``serving`` serves (``off``: none), answer the others, reopen
        ``serving``; (held, longest hold in seconds)."""
        ...

    def status(self) -> dict[str, Any] | None:
        """``{"listen", "held", "in_flight": {backend: n}, "closed", "daemon", "requests"}``."""
        ...

    def last_error(self, call: str) -> str | None:
        """Why the last ``call`` (``"close"``, ``"release"``, ...) answered None; None after a success."""
        ...


@dataclass
class Ports:
    """Everything a switch talks through: the real adapters (built by ``wiring``) or test fakes."""

    units: UnitControl
    gpu: GpuProbe
    probe: BackendProbe
    ledger: Ledger
    host: Host
    clock: Clock
    doctor: Doctor | None = None
    runs: RunStore | None = None
    hooks: HookRunner | None = None
    frontdoor: FrontDoorPort | None = None  # only with a [frontdoor] table


def states_one_by_one(
    state: Callable[[str], UnitState], units: Sequence[str]
) -> dict[str, UnitState | GpushiftError]:
    """:meth:`UnitControl.states` through ``state`` unit by unit, each error kept as that unit's."""
    out: dict[str, UnitState | GpushiftError] = {}
    for unit in units:
        try:
            out[unit] = state(unit)
        except GpushiftError as e:
            out[unit] = e
    return out

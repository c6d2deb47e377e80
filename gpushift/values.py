"""Plain data shared by every layer (frozen dataclasses and enums, no I/O).

Everything here is a value: a reading taken at one moment, a record of one switch.  Units of
measure are in the names (``used_mib``, ``timeout_s``, ``started_at``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

#: The reserved backend name meaning "no backend at all: every GPU free".
OFF = "off"


class StrEnum(str, enum.Enum):
    """An enum whose members are their string values everywhere: JSON, SQLite, f-strings.

    (``enum.StrEnum`` arrived in Python 3.11; 3.10 is supported, and a plain ``str`` mixin formats
    as ``Class.MEMBER`` in f-strings on 3.12.)
    """

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


# Every enum of the project lives here, in one list: later features extend these, never a copy.


class Phase(StrEnum):
    """The phases of one switch, in the order they run (rollback repeats some)."""

    PREFLIGHT = "preflight"
    INTENT = "intent"
    DRAIN = "drain"
    STOP = "stop"
    RELEASE = "release"  # the VRAM gate
    START = "start"
    READY = "ready"
    WARMUP = "warmup"  # proof of inference: a first completion answered
    VERSION = "version"
    HOOKS = "hooks"  # a configured hook runs (before_stop, after_ready, on_failure)
    ROLLBACK = "rollback"
    DONE = "done"


class Outcome(StrEnum):
    """How a switch attempt ended (the ledger's ``outcome`` column)."""

    PENDING = "pending"  # intent written, not finished yet
    OK = "ok"
    FAILED = "failed"  # target not serving, failure policy "stay" (or rollback impossible)
    ROLLED_BACK = "rolled_back"  # target failed, previous backend serves again
    REFUSED = "refused"  # preflight said no; nothing was touched
    INTERRUPTED = "interrupted"  # the daemon died mid-switch; found at the next start
    CANCELLED = "cancelled"  # a person aborted it (gpushift cancel) before anything was touched
    CRASHED = "crashed"  # the serving backend exited by itself (any exit status)
    UNHEALTHY = "unhealthy"  # the serving backend stopped answering its health URL
    CHAIN_BREAK = "chain_break"  # no switch: the ledger's database was corrupt, deleted or replaced,
    # and a new chain starts with this row (docs/ledger.md)


class Trigger(StrEnum):
    """What asked for a switch.  A free-form name (a person, a calendar exception) goes in a field
    of its own, never in here."""

    MANUAL = "manual"
    SCHEDULE = "schedule"
    RECONCILE = "reconcile"
    EXTERNAL = "external"  # somebody used systemctl behind gpushift's back
    ROLLBACK = "rollback"
    RECOVERY = "recovery"  # the daemon converging after its own restart, a crash or a wedged backend
    WATCH = "watch"  # the daemon noticed, between switches, that the serving backend crashed or wedged


class Mode(StrEnum):
    """Who decides what runs: the schedule, or a person's choice that the schedule waits for."""

    SCHEDULE = "schedule"
    OVERRIDE = "override"  # a person's (or systemctl's) choice until a time, usually the next boundary
    HOLD = "hold"  # a person's choice until `gpushift resume`
    MANUAL = "manual"  # no schedule configured: gpushift switches only when asked


class OverrideSource(StrEnum):
    """Where an override came from."""

    MANUAL = "manual"  # gpushift switch
    EXTERNAL = "external"  # a unit started or stopped with systemctl


class BackendKind(StrEnum):
    """The built-in kinds' names; the kinds themselves are the rows of gpushift.backends.kinds.KINDS."""

    GENERIC = "generic"
    VLLM = "vllm"
    LLAMA_SERVER = "llama-server"


class HookEvent(StrEnum):
    """When a configured hook runs (``[hooks]``, docs/hooks.md)."""

    BEFORE_STOP = "before_stop"  # after the intent row, before anything is stopped (may refuse)
    AFTER_READY = "after_ready"  # the target answered its warm-up, before the row is closed
    ON_FAILURE = "on_failure"  # a switch ended failed, rolled back or refused
    BEFORE_BOUNDARY = "before_boundary"  # lead_s before a scheduled switch (the look-ahead)


class EventKind(StrEnum):
    """What a switch listener hears: a phase's progress, or the end."""

    PROGRESS = "progress"
    FINISHED = "finished"


class GateState(StrEnum):
    """What one GPU reading says about the VRAM gate."""

    RELEASED = "released"
    HELD = "held"
    UNKNOWN = "unknown"  # NVML error, unreadable /proc: never treated as released


@dataclass(frozen=True)
class Holder:
    """A live process that has a GPU's device file open.

    ``used_mib`` is what the provider attributes to it (NVML's per-process figure, or the
    simulated amount); ``None`` when the provider cannot say (it may still hold memory).
    """

    pid: int
    user: str
    command: str  # short name (comm), e.g. "python"
    cmdline: tuple[str, ...] = ()
    unit: str | None = None  # systemd unit from its cgroup, e.g. "gpushift-vllm.service"
    used_mib: float | None = None

    def describe(self) -> str:
        """One phrase naming the process for a person: ``pid 4242 (python, user bob)``."""
        where = f", unit {self.unit}" if self.unit else ""
        return f"pid {self.pid} ({self.command}, user {self.user}{where})"


@dataclass(frozen=True)
class GpuInfo:
    """Static facts of one GPU (they go into the ledger)."""

    index: int
    name: str
    uuid: str
    total_mib: float
    compute_capability: tuple[int, int] | None = None
    ecc_enabled: bool | None = None
    ecc_uncorrected: int | None = None
    ecc_corrected: int | None = None


@dataclass(frozen=True)
class HostGpuFacts:
    """Driver-level facts plus every GPU; ``simulated`` marks the simulated provider."""

    simulated: bool
    driver_version: str | None
    cuda_version: str | None
    gpus: tuple[GpuInfo, ...]
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "simulated": self.simulated,
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "error": self.error,
            "gpus": [
                {
                    "index": g.index,
                    "name": g.name,
                    "uuid": g.uuid,
                    "total_mib": g.total_mib,
                    "compute_capability": (
                        f"{g.compute_capability[0]}.{g.compute_capability[1]}"
                        if g.compute_capability
                        else None
                    ),
                    "ecc_enabled": g.ecc_enabled,
                    "ecc_uncorrected": g.ecc_uncorrected,
                    "ecc_corrected": g.ecc_corrected,
                }
                for g in self.gpus
            ],
        }


@dataclass(frozen=True)
class GpuReading:
    """Memory on one GPU at one moment, and who has it open.

    ``used_mib`` is ``None`` when it could not be read; ``error`` then says why and the reading is
    UNKNOWN.  The holders name who has the device open; ``holders_complete`` is False when some
    process's open files could not be read (``unreadable_pids``), so the list may miss somebody.
    The gate decides on memory alone: the holder list explains a HELD reading, it decides nothing.
    """

    index: int
    name: str
    total_mib: float
    used_mib: float | None
    holders: tuple[Holder, ...] = ()
    holders_complete: bool = True
    error: str | None = None
    unreadable_pids: tuple[int, ...] = ()

    def state(self, residual_mib: float) -> GateState:
        """RELEASED only when the memory figure is known and at or below the residual."""
        if self.error is not None or self.used_mib is None:
            return GateState.UNKNOWN
        return GateState.RELEASED if self.used_mib <= residual_mib else GateState.HELD

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "total_mib": self.total_mib,
            "used_mib": self.used_mib,
            "error": self.error,
            "holders_complete": self.holders_complete,
            "unreadable_pids": list(self.unreadable_pids),
            "holders": [
                {
                    "pid": h.pid,
                    "user": h.user,
                    "command": h.command,
                    "cmdline": list(h.cmdline),
                    "unit": h.unit,
                    "used_mib": h.used_mib,
                }
                for h in self.holders
            ],
        }


@dataclass(frozen=True)
class UnitState:
    """What systemd says about one unit right now."""

    name: str
    load_state: str  # loaded | not-found | bad-setting | error | masked
    active_state: str  # active | activating | deactivating | inactive | failed
    sub_state: str
    result: str = "success"  # Service.Result: success | exit-code | signal | timeout | ...
    main_pid: int = 0
    exec_start: tuple[str, ...] = ()  # argv as written in the unit (${VAR} unexpanded)
    fragment_path: str = ""
    drop_in_paths: tuple[str, ...] = ()
    environment: tuple[str, ...] = ()  # "KEY=value" from Environment=
    environment_files: tuple[tuple[str, bool], ...] = ()  # EnvironmentFile=: (path, may be missing)
    working_directory: str = ""
    user: str = ""
    kill_mode: str = ""
    send_sigkill: bool = True
    timeout_stop_usec: int = 0
    conflicts: tuple[str, ...] = ()
    main_start_us: int = 0  # ExecMainStartTimestamp: when the main process (MainPID) started
    exec_main_code: int = 0  # how the last main process ended: 1 exited, 2 killed, 3 dumped core (CLD_*)
    exec_main_status: int = 0  # its exit status, or the signal number when killed
    n_restarts: int = 0  # NRestarts: restarts systemd made by itself (Restart=)
    control_group: str = ""  # ControlGroup ("" without a process): who may answer as it (backends/served.py)

    @property
    def running(self) -> bool:
        """Active or on its way: a switch must stop it (a unit in ``auto-restart`` counts too)."""
        return self.active_state in ("active", "activating", "reloading")

    @property
    def exited(self) -> bool:
        """Not serving by itself: inactive, failed, or waiting for systemd's ``Restart=``."""
        return self.active_state in ("inactive", "failed") or self.sub_state == "auto-restart"

    def exit_description(self) -> str:
        """``exit status 0`` / ``killed by signal 9`` / ``dumped core (signal 11)``, with the Result."""
        code = {1: "exit status", 2: "killed by signal", 3: "dumped core, signal"}.get(self.exec_main_code)
        how = f"{code} {self.exec_main_status}" if code else "no exit recorded"
        return f"{how}, Result={self.result}"

    @property
    def failed(self) -> bool:
        return self.active_state == "failed"


@dataclass(frozen=True)
class JobResult:
    """The end of one systemd job: ``result`` is JobRemoved's string (``done`` = success)."""

    unit: str
    job: str
    result: str

    @property
    def ok(self) -> bool:
        # Every result but done/skipped is a failure (systemd has more than the man page lists).
        return self.result in ("done", "skipped")


@dataclass(frozen=True)
class Health:
    """One poll of a backend's health URL."""

    ok: bool
    status: int | None  # HTTP status; None when the connection failed
    detail: str = ""
    foreign: Mapping[str, Any] | None = None  # not the unit's process answered (backends/served.py)


@dataclass(frozen=True)
class WarmupRequest:
    """A first inference request after a backend answers its health URL (proof it serves).

    ``models_url``: ask it first for the served model's name (vLLM's ``/v1/models``) and put it in
    the body's ``model``.  ``headers`` may carry the backend's API key: never log or record them.
    """

    url: str
    body: dict[str, Any]
    stream: bool
    expect_status: int = 200
    timeout_s: float = 60.0
    models_url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WarmupResult:
    """How the warm-up request went: time to the first streamed chunk and to the end."""

    ok: bool
    status: int | None
    detail: str = ""
    ttft_s: float | None = None  # first chunk (or the whole answer, not streamed)
    total_s: float | None = None
    chunks: int = 0
    foreign: Mapping[str, Any] | None = None  # as Health.foreign: not the backend's process

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok, "status": self.status, "detail": self.detail}
        out.update(ttft_s=self.ttft_s, total_s=self.total_s, chunks=self.chunks)
        return out if self.foreign is None else {**out, "foreign": dict(self.foreign)}


@dataclass(frozen=True)
class HookSpec:
    """One hook to run: ``argv`` exactly as written (no shell, no expansion), as ``user``, with
    ``env`` added to its environment, under a deadline; ``name`` is its transient unit's name."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    user: str
    timeout_s: float


@dataclass(frozen=True)
class HookOutcome:
    """How a hook ended.  ``result`` is systemd's ``Result`` of its unit (``success``,
    ``exit-code``, ``signal``, ``timeout``, ...), or ``cancelled`` (stopped by a cancel) or
    ``error`` (it could not be run: ``error`` says why).  ``output``: the last characters of its
    stdout and stderr, escaped and redacted."""

    unit: str
    result: str
    exit_status: int | None = None
    output: str = ""
    seconds: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.result == "success"

    def describe(self) -> str:
        """``exit status 7``, ``timed out``, ``killed by signal 9``, ``could not run: ...``."""
        if self.ok:
            return "exit status 0"
        if self.result == "exit-code":
            return f"exit status {self.exit_status}"
        if self.result == "timeout":
            return "timed out"
        if self.result in ("signal", "core-dump"):
            return f"killed by signal {self.exit_status}"
        if self.result == "cancelled":
            return "stopped by a cancel"
        if self.result == "error":
            return f"could not run: {self.error}"
        return f"failed ({self.result})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "result": self.result,
            "exit_status": self.exit_status,
            "seconds": round(self.seconds, 3),
            "output": self.output,
            "error": self.error,
        }


@dataclass(frozen=True)
class VersionInfo:
    """A backend's version and how it was learned (``url``, ``command`` or ``none``)."""

    version: str | None
    source: str
    raw: str = ""
    foreign: Mapping[str, Any] | None = None  # as Health.foreign: the version is then None


@dataclass(frozen=True)
class Caller:
    """Who asked for a switch (read from the bus, or the daemon itself)."""

    uid: int | None
    user: str
    pid: int | None = None

    @staticmethod
    def daemon() -> Caller:
        return Caller(uid=None, user="gpushift", pid=None)


@dataclass
class SwitchRecord:
    """Everything the ledger keeps about one switch attempt.

    Mutable while the switch runs (the switcher fills it phase by phase); the ledger stores it as
    the intent row first and again at the end.
    """

    trigger: str
    requested_by: str
    reason: str
    from_backend: str | None
    to_backend: str
    started_at: datetime
    ticket: str = ""
    uid: int | None = None
    id: int | None = None
    finished_at: datetime | None = None
    outcome: str = Outcome.PENDING.value
    failed_phase: str | None = None
    message: str | None = None
    unit: str | None = None
    unit_path: str | None = None
    unit_sha256: str | None = None
    argv_configured: list[str] = field(default_factory=list)
    argv_running: list[str] = field(default_factory=list)
    systemd_result: str | None = None
    backend_version: str | None = None
    version_source: str | None = None
    gpushift_version: str = ""
    gpu_facts: dict[str, Any] = field(default_factory=dict)
    vram: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # phase -> readings
    durations_s: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    extra: dict[str, Any] = field(default_factory=dict)  # later issues add fields here

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ticket": self.ticket,
            "trigger": self.trigger,
            "requested_by": self.requested_by,
            "uid": self.uid,
            "reason": self.reason,
            "from": self.from_backend,
            "to": self.to_backend,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            "outcome": self.outcome,
            "failed_phase": self.failed_phase,
            "message": self.message,
            "unit": self.unit,
            "unit_path": self.unit_path,
            "unit_sha256": self.unit_sha256,
            "argv": self.argv_running or self.argv_configured,
            "argv_configured": self.argv_configured,
            "argv_running": self.argv_running,
            "systemd_result": self.systemd_result,
            "backend_version": self.backend_version,
            "version_source": self.version_source,
            "gpushift_version": self.gpushift_version,
            "gpu_facts": self.gpu_facts,
            "vram": self.vram,
            "durations_s": self.durations_s,
            "extra": self.extra,
        }

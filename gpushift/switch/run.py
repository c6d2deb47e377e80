"""One switch as plain data — the run while it goes, the result when it ends.

A :class:`SwitchRun` is everything one switch knows about itself: who asked for what and why,
the phase it is in, what it has stopped and started so far, whether somebody asked to cancel it,
and its ledger row.  It is owned by the switcher while it runs, and it serialises to JSON
(:meth:`SwitchRun.to_dict` / :meth:`SwitchRun.from_dict`) so that it can be written down at the
points that matter and read back by a daemon that restarts in the middle of it.

Beside what is written down, the run holds what only lives while it goes: its :class:`Plan` (what
the preflight decided, with the ledger row being built — its timings, VRAM readings and evidence),
the last state written to the run store, and at its end its :class:`SwitchResult` and when it
ended.  Its phase changes only through :meth:`SwitchRun.advance`, which checks the transition
table (:mod:`gpushift.switch.phases`); only the switcher (:mod:`gpushift.switch.machine`, with its
steps, preflight, hooks and failure policy) changes a run.

It ends in a :class:`SwitchResult`: a typed outcome instead of a dict, and the D-Bus ``Finished``
signal carries its :meth:`SwitchResult.to_dict`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpushift.config.schema import BackendConfig
from gpushift.errors import SwitchFailed
from gpushift.switch.phases import TransitionError, allowed
from gpushift.values import OFF, EventKind, Outcome, Phase, SwitchRecord, Trigger


class StepFailed(Exception):
    """A step of a switch did not work out: the phase, the message and what systemd said.

    ``cancelled`` marks a person's ``gpushift cancel`` (never recognised by its message).
    ``foreign``: a process outside the backend's unit answered on its port (who it was; the row
    keeps it as ``extra["foreign_answer"]``).
    """

    def __init__(
        self,
        phase: Phase,
        message: str,
        systemd_result: str | None = None,
        vram: bool = False,
        cancelled: bool = False,
        foreign: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.phase = phase
        self.message = message
        self.systemd_result = systemd_result
        self.vram = vram
        self.cancelled = cancelled
        self.foreign = foreign


@dataclass
class Plan:
    """What one switch will do, decided in its preflight (with the row it fills as it goes)."""

    record: SwitchRecord
    running: list[str]  # backends running now, in config order
    to_stop: list[str]  # those the switch stops
    watched: tuple[int, ...]  # GPUs the VRAM gate watches
    target: BackendConfig | None  # None for "off"
    target_running: bool  # the target already runs beside others: keep it
    refusal: str | None = None  # why the switch is refused (nothing touched)
    refusal_error: str = SwitchFailed.dbus_name()
    # The backends the front door was told to close at the drain, with the requests it still had
    # in flight there (None: it did not answer); switch/frontdoor.py
    closed: dict[str, int | None] = field(default_factory=dict)


@dataclass
class SwitchRun:
    """The state of one switch while it runs (plain data; JSON round trip)."""

    ticket: str
    target: str
    trigger: Trigger
    requested_by: str
    reason: str
    started_at: datetime
    started_mono: float
    uid: int | None = None
    skip_drain: bool = False
    relaunch: bool = False  # the target runs: stop it and start it again through the gate (--restart)
    verify_running: bool = False  # the target runs: prove it answers and record its launch (recovery)
    recovery_attempt: int = 0  # recoveries in a row (the daemon died during the previous ones)
    phase: Phase = Phase.PREFLIGHT
    detail: str = ""
    previous: list[str] = field(default_factory=list)  # backends running when it began
    stopping: list[str] = field(default_factory=list)  # those this run stops
    touched: bool = False  # something was stopped or started
    cancel_requested_by: str | None = None  # asked for and not yet honoured
    cancelled_by: str | None = None  # honoured: the switch ended (or rolled back) because of it
    ledger_id: int | None = None
    rollback_to: str | None = None  # set once the failure policy rolls back
    details: dict[str, str] = field(default_factory=dict)  # facts for the row's extra (named keys)
    restart_instances: list[str] = field(default_factory=list)  # verify_running: hung ones restarted
    # --- while it runs, never written down (not in to_dict):
    plan: Plan | None = field(default=None, compare=False, repr=False)  # from the preflight on
    persisted: dict[str, Any] | None = field(default=None, compare=False, repr=False)  # last written
    # --- once it ended:
    result: SwitchResult | None = field(default=None, compare=False, repr=False)
    ended_mono: float | None = field(default=None, compare=False, repr=False)

    @property
    def record(self) -> SwitchRecord | None:
        """The ledger row this run fills (None before its preflight)."""
        return self.plan.record if self.plan is not None else None

    def advance(self, phase: Phase, detail: str, force: bool = False) -> bool:
        """Go to ``phase`` (with its detail line); True when that is a transition (a new phase).

        Raises:
            TransitionError: the table (:mod:`gpushift.switch.phases`) does not allow it (not with
                ``force``: the daemon's switcher logs the error and goes on).
        """
        was = self.phase
        if not force and not allowed(was, phase):
            raise TransitionError(self.ticket, was, phase)
        self.phase = phase
        self.detail = detail
        return was is not phase

    @property
    def cancel_requested(self) -> bool:
        return self.cancel_requested_by is not None

    @property
    def from_backend(self) -> str | None:
        return self.previous[0] if self.previous else None

    def progress(self, now_mono: float) -> dict[str, Any]:
        """The switch in flight, as ``gpushift status`` shows it."""
        return {
            "ticket": self.ticket,
            "to": self.target,
            "from": self.from_backend,
            "requested_by": self.requested_by,
            "trigger": self.trigger.value,
            "reason": self.reason,
            "phase": self.phase.value,
            "detail": self.detail,
            "elapsed_s": round(now_mono - self.started_mono, 1),
            "ledger_id": self.ledger_id,
            "cancel_requested_by": self.cancel_requested_by,
            "rollback_to": self.rollback_to,
            "recovery_attempt": self.recovery_attempt,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "ticket": self.ticket,
            "target": self.target,
            "trigger": self.trigger.value,
            "requested_by": self.requested_by,
            "reason": self.reason,
            "started_at": self.started_at.isoformat(),
            "started_mono": self.started_mono,
            "uid": self.uid,
            "skip_drain": self.skip_drain,
            "relaunch": self.relaunch,
            "verify_running": self.verify_running,
            "recovery_attempt": self.recovery_attempt,
            "phase": self.phase.value,
            "detail": self.detail,
            "previous": list(self.previous),
            "stopping": list(self.stopping),
            "touched": self.touched,
            "cancel_requested_by": self.cancel_requested_by,
            "cancelled_by": self.cancelled_by,
            "ledger_id": self.ledger_id,
            "rollback_to": self.rollback_to,
            "details": dict(self.details),
            "restart_instances": list(self.restart_instances),
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SwitchRun:
        return SwitchRun(
            ticket=str(d["ticket"]),
            target=str(d["target"]),
            trigger=Trigger(d["trigger"]),
            requested_by=str(d["requested_by"]),
            reason=str(d.get("reason", "")),
            started_at=datetime.fromisoformat(str(d["started_at"])),
            started_mono=float(d.get("started_mono", 0.0)),
            uid=None if d.get("uid") is None else int(d["uid"]),
            skip_drain=bool(d.get("skip_drain", False)),
            relaunch=bool(d.get("relaunch", False)),
            verify_running=bool(d.get("verify_running", False)),
            recovery_attempt=int(d.get("recovery_attempt", 0)),
            phase=Phase(d.get("phase", Phase.PREFLIGHT.value)),
            detail=str(d.get("detail", "")),
            previous=[str(x) for x in d.get("previous") or []],
            stopping=[str(x) for x in d.get("stopping") or []],
            touched=bool(d.get("touched", False)),
            cancel_requested_by=d.get("cancel_requested_by"),
            cancelled_by=d.get("cancelled_by"),
            ledger_id=None if d.get("ledger_id") is None else int(d["ledger_id"]),
            rollback_to=d.get("rollback_to"),
            details={str(k): str(v) for k, v in (d.get("details") or {}).items()},
            restart_instances=[str(u) for u in d.get("restart_instances") or []],
        )


@dataclass(frozen=True)
class SwitchResult:
    """How one switch ended.  ``error`` is the D-Bus error name a failed switch maps to."""

    ticket: str
    ok: bool
    outcome: Outcome
    to_backend: str
    from_backend: str | None = None
    message: str = ""
    failed_phase: Phase | None = None
    systemd_result: str | None = None
    ledger_id: int | None = None
    backend_version: str | None = None
    durations_s: dict[str, float] = field(default_factory=dict)
    touched: bool = False
    error: str | None = None
    already: bool = False  # the target was already serving: nothing to do
    internal_error: bool = False  # a bug ended the switch
    cancelled_by: str | None = None  # a person's cancel ended it (then it rolled back or stopped)

    def established_after(self, before: str | None) -> str | None:
        """What runs after this switch, as far as gpushift made it so (None: ask systemd)."""
        if self.internal_error:
            return None  # a bug ended the switch somewhere: adopt what systemd says next
        if self.outcome is Outcome.OK:
            return self.to_backend
        if not self.touched or self.outcome is Outcome.REFUSED:
            return before  # refused or cancelled before any stop or start: all is as it was
        if self.outcome is Outcome.ROLLED_BACK:
            return self.from_backend or OFF
        if self.failed_phase in (None, Phase.STOP):
            return None  # unknown (a failed stop): adopt what systemd says next
        return OFF  # failed: everything was left stopped

    def to_dict(self) -> dict[str, Any]:
        """The JSON of the D-Bus ``Finished`` signal and of ``gpushift switch --json``."""
        out: dict[str, Any] = {
            "ticket": self.ticket,
            "ok": self.ok,
            "outcome": self.outcome.value,
            "from": self.from_backend,
            "to": self.to_backend,
            "message": self.message,
            "failed_phase": self.failed_phase.value if self.failed_phase else None,
            "systemd_result": self.systemd_result,
            "ledger_id": self.ledger_id,
            "backend_version": self.backend_version,
            "durations_s": dict(self.durations_s),
            "touched": self.touched,
        }
        if self.error:
            out["error"] = self.error
        if self.already:
            out["already"] = True
        if self.internal_error:
            out["internal_error"] = True
        if self.cancelled_by:
            out["cancelled_by"] = self.cancelled_by
        return out


@dataclass(frozen=True)
class Event:
    """One thing a listener hears about a switch: a phase's progress, or its end (``result``).

    Every transition of the table is one of these events (``was`` names the phase it left): the
    first progress event of a phase, and the ``finished`` one (to ``done``)."""

    ticket: str
    kind: EventKind
    phase: Phase
    detail: str
    elapsed_s: float
    result: SwitchResult | None = None
    was: Phase | None = None  # the phase this event's transition left (None: no transition)

    @property
    def ok(self) -> bool:
        return self.result is not None and self.result.ok

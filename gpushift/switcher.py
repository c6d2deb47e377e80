"""L3: the switch state machine — the one writer of "what runs on the GPUs".

One switch at a time: :meth:`Switcher.request` validates, takes the slot under a lock and returns a
ticket at once; the switch itself runs on a worker thread and reports every phase through the
``listener`` callback (the D-Bus service turns those into ``Progress``/``Finished`` signals).

The order of a switch and why (see docs/design.md for the diagram):

preflight → ledger intent row → drain → stop (wait for the job) → VRAM gate → start (wait for the
job) → readiness (health 200, unit watched) → version probe → ledger row completed.

Every read that gates a change is asked of systemd / the GPU provider at that moment, never taken
from a cache.  Failures after the intent row follow ``daemon.on_failure`` (rollback | stay).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import BackendConfig, Config
from .errors import (
    GpushiftError,
    NothingToCancel,
    SwitchFailed,
    SwitchInProgress,
    UnknownBackend,
    VramNotReleased,
)
from .model import (
    OFF,
    Caller,
    GpuReading,
    HostGpuFacts,
    Outcome,
    Phase,
    SwitchRecord,
    Trigger,
    UnitState,
)
from .policy import foreign_memory, gate, gate_gpus, running_backends
from .ports import BackendProbe, Clock, GpuProbe, Host, Ledger, UnitControl


@dataclass(frozen=True)
class Event:
    """One thing a listener hears about a switch (``kind`` is ``progress`` or ``finished``)."""

    ticket: str
    kind: str
    phase: str
    detail: str
    elapsed_s: float
    ok: bool = False
    result: dict[str, Any] = field(default_factory=dict)


@dataclass
class Progress:
    """The switch in flight, as status shows it."""

    ticket: str
    target: str
    previous: list[str]
    caller: str
    trigger: str
    reason: str
    started_mono: float
    phase: str = Phase.PREFLIGHT.value
    detail: str = ""
    ledger_id: int | None = None

    def to_dict(self, now_mono: float) -> dict[str, Any]:
        return {
            "ticket": self.ticket,
            "to": self.target,
            "from": self.previous[0] if self.previous else None,
            "requested_by": self.caller,
            "trigger": self.trigger,
            "reason": self.reason,
            "phase": self.phase,
            "detail": self.detail,
            "elapsed_s": round(now_mono - self.started_mono, 1),
            "ledger_id": self.ledger_id,
        }


class _Failure(Exception):
    """A switch step did not work out: carries the phase and what systemd said."""

    def __init__(
        self, phase: Phase, message: str, systemd_result: str | None = None, vram: bool = False
    ) -> None:
        super().__init__(message)
        self.phase = phase
        self.message = message
        self.systemd_result = systemd_result
        self.vram = vram


Listener = Callable[[Event], None]

#: Finished results kept for ``result(ticket)`` (the keeper reads its own scheduled switches').
_KEEP_RESULTS = 64


class Switcher:
    """Owns every change of the running backend.

    Args:
        config: the validated config (replaced by :meth:`reconfigure` on reload).
        units, gpu, probe, ledger, host, clock: the ports (real adapters or test fakes).
        listener: called with every :class:`Event`, on the worker thread.
        log: a structlog-like logger (``log.info("event", key=value)``).
        version: gpushift's version, recorded in the ledger.
    """

    def __init__(
        self,
        config: Config,
        units: UnitControl,
        gpu: GpuProbe,
        probe: BackendProbe,
        ledger: Ledger,
        host: Host,
        clock: Clock,
        listener: Listener | None = None,
        log: Any = None,
        version: str = "",
        doctor: Callable[[Config, str, HostGpuFacts], Sequence[Any]] | None = None,
    ) -> None:
        self.config = config
        self.doctor = doctor
        self.units = units
        self.gpu = gpu
        self.probe = probe
        self.ledger = ledger
        self.host = host
        self.clock = clock
        self.listeners: list[Listener] = [listener] if listener else []
        self.log = log if log is not None else _NullLog()
        self.version = version
        self._lock = threading.Lock()
        self._current: Progress | None = None
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()
        self._cancelled_by: str = ""
        self._results: dict[str, dict[str, Any]] = {}
        # What gpushift itself last established (None: not known yet; adopt what runs).  Anything
        # else found running later was changed behind our back (the keeper's "external" rule).
        self._established: str | None = None
        self._phase = Phase.PREFLIGHT
        self._touched = False
        self._rec: SwitchRecord | None = None
        self.heartbeat = clock.monotonic()  # the worker touches it while it runs (watchdog)

    # ----------------------------------------------------------------- queries

    def reconfigure(self, config: Config) -> None:
        """Take a new config (on reload); a switch in flight keeps the one it started with."""
        self.config = config

    def current(self) -> Progress | None:
        with self._lock:
            return self._current

    def running_backends(self, config: Config | None = None) -> list[str]:
        """Configured backends whose unit systemd reports as running right now, in config order."""
        cfg = config or self.config
        return running_backends({name: self.units.state(b.unit).running for name, b in cfg.backends.items()})

    def result(self, ticket: str) -> dict[str, Any] | None:
        return self._results.get(ticket)

    def snapshot(self) -> tuple[bool, str | None]:
        """(a switch is running, the backend gpushift last established) — read atomically."""
        with self._lock:
            return self._current is not None, self._established

    def adopt(self, backend: str, force: bool = False) -> None:
        """Take what runs as established (daemon start: a new daemon adopts what it finds).

        ``force`` replaces a known value (a backend that crashed by itself is now "off").
        """
        with self._lock:
            if self._current is None and (force or self._established is None):
                self._established = backend

    def note_external(self, from_backend: str, to_backend: str) -> None:
        """Record a change made outside gpushift (systemctl) in the ledger and adopt it."""
        now = self.clock.now()
        rec = SwitchRecord(
            trigger=Trigger.EXTERNAL.value,
            requested_by="systemctl",
            reason=f"{from_backend} -> {to_backend} changed outside gpushift; not undone before the next boundary",
            from_backend=from_backend,
            to_backend=to_backend,
            started_at=now,
            finished_at=now,
            outcome=Outcome.OK.value,
            gpushift_version=self.version,
            ticket="external-" + uuid.uuid4().hex[:8],
        )
        b = self.config.backends.get(to_backend)
        if b is not None:
            st = self.units.state(b.unit)
            rec.unit = b.unit
            rec.unit_path = st.fragment_path or None
            rec.argv_configured = list(st.exec_start)
            rec.argv_running = self.host.cmdline(st.main_pid) if st.main_pid else []
        rec.id = self.ledger.begin(rec)
        self.ledger.finish(rec)
        with self._lock:
            self._established = to_backend

    # ----------------------------------------------------------------- requests

    def request(
        self,
        target: str,
        reason: str,
        caller: Caller,
        trigger: Trigger = Trigger.MANUAL,
        skip_drain: bool = False,
    ) -> str:
        """Queue a switch to ``target`` and return its ticket at once.

        Raises:
            UnknownBackend: ``target`` is neither a configured backend nor ``off``.
            SwitchInProgress: another switch runs; the message names it.
        """
        config = self.config
        if target != OFF and target not in config.backends:
            known = ", ".join([*config.backends, OFF])
            raise UnknownBackend(f"unknown backend {target!r} (configured: {known})")
        with self._lock:
            if self._current is not None:
                c = self._current
                raise SwitchInProgress(
                    f"a switch is already running: ticket {c.ticket}, to {c.target}, "
                    f"asked by {c.caller}, phase {c.phase}"
                )
            ticket = uuid.uuid4().hex[:12]
            self._cancel.clear()
            self._cancelled_by = ""
            self._current = Progress(
                ticket=ticket,
                target=target,
                previous=[],
                caller=caller.user,
                trigger=trigger.value,
                reason=reason,
                started_mono=self.clock.monotonic(),
            )
            self._thread = threading.Thread(
                target=self._worker,
                args=(ticket, config, target, reason, caller, trigger, skip_drain),
                name=f"switch-{ticket}",
                daemon=True,
            )
            self._thread.start()
        return ticket

    def wait(self, timeout_s: float | None = None) -> None:
        """Join the worker of the switch in flight (tests and shutdown)."""
        t = self._thread
        if t is not None:
            t.join(timeout_s)

    def cancel(self, caller: Caller) -> str:
        """Abort the switch in flight; the failure policy then applies.  Returns its ticket."""
        with self._lock:
            if self._current is None:
                raise NothingToCancel("no switch is running")
            self._cancelled_by = caller.user
            self._cancel.set()
            return self._current.ticket

    # ----------------------------------------------------------------- the worker

    def _emit(self, event: Event) -> None:
        for fn in list(self.listeners):
            try:
                fn(event)
            except Exception as e:  # a listener's bug must not break the switch
                self.log.error("listener_failed", error=repr(e))

    def _progress(self, ticket: str, phase: Phase, detail: str) -> None:
        self.heartbeat = self.clock.monotonic()
        self._phase = phase
        with self._lock:
            cur = self._current
            if cur is not None and cur.ticket == ticket:
                cur.phase = phase.value
                cur.detail = detail
                started = cur.started_mono
            else:
                started = self.clock.monotonic()
        self.log.info("switch_phase", ticket=ticket, phase=phase.value, detail=detail)
        self._emit(Event(ticket, "progress", phase.value, detail, self.clock.monotonic() - started))

    def _worker(
        self,
        ticket: str,
        config: Config,
        target: str,
        reason: str,
        caller: Caller,
        trigger: Trigger,
        skip_drain: bool,
    ) -> None:
        started = self.clock.monotonic()
        try:
            result = self._switch(ticket, config, target, reason, caller, trigger, skip_drain)
        except Exception as e:  # a bug: report it, never leave the slot taken or the row pending
            self.log.exception("switch_crashed", ticket=ticket, error=repr(e))
            rec = self._rec
            if rec is not None and rec.id is not None and rec.outcome == Outcome.PENDING.value:
                rec.outcome = Outcome.FAILED.value
                rec.failed_phase = self._phase.value
                rec.message = f"internal error in phase {self._phase.value}: {e!r}"
                rec.finished_at = self.clock.now()
                try:
                    self.ledger.finish(rec)
                except Exception as e2:
                    self.log.exception("ledger_finish_failed", ticket=ticket, error=repr(e2))
            result = {
                "ticket": ticket,
                "ok": False,
                "outcome": Outcome.FAILED.value,
                "to": target,
                "message": f"internal error: {e!r}",
                "error": SwitchFailed.dbus_name(),
                "failed_phase": self._phase.value,
                "internal_error": True,
            }
        self._results[ticket] = result
        while len(self._results) > _KEEP_RESULTS:  # a long-running daemon keeps only recent ones
            del self._results[next(iter(self._results))]
        with self._lock:
            self._current = None
            self._established = _established_after(result, self._established)
        self.log.info("switch_finished", **{k: v for k, v in result.items() if k != "record"})
        self._emit(
            Event(
                ticket,
                "finished",
                Phase.DONE.value,
                str(result.get("message", "")),
                self.clock.monotonic() - started,
                ok=bool(result["ok"]),
                result=result,
            )
        )

    def _set_previous(self, ticket: str, previous: list[str], ledger_id: int | None = None) -> None:
        with self._lock:
            if self._current is not None and self._current.ticket == ticket:
                self._current.previous = list(previous)
                if ledger_id is not None:
                    self._current.ledger_id = ledger_id

    def _readings(self, indices: Sequence[int]) -> list[GpuReading]:
        return self.gpu.read(list(indices))

    def _all_gpus(self) -> tuple[int, ...]:
        return tuple(r.index for r in self.gpu.read(None))

    def _switch(
        self,
        ticket: str,
        config: Config,
        target: str,
        reason: str,
        caller: Caller,
        trigger: Trigger,
        skip_drain: bool,
    ) -> dict[str, Any]:
        clock = self.clock
        residual = config.gpu.residual_mib
        sim = self.gpu.simulated

        # --- preflight (nothing touched yet; every read is asked now)
        self._touched = False
        self._rec = None
        self._progress(ticket, Phase.PREFLIGHT, f"checking {target}")
        t0 = clock.monotonic()
        running = self.running_backends(config)
        self._set_previous(ticket, running)
        to_stop = [b for b in running if b != target]
        already = (target == OFF and not running) or (running == [target])
        if already:
            msg = (
                "no backend is running; the GPUs are free" if target == OFF else f"{target} is already active"
            )
            return {
                "ticket": ticket,
                "ok": True,
                "already": True,
                "outcome": Outcome.OK.value,
                "from": running[0] if running else None,
                "to": target,
                "message": msg,
            }

        all_gpus = self._all_gpus()
        watched = gate_gpus(config, target, to_stop, all_gpus)
        rec = SwitchRecord(
            trigger=trigger.value,
            requested_by=caller.user,
            uid=caller.uid,
            reason=reason,
            from_backend=running[0] if running else None,
            to_backend=target,
            started_at=clock.now(),
            ticket=ticket,
            gpushift_version=self.version,
        )
        self._rec = rec
        target_running = target in running  # beside others: keep it, stop the rest
        if len(running) > 1:
            rec.extra["running_before"] = running
        target_cfg: BackendConfig | None = config.backends.get(target) if target != OFF else None
        target_state: UnitState | None = None
        refusal: str | None = None
        refusal_error = SwitchFailed.dbus_name()
        if target_cfg is not None:
            target_state = self.units.state(target_cfg.unit)
            rec.unit = target_cfg.unit
            rec.unit_path = target_state.fragment_path or None
            rec.argv_configured = list(target_state.exec_start)
            if target_state.load_state != "loaded":
                refusal = f"unit {target_cfg.unit} of backend {target} is {target_state.load_state}"
        facts = self.gpu.facts()  # read once: the ledger and the doctor share it
        rec.gpu_facts = facts.to_dict()
        if refusal is None and target_cfg is not None and self.doctor is not None:
            refusal = self._consult_doctor(ticket, config, target, facts, rec)
        before = self._readings(watched)
        rec.vram["before"] = [r.to_dict() for r in before]
        if refusal is None:
            keep = [target] if target_running else []
            own_units = {config.backends[b].unit for b in [*to_stop, *keep]}
            own_pids: set[int] = set()
            for b in [*to_stop, *keep]:
                own_pids.update(self.units.processes(config.backends[b].unit))
            verdict = foreign_memory(before, own_units, own_pids, residual, sim)
            if not verdict.ok:
                refusal = verdict.message
                refusal_error = VramNotReleased.dbus_name()
        rec.durations_s["preflight"] = round(clock.monotonic() - t0, 3)
        if refusal is not None:
            rec.outcome = Outcome.REFUSED.value
            rec.failed_phase = Phase.PREFLIGHT.value
            rec.message = f"refused: {refusal}"
            rec.finished_at = clock.now()
            rec.id = self.ledger.begin(rec)
            self.ledger.finish(rec)
            return self._result(rec, ok=False, error=refusal_error)

        # --- intent row before anything is stopped
        self._progress(ticket, Phase.INTENT, "ledger intent row")
        rec.id = self.ledger.begin(rec)
        self._set_previous(ticket, running, rec.id)

        try:
            # --- drain
            t0 = clock.monotonic()
            drains = []
            for b in to_stop:
                drains.append(self._drain(ticket, config.backends[b], skip_drain))
            if drains:
                rec.extra["drain"] = drains
            rec.durations_s["drain"] = round(clock.monotonic() - t0, 3)

            # --- stop
            t0 = clock.monotonic()
            for b in to_stop:
                self._stop(ticket, config, config.backends[b])
            rec.durations_s["stop"] = round(clock.monotonic() - t0, 3)

            if target_running and target_cfg is not None:
                # The target already runs (beside the others just stopped): its own memory stays,
                # so there is nothing to release and nothing to start; prove it answers.
                self._wait_ready(ticket, config, target_cfg, rec.durations_s)
            else:
                # --- VRAM gate
                t0 = clock.monotonic()
                released = self._wait_released(ticket, config, watched, f"for {target}")
                rec.vram["released"] = [r.to_dict() for r in released]
                rec.durations_s["release"] = round(clock.monotonic() - t0, 3)
                if target_cfg is not None:
                    self._start_and_wait(ticket, config, target_cfg, rec.durations_s)
            if target_cfg is not None:
                st = self.units.state(target_cfg.unit)
                rec.vram["ready"] = [r.to_dict() for r in self._readings(watched)]
                # --- version and the launch as it really runs
                self._progress(ticket, Phase.VERSION, f"asking {target} its version")
                t0 = clock.monotonic()
                self._record_launch(rec, target_cfg, st)
                rec.durations_s["version"] = round(clock.monotonic() - t0, 3)
        except _Failure as f:
            return self._fail(ticket, config, rec, f, to_stop, target_cfg)
        except GpushiftError as e:  # an adapter said no (systemd refused a job, ...)
            return self._fail(ticket, config, rec, _Failure(self._phase, str(e)), to_stop, target_cfg)

        rec.outcome = Outcome.OK.value
        rec.message = f"{target} is serving" if target != OFF else "every backend stopped; GPUs free"
        rec.finished_at = clock.now()
        self.ledger.finish(rec)
        return self._result(rec, ok=True)

    # ----------------------------------------------------------------- steps

    def _consult_doctor(
        self, ticket: str, config: Config, target: str, facts: HostGpuFacts, rec: SwitchRecord
    ) -> str | None:
        """Preflight rules (gpushift check): errors refuse the switch, warnings are recorded."""
        assert self.doctor is not None
        try:
            findings = list(self.doctor(config, target, facts))
        except Exception as e:  # the doctor must never be why a switch fails
            self.log.exception("doctor_failed", ticket=ticket, error=repr(e))
            rec.extra["doctor_error"] = repr(e)
            return None
        rec.extra["doctor"] = [f.to_dict() for f in findings]
        for f in findings:
            if not f.is_error:
                self.log.warning(
                    "doctor_warning", ticket=ticket, backend=f.backend, code=f.code, message=f.message
                )
                self._progress(ticket, Phase.PREFLIGHT, f"warning: {f.message}")
        errors = [f for f in findings if f.is_error]
        if not errors:
            return None
        return "; ".join(f"{f.message}" + (f" ({f.hint})" if f.hint else "") for f in errors)

    def _check_cancel(self, phase: Phase) -> None:
        self.heartbeat = self.clock.monotonic()
        if self._cancel.is_set():
            raise _Failure(phase, f"cancelled by {self._cancelled_by or 'a person'}")

    def _drain(self, ticket: str, b: BackendConfig, skip: bool) -> dict[str, Any]:
        """Wait (up to drain_timeout_s) until ``b`` has no request running or waiting."""
        clock = self.clock
        t0 = clock.monotonic()
        if skip:
            self._progress(ticket, Phase.DRAIN, f"{b.name}: drain skipped (--now)")
            return {"backend": b.name, "skipped": True}
        first = self.probe.in_flight(b)
        n = first
        self._progress(ticket, Phase.DRAIN, f"{b.name}: {'unknown' if n is None else n} request(s) in flight")
        while n is not None and n > 0 and clock.monotonic() - t0 < b.drain_timeout_s:
            self._check_cancel(Phase.DRAIN)
            clock.sleep(self.config.daemon.poll_interval_s)
            n = self.probe.in_flight(b)
        waited = round(clock.monotonic() - t0, 3)
        timed_out = bool(n) and n is not None and n > 0
        if first:
            self._progress(
                ticket,
                Phase.DRAIN,
                f"{b.name}: drained in {waited:.1f}s"
                if not timed_out
                else f"{b.name}: drain timeout, {n} request(s) still in flight",
            )
        return {
            "backend": b.name,
            "in_flight_at_start": first,
            "in_flight_at_stop": n,
            "waited_s": waited,
            "timed_out": timed_out,
        }

    def _stop(self, ticket: str, config: Config, b: BackendConfig) -> None:
        self._progress(ticket, Phase.STOP, f"stopping {b.unit}")
        self._touched = True
        job = self.units.stop(b.unit, config.daemon.stop_timeout_s)
        st = self.units.state(b.unit)
        if not job.ok or st.running:
            raise _Failure(
                Phase.STOP,
                f"could not stop {b.unit}: job {job.result}, unit {st.active_state}/{st.sub_state}",
                systemd_result=st.result,
            )

    def _wait_released(
        self, ticket: str, config: Config, watched: Sequence[int], what: str
    ) -> list[GpuReading]:
        """Poll the GPU provider until every watched GPU is released, or fail closed."""
        clock = self.clock
        gpus = ",".join(str(i) for i in watched)
        sim = " (SIMULATED)" if self.gpu.simulated else ""
        self._progress(ticket, Phase.RELEASE, f"waiting for VRAM on GPU {gpus}{sim} {what}")
        t0 = clock.monotonic()
        while True:
            readings = self._readings(watched)
            verdict = gate(readings, config.gpu.residual_mib, self.gpu.simulated)
            if verdict.open:
                used = ", ".join(
                    f"GPU {r.index} {r.used_mib:.0f} MiB" for r in readings if r.used_mib is not None
                )
                self._progress(ticket, Phase.RELEASE, f"VRAM released ({used})")
                return readings
            if clock.monotonic() - t0 >= config.gpu.release_timeout_s:
                raise _Failure(
                    Phase.RELEASE,
                    f"{verdict.message} (waited {config.gpu.release_timeout_s:g}s)",
                    vram=True,
                )
            self._check_cancel(Phase.RELEASE)
            clock.sleep(config.daemon.poll_interval_s)

    def _start_and_wait(
        self, ticket: str, config: Config, b: BackendConfig, durations: dict[str, float]
    ) -> None:
        clock = self.clock
        t0 = clock.monotonic()
        self._progress(ticket, Phase.START, f"starting {b.unit}")
        st = self.units.state(b.unit)
        if st.failed:
            self.units.reset_failed(b.unit)
        self._touched = True
        job = self.units.start(b.unit, b.start_timeout_s)
        durations["start"] = round(clock.monotonic() - t0, 3)
        if not job.ok:
            st = self.units.state(b.unit)
            raise _Failure(
                Phase.START,
                f"start job of {b.unit} ended with {job.result!r} (Result={st.result})",
                systemd_result=st.result,
            )
        self._wait_ready(ticket, config, b, durations)

    def _wait_ready(self, ticket: str, config: Config, b: BackendConfig, durations: dict[str, float]) -> None:
        """Poll the health URL until 200, watching the unit: an exit is noticed at the next poll."""
        clock = self.clock
        self._progress(ticket, Phase.READY, f"waiting for {b.health_url}")
        t0 = clock.monotonic()
        last = ""
        while True:
            st = self.units.state(b.unit)
            # A unit with Restart= that crashed sits in activating/auto-restart: an exit too.
            if st.active_state in ("failed", "inactive", "deactivating") or st.sub_state == "auto-restart":
                raise _Failure(
                    Phase.READY,
                    f"{b.unit} exited while starting: {st.active_state}/{st.sub_state}, Result={st.result}",
                    systemd_result=st.result,
                )
            h = self.probe.health(b.health_url)
            if h.ok:
                durations["ready"] = round(clock.monotonic() - t0, 3)
                self._progress(ticket, Phase.READY, f"{b.name} is ready ({clock.monotonic() - t0:.1f}s)")
                return
            detail = f"HTTP {h.status}" if h.status is not None else (h.detail or "no answer")
            if detail != last:
                self._progress(ticket, Phase.READY, f"{b.name}: {detail}")
                last = detail
            if clock.monotonic() - t0 >= b.start_timeout_s:
                raise _Failure(
                    Phase.READY,
                    f"{b.name} did not answer 200 on {b.health_url} within {b.start_timeout_s:g}s "
                    f"(last: {detail})",
                    systemd_result=st.result,
                )
            self._check_cancel(Phase.READY)
            clock.sleep(config.daemon.poll_interval_s)

    def _record_launch(self, rec: SwitchRecord, b: BackendConfig, st: UnitState) -> None:
        argv: list[str] = self.host.cmdline(st.main_pid) if st.main_pid else []
        rec.argv_running = argv
        v = self.probe.version(b.version_url, b.version_command)
        rec.backend_version = v.version
        rec.version_source = v.source
        try:
            rec.extra["launch"] = self.host.launch_info(st, argv or list(st.exec_start))
        except Exception as e:  # describing the launch must never fail the switch
            rec.extra["launch_error"] = repr(e)

    # ----------------------------------------------------------------- failure policy

    def _fail(
        self,
        ticket: str,
        config: Config,
        rec: SwitchRecord,
        f: _Failure,
        stopped: list[str],
        target_cfg: BackendConfig | None,
    ) -> dict[str, Any]:
        rec.failed_phase = f.phase.value
        rec.message = f.message
        rec.systemd_result = f.systemd_result
        self.log.warning("switch_failed", ticket=ticket, phase=f.phase.value, message=f.message)
        error = VramNotReleased.dbus_name() if f.vram else SwitchFailed.dbus_name()
        if not self._touched:
            # Cancelled (or failed) before anything was stopped or started: all is as it was.
            rec.outcome = (
                Outcome.CANCELLED.value if f.message.startswith("cancelled") else Outcome.FAILED.value
            )
            was = ", ".join(stopped) if stopped else "nothing"
            rec.message = f"{f.message}; nothing was stopped ({was} still as before)"
            return self._finish(rec, error)
        if f.phase is Phase.STOP:
            # The old backend may still run: touch nothing more, say so.
            rec.outcome = Outcome.FAILED.value
            return self._finish(rec, error)
        # The target must not be left half-started (a failed unit is stopped, its state kept).
        if target_cfg is not None and self.units.state(target_cfg.unit).running:
            self._progress(ticket, Phase.ROLLBACK, f"stopping {target_cfg.unit}")
            try:
                self._stop(ticket, config, target_cfg)
            except _Failure as f2:
                rec.outcome = Outcome.FAILED.value
                rec.message = f"{f.message}; then {f2.message}"
                return self._finish(rec, error)
        previous = stopped[0] if stopped else None
        if config.daemon.on_failure != "rollback" or previous is None:
            rec.outcome = Outcome.FAILED.value
            why = "failure policy is 'stay'" if previous else "nothing ran before"
            rec.message = f"{f.message}; {why}: every backend stays stopped"
            return self._finish(rec, error)
        # --- rollback: the previous backend again, through the same gate
        prev_cfg = config.backends[previous]
        self._progress(ticket, Phase.ROLLBACK, f"rolling back to {previous}")
        rec.extra["rollback"] = {"to": previous}
        watched = gate_gpus(config, previous, [], self._all_gpus())
        self._cancel.clear()  # a cancel stops the switch, not the way back
        try:
            try:
                self._wait_released(ticket, config, watched, f"for the rollback to {previous}")
                # the rollback's own timings, apart from the failed attempt's
                self._start_and_wait(
                    ticket, config, prev_cfg, rec.extra["rollback"].setdefault("durations_s", {})
                )
            except GpushiftError as e:
                raise _Failure(Phase.ROLLBACK, str(e)) from None
        except _Failure as f2:
            rec.outcome = Outcome.FAILED.value
            rec.message = f"{f.message}; rollback to {previous} impossible: {f2.message}; nothing is serving"
            rec.extra["rollback"]["error"] = f2.message
            if self.units.state(prev_cfg.unit).running:
                try:
                    self._stop(ticket, config, prev_cfg)
                except _Failure as f3:
                    rec.message += f"; {f3.message}"
            return self._finish(rec, error)
        rec.outcome = Outcome.ROLLED_BACK.value
        rec.message = f"{f.message}; rolled back: {previous} serves again"
        rec.extra["rollback"]["ok"] = True
        return self._finish(rec, error)

    def _finish(self, rec: SwitchRecord, error: str) -> dict[str, Any]:
        rec.finished_at = self.clock.now()
        self.ledger.finish(rec)
        return self._result(rec, ok=False, error=error)

    def _result(self, rec: SwitchRecord, ok: bool, error: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ticket": rec.ticket,
            "ok": ok,
            "outcome": rec.outcome,
            "from": rec.from_backend,
            "to": rec.to_backend,
            "message": rec.message,
            "failed_phase": rec.failed_phase,
            "systemd_result": rec.systemd_result,
            "ledger_id": rec.id,
            "backend_version": rec.backend_version,
            "durations_s": rec.durations_s,
            "touched": self._touched,
        }
        if error:
            out["error"] = error
        return out


def _established_after(result: dict[str, Any], before: str | None) -> str | None:
    """What runs after a switch ended with ``result``, as far as gpushift made it so."""
    outcome = result.get("outcome")
    if result.get("internal_error"):
        return None  # a bug ended the switch somewhere: adopt what systemd says next
    if not result.get("ok") and result.get("touched") is False:
        return before  # refused or cancelled before any stop or start: all is as it was
    if outcome == Outcome.OK.value:
        return str(result.get("to"))
    if outcome == Outcome.ROLLED_BACK.value:
        return str(result.get("from") or OFF)
    if outcome == Outcome.REFUSED.value:
        return before
    if result.get("failed_phase") in (None, Phase.STOP.value):
        return None  # unknown (a failed stop, an internal error): adopt what systemd says next
    return OFF  # failed: everything was left stopped


class _NullLog:
    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **k: None

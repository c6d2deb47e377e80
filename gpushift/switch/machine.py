"""The switcher — the one writer of "what runs on the GPUs".

One switch at a time: :meth:`Switcher.request` validates, takes the slot under a lock and returns a
ticket at once; the switch itself runs on a worker thread as a :class:`SwitchRun` and reports every
phase to the listeners (the D-Bus service turns those into ``Progress``/``Finished`` signals).

The order of a switch (docs/design.md has the state diagram):

preflight → ledger intent row → drain → stop (wait for the job) → VRAM gate → start (wait for the
job) → readiness (health 200, unit watched) → version probe → ledger row completed.

Every read that gates a change is asked of systemd / the GPU provider at that moment, never taken
from a cache.  Failures after the intent row follow ``daemon.on_failure`` (rollback | stay), see
:mod:`gpushift.switch.failure`.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from gpushift.config.schema import Config
from gpushift.errors import GpushiftError, NothingToCancel, SwitchFailed, SwitchInProgress, UnknownBackend
from gpushift.ports import Ports
from gpushift.switch import records
from gpushift.switch.failure import FailurePolicy, close
from gpushift.switch.hooks import SwitchHooks
from gpushift.switch.policy import running_backends
from gpushift.switch.preflight import Preflight, already_there
from gpushift.switch.run import Event, StepFailed, SwitchResult, SwitchRun
from gpushift.switch.steps import RunGuard, Steps
from gpushift.values import (
    OFF,
    Caller,
    EventKind,
    HookEvent,
    Outcome,
    Phase,
    SwitchRecord,
    Trigger,
    UnitState,
)

Listener = Callable[[Event], None]

#: Finished results kept for ``result(ticket)`` (the keeper reads its own scheduled switches').
_KEEP_RESULTS = 64


class Switcher:
    """Owns every change of the running backend.

    Args:
        config: the validated config (replaced by :meth:`reconfigure` on reload).
        ports: systemd, the GPU provider, the backends' endpoints, the ledger, the host, the clock and
            the preflight doctor (real adapters or test fakes).
        listener: called with every :class:`Event`, on the worker thread.
        log: a structlog-like logger (``log.info("event", key=value)``).
        version: gpushift's version, recorded in the ledger.
    """

    def __init__(
        self,
        config: Config,
        ports: Ports,
        listener: Listener | None = None,
        log: Any = None,
        version: str = "",
    ) -> None:
        self.config = config
        self.ports = ports
        self.listeners: list[Listener] = [listener] if listener else []
        self.log = log if log is not None else _NullLog()
        self.version = version
        self._guard = RunGuard()
        self._lock = self._guard.lock
        self.steps = Steps(self.ports, self._guard, self._report, self._beat)
        self.preflight = Preflight(self.steps, self.log, version)
        self.failure = FailurePolicy(self.steps, self.log)
        self.hooks = SwitchHooks(self.steps, self.log)
        self.steps.on_failure = self.hooks.on_failure
        self._run: SwitchRun | None = None
        self._worker: threading.Thread | None = None
        self._results: dict[str, SwitchResult] = {}
        # What gpushift itself last established (None: not known yet; adopt what runs).  Anything
        # else found running later was changed behind our back (the keeper's "external" rule).
        self._established: str | None = None
        self._heartbeat = ports.clock.monotonic()  # the worker touches it while it runs (watchdog)

    # ----------------------------------------------------------------- queries

    def reconfigure(self, config: Config) -> None:
        """Take a new config (on reload); a switch in flight keeps the one it started with."""
        self.config = config

    def add_listener(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def current(self) -> SwitchRun | None:
        """A copy of the run in flight (None when idle)."""
        with self._lock:
            return replace(self._run) if self._run is not None else None

    def unit_states(self, config: Config | None = None) -> dict[str, UnitState]:
        """Each configured backend's unit as systemd reports it right now, in config order."""
        cfg = config or self.config
        return {name: self.ports.units.state(b.unit) for name, b in cfg.backends.items()}

    def running_backends(self, config: Config | None = None) -> list[str]:
        """Configured backends whose unit systemd reports as running right now, in config order."""
        return running_backends({name: st.running for name, st in self.unit_states(config).items()})

    def result(self, ticket: str) -> SwitchResult | None:
        return self._results.get(ticket)

    def snapshot(self) -> tuple[bool, str | None]:
        """(a switch is running, the backend gpushift last established) — read atomically."""
        with self._lock:
            return self._run is not None, self._established

    def worker_health(self) -> tuple[bool, float] | None:
        """For the watchdog: (the worker thread is alive, seconds since it last reported);
        None when no switch runs."""
        with self._lock:
            if self._run is None:
                return None
            t = self._worker
        return t is not None and t.is_alive(), self.ports.clock.monotonic() - self._heartbeat

    def wait(self, timeout_s: float | None = None) -> bool:
        """Join the worker of the switch in flight (tests and shutdown); True when none runs."""
        t = self._worker
        if t is not None:
            t.join(timeout_s)
            return not t.is_alive()
        return True

    # ----------------------------------------------------------------- changes

    def adopt(self, backend: str, force: bool = False) -> None:
        """Take what runs as established (daemon start: a new daemon adopts what it finds).

        ``force`` replaces a known value (a backend that crashed by itself is now "off").
        """
        with self._lock:
            if self._run is None and (force or self._established is None):
                self._established = backend

    def note_external(self, from_backend: str, to_backend: str) -> None:
        """Record a change made outside gpushift (systemctl) in the ledger and adopt it."""
        records.external(self.ports, self.config, self.version, from_backend, to_backend)
        with self._lock:
            self._established = to_backend

    def note_relaunch(self, backend: str, detail: str) -> None:
        """Record a relaunch of the serving backend outside gpushift (its launch as it runs now)."""
        records.relaunch(self.ports, self.config, self.version, backend, detail)

    def record_incident(self, outcome: Outcome, backend: str, detail: str, exit: str) -> None:
        """Record that the serving backend crashed or wedged (the keeper decides what follows)."""
        records.incident(self.ports, self.config, self.version, outcome, backend, detail, exit)

    def request(
        self,
        target: str,
        reason: str,
        caller: Caller,
        trigger: Trigger = Trigger.MANUAL,
        skip_drain: bool = False,
        *,
        relaunch: bool = False,
        verify_running: bool = False,
        recovery_attempt: int = 0,
        details: Mapping[str, str] | None = None,
    ) -> str:
        """Queue a switch to ``target`` and return its ticket at once.

        ``relaunch``: a running target is stopped and started again through the whole gate
        (``gpushift switch X --restart``).  ``verify_running``: a running target is not taken as
        done but health-checked and its launch recorded (crash recovery).  ``details``: facts for
        the ledger row, each under its own key in its ``extra`` (e.g. the calendar exception a
        scheduled switch follows).

        Raises:
            UnknownBackend: ``target`` is neither a configured backend nor ``off``.
            SwitchInProgress: another switch runs; the message names it.
        """
        config = self.config
        if target != OFF and target not in config.backends:
            known = ", ".join([*config.backends, OFF])
            raise UnknownBackend(f"unknown backend {target!r} (configured: {known})")
        clock = self.ports.clock
        with self._lock:
            if self._run is not None:
                c = self._run
                raise SwitchInProgress(
                    f"a switch is already running: ticket {c.ticket}, to {c.target}, "
                    f"asked by {c.requested_by}, phase {c.phase}"
                )
            run = SwitchRun(
                ticket=uuid.uuid4().hex[:12],
                target=target,
                trigger=trigger,
                requested_by=caller.user,
                uid=caller.uid,
                reason=reason,
                started_at=clock.now(),
                started_mono=clock.monotonic(),
                skip_drain=skip_drain,
                relaunch=relaunch and target != OFF,
                verify_running=verify_running,
                recovery_attempt=recovery_attempt,
                details=dict(details or {}),
            )
            self._run = run
            self._worker = threading.Thread(
                target=self._work, args=(run, config), name=f"switch-{run.ticket}", daemon=True
            )
            self._worker.start()
        return run.ticket

    def cancel(self, caller: Caller) -> str:
        """Ask the switch in flight to stop.  Before its first stop it simply ends (nothing changed);
        after it the failure policy applies; during a rollback it is refused.  Returns its ticket."""
        with self._lock:
            run = self._run
        if run is None:
            raise NothingToCancel("no switch is running")
        self._guard.request_cancel(run, caller.user)
        return run.ticket

    # ----------------------------------------------------------------- the worker

    def _beat(self) -> None:
        self._heartbeat = self.ports.clock.monotonic()

    def _emit(self, event: Event) -> None:
        for fn in list(self.listeners):
            try:
                fn(event)
            except Exception as e:  # a listener's bug must not break the switch
                self.log.error("listener_failed", ticket=event.ticket, error=repr(e))

    def _report(self, run: SwitchRun, phase: Phase, detail: str) -> None:
        self._beat()
        with self._lock:
            changed = run.phase is not phase
            run.phase = phase
            run.detail = detail
        if changed and run.ledger_id is not None:
            self.steps.persist(run)  # a daemon that dies now knows the phase it died in
        self.log.info("switch_phase", ticket=run.ticket, phase=phase.value, detail=detail)
        elapsed = self.ports.clock.monotonic() - run.started_mono
        self._emit(Event(run.ticket, EventKind.PROGRESS, phase, detail, elapsed))

    def _work(self, run: SwitchRun, config: Config) -> None:
        rec_box: list[SwitchRecord] = []
        try:
            result = self._switch(run, config, rec_box)
        except Exception as e:  # a bug: report it, never leave the slot taken or the row pending
            result = self._crashed(run, rec_box[0] if rec_box else None, e)
        self._results[run.ticket] = result
        while len(self._results) > _KEEP_RESULTS:  # a long-running daemon keeps only recent ones
            del self._results[next(iter(self._results))]
        self._forget(run)
        with self._lock:
            self._run = None
            self._established = result.established_after(self._established)
        self.log.info("switch_finished", **result.to_dict())
        elapsed = self.ports.clock.monotonic() - run.started_mono
        self._emit(Event(run.ticket, EventKind.FINISHED, Phase.DONE, result.message, elapsed, result))

    def _forget(self, run: SwitchRun) -> None:
        """The run has ended (its row is complete): nothing is left to recover."""
        runs = self.ports.runs
        if runs is None:
            return
        self.steps.forget_persisted()
        try:
            runs.clear()
        except OSError as e:
            self.log.error("run_store_clear_failed", ticket=run.ticket, error=str(e))

    def _crashed(self, run: SwitchRun, rec: SwitchRecord | None, e: Exception) -> SwitchResult:
        self.log.exception("switch_crashed", ticket=run.ticket, error=repr(e))
        if rec is not None and rec.id is not None and rec.outcome == Outcome.PENDING.value:
            rec.outcome = Outcome.FAILED.value
            rec.failed_phase = run.phase.value
            rec.message = f"internal error in phase {run.phase.value}: {e!r}"
            rec.finished_at = self.ports.clock.now()
            try:
                self.ports.ledger.finish(rec)
            except Exception as e2:
                self.log.exception("ledger_finish_failed", ticket=run.ticket, error=repr(e2))
        return SwitchResult(
            ticket=run.ticket,
            ok=False,
            outcome=Outcome.FAILED,
            to_backend=run.target,
            from_backend=run.from_backend,
            message=f"internal error: {e!r}",
            error=SwitchFailed.dbus_name(),
            failed_phase=run.phase,
            touched=run.touched,
            internal_error=True,
        )

    def _switch(self, run: SwitchRun, config: Config, rec_box: list[SwitchRecord]) -> SwitchResult:
        clock = self.ports.clock
        steps = self.steps
        target = run.target

        # --- preflight (nothing touched yet; every read is asked now)
        self._report(run, Phase.PREFLIGHT, f"checking {target}")
        t0 = clock.monotonic()
        states = self.unit_states(config)  # read once: what runs, the target's unit, the doctor's
        running = running_backends({name: st.running for name, st in states.items()})
        with self._lock:
            run.previous = list(running)
        msg = None if run.relaunch or run.verify_running else already_there(target, running)
        if msg is not None:
            return SwitchResult(
                ticket=run.ticket,
                ok=True,
                outcome=Outcome.OK,
                to_backend=target,
                from_backend=run.from_backend,
                message=msg,
                already=True,
            )
        steps.persist(run)  # from here until the row is complete, a restarted daemon converges from it
        plan = self.preflight.plan(run, config, running, states)
        rec = plan.record
        rec_box.append(rec)
        run.stopping = list(plan.to_stop)
        rec.durations_s["preflight"] = round(clock.monotonic() - t0, 3)
        if plan.refusal is not None:
            rec.outcome = Outcome.REFUSED.value
            rec.failed_phase = Phase.PREFLIGHT.value
            rec.message = f"refused: {plan.refusal}"
            rec.id = self.ports.ledger.begin(rec)
            return close(steps, run, rec, False, plan.refusal_error, config)

        # --- intent row before anything is stopped
        self._report(run, Phase.INTENT, "ledger intent row")
        rec.id = self.ports.ledger.begin(rec)
        with self._lock:
            run.ledger_id = rec.id
        steps.persist(run)

        target_cfg = plan.target
        ready: UnitState | None = None
        try:
            steps.check_cancel(run, Phase.INTENT)  # a cancel during the preflight ends it here
            # --- the before_stop hook (a required one that fails refuses: nothing stopped yet)
            refusal = self.hooks.before_stop(run, config, rec)
            steps.check_cancel(run, Phase.HOOKS)
            if refusal is not None:
                rec.outcome = Outcome.REFUSED.value
                rec.failed_phase = Phase.HOOKS.value
                rec.message = f"refused: {refusal}"
                self.log.warning("switch_refused_by_hook", ticket=run.ticket, message=rec.message)
                return close(steps, run, rec, False, SwitchFailed.dbus_name(), config)
            # --- drain
            t0 = clock.monotonic()
            drains = [steps.drain(run, config, config.backends[b]) for b in plan.to_stop]
            if drains:
                rec.extra["drain"] = drains
            rec.durations_s["drain"] = round(clock.monotonic() - t0, 3)
            # --- stop
            t0 = clock.monotonic()
            for b in plan.to_stop:
                steps.check_cancel(run, Phase.STOP)
                steps.stop(run, config, config.backends[b])
            rec.durations_s["stop"] = round(clock.monotonic() - t0, 3)
            # A cancel that came during a stop job is not lost: the stops are done, so it is honoured
            # as the gate begins (the failure policy brings the previous backend back).
            steps.check_cancel(run, Phase.RELEASE)
            if plan.target_running and target_cfg is not None:
                # The target already runs (beside the others just stopped, or found running by a
                # recovery): its own memory stays, so there is nothing to release and nothing to
                # start; prove it answers.
                ready = steps.wait_ready(run, config, target_cfg, rec.durations_s)
            else:
                # --- VRAM gate
                t0 = clock.monotonic()
                released = steps.wait_released(run, config, plan.watched, f"for {target}")
                rec.vram["released"] = [r.to_dict() for r in released]
                rec.durations_s["release"] = round(clock.monotonic() - t0, 3)
                if target_cfg is not None:
                    steps.check_cancel(run, Phase.RELEASE)
                    steps.persist(run)
                    ready = steps.start_and_wait(run, config, target_cfg, rec.durations_s)
            if target_cfg is not None:
                # The unit as read with its 200; after a warm-up request, as it runs now.
                st = ready
                if steps.warm_up(run, config, target_cfg, rec, ready) or st is None:
                    st = self.ports.units.state(target_cfg.unit)
                steps.persist(run)
                steps.check_cancel(run, Phase.READY)
                rec.vram["ready"] = [r.to_dict() for r in steps.readings(plan.watched)]
                # --- version and the launch as it really runs
                self._report(run, Phase.VERSION, f"asking {target} its version")
                t0 = clock.monotonic()
                steps.record_launch(rec, target_cfg, st)
                rec.durations_s["version"] = round(clock.monotonic() - t0, 3)
                # --- the after_ready hook, before the row is closed (a cancel during it: rollback)
                self.hooks.run(HookEvent.AFTER_READY, run, config, rec, f"{target} is serving")
                steps.check_cancel(run, Phase.HOOKS)
        except StepFailed as f:
            return self.failure.handle(run, config, rec, f, target_cfg)
        except GpushiftError as e:  # an adapter said no (systemd refused a job, ...)
            return self.failure.handle(run, config, rec, StepFailed(run.phase, str(e)), target_cfg)

        rec.outcome = Outcome.OK.value
        rec.message = f"{target} is serving" if target != OFF else "every backend stopped; GPUs free"
        if target != OFF:
            self.preflight.learn(rec)
        return close(steps, run, rec, True)


class _NullLog:
    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **k: None

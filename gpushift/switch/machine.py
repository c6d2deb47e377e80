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
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from gpushift.config.instances import units_of
from gpushift.config.schema import Config
from gpushift.errors import GpushiftError, NothingToCancel, SwitchFailed, SwitchInProgress, UnknownBackend
from gpushift.host.nulllog import NULL_LOG
from gpushift.ports import Ports
from gpushift.switch import frontdoor, records
from gpushift.switch import instances as group
from gpushift.switch.failure import FailurePolicy, close
from gpushift.switch.hooks import SwitchHooks
from gpushift.switch.phases import TransitionError
from gpushift.switch.policy import running_backends
from gpushift.switch.preflight import Preflight, already_there
from gpushift.switch.run import Event, Plan, StepFailed, SwitchResult, SwitchRun
from gpushift.switch.steps import RunGuard, Steps
from gpushift.values import OFF, Caller, EventKind, HookEvent, Outcome, Phase, Trigger, UnitState

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
        strict_transitions: a phase change the transition table does not allow raises (and ends the
            switch as an internal error: tests); False (the daemon) logs ``switch_transition_invalid``
            at error level and goes on (:mod:`gpushift.switch.phases`).

    The runs are the switch's state: the one in flight (``current``), the last finished ones with
    their results (``result``), and those finished since the keeper last looked
    (``take_finished``).  Only this switcher and its helpers change a run.
    """

    def __init__(
        self,
        config: Config,
        ports: Ports,
        listener: Listener | None = None,
        log: Any = None,
        version: str = "",
        strict_transitions: bool = True,
    ) -> None:
        self.config = config
        self.strict_transitions = strict_transitions
        self.ports = ports
        self.listeners: list[Listener] = [listener] if listener else []
        self.log = log if log is not None else NULL_LOG
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
        self._finished: dict[str, SwitchRun] = {}  # the last finished runs, by ticket
        self._unseen: deque[SwitchRun] = deque(maxlen=_KEEP_RESULTS)  # finished, not yet taken
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
        return {name: group.representative(self.ports.units, b) for name, b in cfg.backends.items()}

    def instance_states(self, backend: str) -> dict[str, UnitState]:
        """Each instance's unit of ``backend`` as systemd reports it right now (a backend of one
        unit: that unit)."""
        return {u: self.ports.units.state(u) for u in units_of(self.config.backends[backend])}

    def running_backends(self, config: Config | None = None) -> list[str]:
        """Configured backends whose unit systemd reports as running right now, in config order."""
        cfg = config or self.config
        return running_backends(group.running(self.ports.units, cfg, self.unit_states(cfg)))

    def result(self, ticket: str) -> SwitchResult | None:
        run = self._finished.get(ticket)
        return run.result if run is not None else None

    def take_finished(self) -> list[SwitchRun]:
        """The runs that finished since the last call, oldest first (each with its result and the
        monotonic time it ended): the keeper's executor learns how its switches ended here."""
        with self._lock:
            out = list(self._unseen)
            self._unseen.clear()
        return out

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

    def record_incident(
        self,
        outcome: Outcome,
        backend: str,
        detail: str,
        exit: str,
        unit: str | None = None,
        serving: bool = False,
    ) -> None:
        """Record that the serving backend (``unit``: one of its instances) crashed or wedged (the
        keeper decides what follows)."""
        records.incident(self.ports, self.config, self.version, outcome, backend, detail, exit, unit, serving)

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
        restart_instances: tuple[str, ...] = (),
    ) -> str:
        """Queue a switch to ``target`` and return its ticket at once.

        ``relaunch``: a running target is stopped and started again through the whole gate
        (``gpushift switch X --restart``).  ``verify_running``: a running target is not taken as
        done but health-checked and its launch recorded (crash recovery; ``restart_instances``: those
        instances of it, hung, are stopped and started again alone).  ``details``: facts for
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
                restart_instances=list(restart_instances),
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
        """The one way a run changes phase (through the transition table); every report is a
        progress event, the first of a phase is its transition."""
        self._beat()
        with self._lock:
            was = run.phase
            try:
                moved = run.advance(phase, detail)
            except TransitionError as e:
                if self.strict_transitions:
                    raise
                moved = run.advance(phase, detail, force=True)
                bad: TransitionError | None = e
            else:
                bad = None
        if bad is not None:
            self.log.error("switch_transition_invalid", ticket=run.ticket, was=was.value, to=phase.value,
                           error=str(bad))  # fmt: skip
        if moved and run.ledger_id is not None:
            self.steps.persist(run)  # a daemon that dies now knows the phase it died in
        self.log.info("switch_phase", ticket=run.ticket, phase=phase.value, detail=detail)
        elapsed = self.ports.clock.monotonic() - run.started_mono
        self._emit(Event(run.ticket, EventKind.PROGRESS, phase, detail, elapsed, was=was if moved else None))

    def _work(self, run: SwitchRun, config: Config) -> None:
        try:
            result = self._switch(run, config)
        except Exception as e:  # a bug: report it, never leave the slot taken or the row pending
            result = self._crashed(run, e)
        self._forget(run)
        ended = self.ports.clock.monotonic()
        with self._lock:
            was = run.phase
            run.advance(Phase.DONE, result.message)  # every phase may end
            run.result, run.ended_mono = result, ended
            self._finished[run.ticket] = run
            while len(self._finished) > _KEEP_RESULTS:  # a long-running daemon keeps only recent ones
                del self._finished[next(iter(self._finished))]
            self._unseen.append(run)
            self._run = None
            self._established = result.established_after(self._established)
        self.log.info("switch_finished", **result.to_dict())
        elapsed = ended - run.started_mono
        self._emit(Event(run.ticket, EventKind.FINISHED, Phase.DONE, result.message, elapsed, result, was))

    def _forget(self, run: SwitchRun) -> None:
        """The run has ended (its row is complete): nothing is left to recover."""
        runs = self.ports.runs
        if runs is None:
            return
        try:
            runs.clear()
        except OSError as e:
            self.log.error("run_store_clear_failed", ticket=run.ticket, error=str(e))

    def _crashed(self, run: SwitchRun, e: Exception) -> SwitchResult:
        self.log.exception("switch_crashed", ticket=run.ticket, error=repr(e))
        rec = run.record
        if rec is not None and rec.id is not None and rec.outcome == Outcome.PENDING.value:
            rec.outcome = Outcome.FAILED.value
            rec.failed_phase = run.phase.value
            rec.message = f"internal error in phase {run.phase.value}: {e!r}"
            try:  # held requests are not left waiting on a switch that crashed
                frontdoor.release(self.ports, run, rec, self.config)
            except Exception as e2:
                self.log.exception("frontdoor_release_failed", ticket=run.ticket, error=repr(e2))
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

    def _switch(self, run: SwitchRun, config: Config) -> SwitchResult:
        """The order of one switch: preflight, intent row, then the steps (or the failure policy)."""
        ended = self._preflight(run, config)
        if ended is not None:
            return ended
        plan = run.plan
        assert plan is not None
        rec = plan.record
        # --- intent row before anything is stopped
        self._report(run, Phase.INTENT, "ledger intent row")
        rec.id = self.ports.ledger.begin(rec)
        with self._lock:
            run.ledger_id = rec.id
        self.steps.persist(run)
        try:
            refused = self._stop_side(run, config, plan)
            if refused is not None:
                return refused
            self._bring_up(run, config, plan)
        except StepFailed as f:
            return self.failure.handle(run, config, rec, f, plan.target)
        except GpushiftError as e:  # an adapter said no (systemd refused a job, ...)
            return self.failure.handle(run, config, rec, StepFailed(run.phase, str(e)), plan.target)
        rec.outcome = Outcome.OK.value
        rec.message = f"{run.target} is serving" if run.target != OFF else "every backend stopped; GPUs free"
        if run.target != OFF:
            self.preflight.learn(rec)
        return close(self.steps, run, rec, True, config=config)

    def _preflight(self, run: SwitchRun, config: Config) -> SwitchResult | None:
        """Nothing touched yet, every read asked now: the run's plan, or how the switch ends here
        (nothing to do, or refused)."""
        clock = self.ports.clock
        target = run.target
        self._report(run, Phase.PREFLIGHT, f"checking {target}")
        t0 = clock.monotonic()
        states = self.unit_states(config)  # read once: what runs, the target's unit, the doctor's
        running = running_backends(group.running(self.ports.units, config, states))
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
        self.steps.persist(run)  # from here until the row is complete, a restarted daemon converges from it
        plan = self.preflight.plan(run, config, running, states)
        rec = plan.record
        with self._lock:
            run.plan = plan
            run.stopping = list(plan.to_stop)
        rec.durations_s["preflight"] = round(clock.monotonic() - t0, 3)
        if plan.refusal is None:
            return None
        rec.outcome = Outcome.REFUSED.value
        rec.failed_phase = Phase.PREFLIGHT.value
        rec.message = f"refused: {plan.refusal}"
        rec.id = self.ports.ledger.begin(rec)
        return close(self.steps, run, rec, False, plan.refusal_error, config)

    def _stop_side(self, run: SwitchRun, config: Config, plan: Plan) -> SwitchResult | None:
        """The before_stop hook (a required one that fails refuses: nothing stopped yet), the drain
        and the stops; the result when the hook refused."""
        clock, steps, rec = self.ports.clock, self.steps, plan.record
        steps.check_cancel(run, Phase.INTENT)  # a cancel during the preflight ends it here
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
            group.stop(steps, run, config, config.backends[b])
        rec.durations_s["stop"] = round(clock.monotonic() - t0, 3)
        return None

    def _bring_up(self, run: SwitchRun, config: Config, plan: Plan) -> None:
        """The VRAM gate, the start and readiness, the warm-up, the version, the after_ready hook."""
        clock, steps, rec, target_cfg = self.ports.clock, self.steps, plan.record, plan.target
        # A cancel that came during a stop job is not lost: the stops are done, so it is honoured
        # as the gate begins (the failure policy brings the previous backend back).
        steps.check_cancel(run, Phase.RELEASE)
        ready: UnitState | None = None
        if plan.target_running and target_cfg is not None:
            # The target already runs (beside the others just stopped, or found running by a
            # recovery): its own memory stays, so there is nothing to release and nothing to
            # start; prove it answers.
            ready = group.start(steps, run, config, target_cfg, rec.durations_s, rec.extra, launch=False)
        else:
            # --- VRAM gate
            t0 = clock.monotonic()
            released = steps.wait_released(run, config, plan.watched, f"for {run.target}")
            rec.vram["released"] = [r.to_dict() for r in released]
            rec.durations_s["release"] = round(clock.monotonic() - t0, 3)
            if target_cfg is not None:
                steps.check_cancel(run, Phase.RELEASE)
                steps.persist(run)
                ready = group.start(steps, run, config, target_cfg, rec.durations_s, rec.extra)
        if target_cfg is None:
            return
        # The unit as read with its 200; after a warm-up request, as it runs now.
        # (Several instances: the first that serves describes the backend; switch/instances.py.)
        serving, sent = group.warm_up(steps, run, config, target_cfg, rec, ready)
        st, target_cfg = (ready if serving is target_cfg else None), serving
        if sent or st is None:
            st = self.ports.units.state(target_cfg.unit)
        steps.compare_models(run, target_cfg, rec, st)  # recorded, never a failure
        steps.persist(run)
        steps.check_cancel(run, Phase.READY)
        rec.vram["ready"] = [r.to_dict() for r in steps.readings(plan.watched)]
        # --- version and the launch as it really runs
        self._report(run, Phase.VERSION, f"asking {run.target} its version")
        t0 = clock.monotonic()
        steps.record_launch(rec, target_cfg, st)
        rec.durations_s["version"] = round(clock.monotonic() - t0, 3)
        # --- the after_ready hook, before the row is closed (a cancel during it: rollback)
        self.hooks.run(HookEvent.AFTER_READY, run, config, rec, f"{run.target} is serving")
        steps.check_cancel(run, Phase.HOOKS)

"""What happens when a step of a switch fails after the intent row — the failure policy.

* Nothing touched yet (refused, or cancelled before the first stop): all is as it was.
* A failed STOP touches nothing more (the old backend may still run): outcome ``failed``.
* Otherwise the target is stopped if it runs, then
  - ``on_failure = "stay"`` (or nothing ran before): everything stays stopped, outcome ``failed``;
  - ``on_failure = "rollback"``: the previous backend must pass the same VRAM gate, then start and
    become ready: outcome ``rolled_back``; if it cannot, everything stays stopped and the message
    says so: outcome ``failed``.
"""

from __future__ import annotations

from typing import Any

from gpushift.config.instances import units_of
from gpushift.config.schema import BackendConfig, Config
from gpushift.errors import GpushiftError, SwitchFailed, VramNotReleased
from gpushift.switch import frontdoor, records
from gpushift.switch import instances as group
from gpushift.switch.policy import gate_gpus
from gpushift.switch.run import StepFailed, SwitchResult, SwitchRun
from gpushift.switch.steps import Steps
from gpushift.values import Outcome, Phase, SwitchRecord


def close(
    steps: Steps,
    run: SwitchRun,
    rec: SwitchRecord,
    ok: bool,
    error: str | None = None,
    config: Config | None = None,
) -> SwitchResult:
    """Complete the ledger row and turn it into the run's result.  The front door (when there is
    one) releases the requests it holds to what serves now, first; a row that ends failed, rolled
    back or refused then runs the ``on_failure`` hook (with ``config``), so the row records both."""
    frontdoor.release(steps.ports, run, rec, config)
    if not ok and config is not None and steps.on_failure is not None:
        steps.on_failure(run, config, rec)
    rec.finished_at = steps.ports.clock.now()
    steps.ports.ledger.finish(rec)
    return SwitchResult(
        ticket=run.ticket,
        ok=ok,
        outcome=Outcome(rec.outcome),
        from_backend=rec.from_backend,
        to_backend=rec.to_backend,
        message=rec.message or "",
        failed_phase=Phase(rec.failed_phase) if rec.failed_phase else None,
        systemd_result=rec.systemd_result,
        ledger_id=rec.id,
        backend_version=rec.backend_version,
        durations_s=dict(rec.durations_s),
        touched=run.touched,
        error=error,
        cancelled_by=run.cancelled_by,
    )


class FailurePolicy:
    def __init__(self, steps: Steps, log: Any) -> None:
        self.steps = steps
        self.log = log

    def handle(
        self, run: SwitchRun, config: Config, rec: SwitchRecord, f: StepFailed, target: BackendConfig | None
    ) -> SwitchResult:
        steps = self.steps
        rec.failed_phase = f.phase.value
        rec.message = f.message
        rec.systemd_result = f.systemd_result
        if f.foreign is not None:
            rec.extra["foreign_answer"] = dict(f.foreign)  # who answered on the target's port
        if run.cancelled_by is not None:
            rec.extra["cancelled_by"] = run.cancelled_by
        self.log.warning("switch_failed", ticket=run.ticket, phase=f.phase.value, message=f.message)
        error = VramNotReleased.dbus_name() if f.vram else SwitchFailed.dbus_name()
        if (
            target is not None
            and not target.instances
            and f.phase in (Phase.START, Phase.READY, Phase.WARMUP)
        ):
            # (Several instances: each failed one's evidence is in its entry, extra.instances.)
            # Read before the target is stopped below: its exit and last log lines are the why.
            rec.extra["evidence"] = records.evidence(steps.ports, target.unit, config.daemon.evidence_lines)
        if not run.touched:
            # Cancelled (or failed) before anything was stopped or started: all is as it was.
            rec.outcome = (Outcome.CANCELLED if f.cancelled else Outcome.FAILED).value
            was = ", ".join(run.stopping) if run.stopping else "nothing"
            rec.message = f"{f.message}; nothing was stopped ({was} still as before)"
            return close(steps, run, rec, False, error, config)
        if f.phase is Phase.STOP:
            # The old backend may still run: touch nothing more, say so.
            rec.outcome = Outcome.FAILED.value
            return close(steps, run, rec, False, error, config)
        previous = run.stopping[0] if run.stopping else None
        rollback = config.daemon.on_failure == "rollback" and previous is not None
        if rollback:
            assert previous is not None
            steps.guard.begin_rollback(run, previous)  # from here on a cancel is refused: the way back
            steps.persist(run)  # a daemon that dies now recovers to the rollback's destination
        # The target must not be left half-started (a failed unit is stopped, its state kept).
        if target is not None and group.any_running(steps, target):
            steps.report(run, Phase.ROLLBACK, f"stopping {', '.join(units_of(target))}")
            try:
                group.stop(steps, run, config, target)
            except StepFailed as f2:
                rec.outcome = Outcome.FAILED.value
                rec.message = f"{f.message}; then {f2.message}"
                return close(steps, run, rec, False, error, config)
        if not rollback or previous is None:
            rec.outcome = Outcome.FAILED.value
            why = "failure policy is 'stay'" if previous else "nothing ran before"
            rec.message = f"{f.message}; {why}: every backend stays stopped"
            return close(steps, run, rec, False, error, config)
        return self._rollback(run, config, rec, f, previous, error)

    def _rollback(
        self, run: SwitchRun, config: Config, rec: SwitchRecord, f: StepFailed, previous: str, error: str
    ) -> SwitchResult:
        """The previous backend again, through the same gate."""
        steps = self.steps
        prev = config.backends[previous]
        steps.report(run, Phase.ROLLBACK, f"rolling back to {previous}")
        rollback: dict[str, Any] = {"to": previous}
        rec.extra["rollback"] = rollback
        watched = gate_gpus(config, previous, [], steps.all_gpus())
        try:
            try:
                steps.wait_released(run, config, watched, f"for the rollback to {previous}")
                durations: dict[
                    str, float
                ] = {}  # the rollback's own timings, apart from the failed attempt's
                rollback["durations_s"] = durations
                group.start(steps, run, config, prev, durations, rollback)
            except GpushiftError as e:
                raise StepFailed(Phase.ROLLBACK, str(e)) from None
        except StepFailed as f2:
            rec.outcome = Outcome.FAILED.value
            rec.message = f"{f.message}; rollback to {previous} impossible: {f2.message}; nothing is serving"
            rollback["error"] = f2.message
            if group.any_running(steps, prev):
                # (From the phase the rollback failed in, a stop goes through rollback again.)
                steps.report(run, Phase.ROLLBACK, f"stopping {', '.join(units_of(prev))}")
                try:
                    group.stop(steps, run, config, prev)
                except StepFailed as f3:
                    rec.message += f"; {f3.message}"
            return close(steps, run, rec, False, error, config)
        rec.outcome = Outcome.ROLLED_BACK.value
        rec.message = f"{f.message}; rolled back: {previous} serves again"
        rollback["ok"] = True
        return close(steps, run, rec, False, error, config)

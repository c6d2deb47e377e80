"""Crash recovery — what a daemon that died in the middle of a switch converges to.

The switcher writes its run down before a stop, before a start, after ready and when it rolls
back (:class:`~gpushift.ports.RunStore`).  A daemon that starts and finds an unfinished run:

1. closes that run's ledger row as ``interrupted``, naming the phase it died in;
2. recovers to what should serve now, through the full gate (a target found already active is
   still health-checked and gets its complete launch row):
   - the rollback's destination, if it died while rolling back;
   - the run's target, for a person's switch or a recovery that was itself interrupted;
   - the override's backend, when a person's override or hold is in force;
   - the schedule's choice otherwise (the run's own target when there is no schedule);
3. gives up after :data:`MAX_RECOVERIES` recoveries in a row were interrupted: the host is left
   stopped (every backend unit stopped, nothing started) and held there until a person acts.

With a front door, the requests it holds since the dead daemon closed a backend are released as the
recovery switch's row closes, to what serves then (``switch/frontdoor.py``); a recovery that gives
up releases ``off`` at once, so they are answered rather than left waiting.

:func:`plan` is pure (the run and the facts in, a :class:`RecoveryPlan` out); :func:`prepare`
reads the run and closes its row at daemon start; the recovery switch itself is a decision of the
keeper's like every other switch (``Keeper.recover``, with :func:`announce`'s reason).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from gpushift.config.instances import units_of
from gpushift.errors import GpushiftError
from gpushift.switch import frontdoor
from gpushift.switch.machine import Switcher
from gpushift.switch.run import SwitchRun
from gpushift.values import OFF, Outcome, SwitchRecord, Trigger

#: Recoveries interrupted in a row before the daemon stops trying and leaves the host stopped.
MAX_RECOVERIES = 3


@dataclass(frozen=True)
class RecoveryPlan:
    found: SwitchRun  # the unfinished run a previous daemon left
    target: str  # what to recover to
    why: str  # one line: where the target comes from
    attempt: int  # this recovery's number in a row (1 = the first)
    give_up: bool  # too many interrupted recoveries: stop everything and wait for a person

    @property
    def interrupted_message(self) -> str:
        """The message of the interrupted run's ledger row."""
        head = f"the daemon died during this switch (phase {self.found.phase})"
        if self.give_up:
            return f"{head}; {MAX_RECOVERIES} recoveries in a row were interrupted: gave up, every backend stopped"
        return f"{head}; recovering to {self.target} ({self.why})"


def plan(
    found: SwitchRun,
    backends: Collection[str],
    override_backend: str | None,
    schedule_wants: str | None,
) -> RecoveryPlan:
    """What to do about ``found``, the run a previous daemon did not finish."""
    attempt = found.recovery_attempt + 1 if found.trigger is Trigger.RECOVERY else 1
    if found.rollback_to is not None:
        target, why = found.rollback_to, f"it died rolling back to {found.rollback_to}"
    elif found.trigger in (Trigger.MANUAL, Trigger.RECOVERY):
        target, why = found.target, f"the {found.trigger} switch's target"
    elif override_backend is not None:
        target, why = override_backend, "the override in force"
    elif schedule_wants is not None:
        target, why = schedule_wants, "what the schedule wants now"
    else:
        target, why = found.target, "the switch's target (no schedule)"
    if target != OFF and target not in backends:
        target, why = OFF, f"{why} ({target}) is no longer configured"
    return RecoveryPlan(found, target, why, attempt, give_up=attempt > MAX_RECOVERIES)


def prepare(
    sw: Switcher, override_backend: str | None, schedule_wants: str | None, log: Any
) -> RecoveryPlan | None:
    """At daemon start, before anything else decides: read the unfinished run a previous daemon
    left (None: there is none), close its ledger row as ``interrupted``, and — when recoveries
    have been interrupted too often — give up: stop every backend and record it.  The recovery
    switch itself is the keeper's (after the daemon has closed any other unfinished row)."""
    runs = sw.ports.runs
    data = runs.load() if runs is not None else None
    if runs is None or data is None:
        return None
    try:
        found = SwitchRun.from_dict(data)
    except (KeyError, ValueError, TypeError) as e:
        log.error(
            "recovery_unreadable_run", error=repr(e), detail="the unfinished run cannot be read; ignored"
        )
        runs.clear()
        return None
    p = plan(found, sw.config.backends, override_backend, schedule_wants)
    _close_interrupted(sw, p, log)
    if p.give_up:
        log.error(
            "recovery_gave_up",
            ticket=found.ticket,
            phase=found.phase.value,
            attempts=MAX_RECOVERIES,
            detail="every backend is stopped and held off until a person acts",
        )
        _stop_everything(sw, p, log)
        runs.clear()
    return p


def announce(p: RecoveryPlan, log: Any) -> str:
    """Log that the recovery switch begins; returns the reason its switch (to ``p.target``, through
    the full gate, a running target verified) is asked for with."""
    log.warning(
        "recovery_started",
        ticket=p.found.ticket,
        phase=p.found.phase.value,
        target=p.target,
        why=p.why,
        attempt=p.attempt,
    )
    return f"recovery after the daemon's restart: {p.why}"


def _close_interrupted(sw: Switcher, p: RecoveryPlan, log: Any) -> None:
    """The interrupted run's row: outcome ``interrupted``, with the phase it died in."""
    ledger = sw.ports.ledger
    found = p.found
    try:
        rec = ledger.get(found.ledger_id) if found.ledger_id is not None else None
        if rec is None or rec.outcome != Outcome.PENDING.value:
            return
        rec.outcome = Outcome.INTERRUPTED.value
        rec.failed_phase = found.phase.value
        rec.message = p.interrupted_message
        rec.extra["interrupted"] = {
            "phase": found.phase.value,
            "ticket": found.ticket,
            "recovery_to": p.target,
        }
        rec.finished_at = sw.ports.clock.now()
        ledger.finish(rec)
    except GpushiftError as e:
        log.error("recovery_row_not_closed", ticket=found.ticket, ledger_id=found.ledger_id, error=str(e))


def _stop_everything(sw: Switcher, p: RecoveryPlan, log: Any) -> None:
    """Give up safely: stop every backend unit (no start), record it, and call it established."""
    now = sw.ports.clock.now()
    running = sw.running_backends()
    rec = SwitchRecord(
        trigger=Trigger.RECOVERY.value,
        requested_by="gpushift",
        reason=f"{MAX_RECOVERIES} recoveries in a row were interrupted by the daemon's death",
        from_backend=running[0] if running else None,
        to_backend=OFF,
        started_at=now,
        ticket=f"recovery-{p.found.ticket}",
        gpushift_version=sw.version,
    )
    errors = []
    for unit in (u for name in running for u in units_of(sw.config.backends[name])):  # every instance's
        try:
            job = sw.ports.units.stop(unit, sw.config.daemon.stop_timeout_s)
            if not job.ok:
                errors.append(f"{unit}: stop job {job.result}")
        except GpushiftError as e:
            errors.append(f"{unit}: {e}")
    if sw.ports.frontdoor is not None:  # nothing will serve: the held requests are answered now
        rec.extra[frontdoor.KEY] = frontdoor.release_to(sw.ports.frontdoor, OFF, {})
    rec.outcome = Outcome.FAILED.value
    rec.failed_phase = p.found.phase.value
    rec.message = (
        "recovery gave up: every backend stopped, nothing started; `gpushift switch` or `gpushift resume` "
        "to bring one back" + (f" (stop errors: {'; '.join(errors)})" if errors else "")
    )
    rec.finished_at = sw.ports.clock.now()
    try:
        rec.id = sw.ports.ledger.begin(rec)
        sw.ports.ledger.finish(rec)
    except GpushiftError as e:
        log.error("recovery_row_not_written", ticket=rec.ticket, error=str(e))
    sw.adopt(OFF, force=True)

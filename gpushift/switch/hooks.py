"""The configured hooks of a switch — when each runs, what it is told, what is recorded.

* ``before_stop``: after the intent row, before anything is stopped.  A ``required`` one that
  fails (non-zero exit, a timeout, cannot run) refuses the switch: outcome ``refused``, nothing
  stopped, its message in the row.  Any other failure is only recorded.
* ``after_ready``: once the target answered its warm-up and its launch is recorded, before the row
  is closed.
* ``on_failure``: from :func:`~gpushift.switch.failure.close`, for a switch that ends ``failed``,
  ``rolled_back`` or ``refused``.
* ``before_boundary`` is not a switch's: the daemon's look-ahead runs it (``notify/notices.py``)
  with the same environment (:func:`environment`).

Each runs through the :class:`~gpushift.ports.HookRunner` port (a transient systemd unit, as
``[hooks] user``); the phase is ``hooks`` while it runs, so progress and status show it.  A
cancel during a hook stops it, then follows the switch's cancel rules (the caller's next
``check_cancel``).  Every run is recorded in the row's ``extra.hooks`` and logged as
``hook_finished``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpushift.config.schema import Config
from gpushift.safetext import redact
from gpushift.switch.run import SwitchRun
from gpushift.switch.steps import Steps
from gpushift.values import OFF, HookEvent, HookOutcome, HookSpec, Outcome, Phase, SwitchRecord

#: The outcomes after which ``on_failure`` runs.
FAILURE_OUTCOMES = (Outcome.FAILED.value, Outcome.ROLLED_BACK.value, Outcome.REFUSED.value)


def environment(
    event: HookEvent,
    *,
    config: Config,
    from_backend: str | None,
    to_backend: str,
    trigger: str,
    at: datetime,
    ticket: str = "",
    ledger_id: int | None = None,
    reason: str = "",
    outcome: str = "",
    phase: str = "",
    message: str = "",
) -> dict[str, str]:
    """The ``GPUSHIFT_*`` variables a hook gets (docs/hooks.md lists them).  Empty when unknown."""

    def unit(name: str | None) -> str:
        b = config.backends.get(name) if name and name != OFF else None
        return b.unit if b is not None else ""

    env = {
        "GPUSHIFT_EVENT": event.value,
        "GPUSHIFT_TICKET": ticket,
        "GPUSHIFT_LEDGER_ID": "" if ledger_id is None else str(ledger_id),
        "GPUSHIFT_FROM": from_backend or OFF,
        "GPUSHIFT_TO": to_backend,
        "GPUSHIFT_FROM_UNIT": unit(from_backend),
        "GPUSHIFT_TO_UNIT": unit(to_backend),
        "GPUSHIFT_TRIGGER": trigger,
        "GPUSHIFT_REASON": reason,
        "GPUSHIFT_OUTCOME": outcome,
        "GPUSHIFT_PHASE": phase,
        "GPUSHIFT_MESSAGE": message,
        "GPUSHIFT_AT": at.isoformat(),
    }
    # An environment value cannot hold NUL; a long message is cut (the row has all of it).
    return {k: v.replace("\0", "")[:4000] for k, v in env.items()}


def unit_name(event: HookEvent, ticket: str) -> str:
    """``gpushift-hook-before-stop-<ticket>.service``: one transient unit per hook run."""
    return f"gpushift-hook-{event.value.replace('_', '-')}-{ticket}.service"


def record(
    rec: SwitchRecord | None, event: HookEvent, argv: tuple[str, ...], user: str, out: HookOutcome
) -> None:
    """Append one hook run to the row's ``extra.hooks``."""
    if rec is None:
        return
    hooks = rec.extra.setdefault("hooks", [])
    hooks.append({"event": event.value, "argv": redact.redact_argv(argv), "user": user, **out.to_dict()})


class SwitchHooks:
    """The hooks of the switch in flight, bound to its steps (the ports, progress, heartbeat)."""

    def __init__(self, steps: Steps, log: Any) -> None:
        self.steps = steps
        self.log = log

    def run(
        self, event: HookEvent, run: SwitchRun, config: Config, rec: SwitchRecord, message: str = ""
    ) -> HookOutcome | None:
        """Run the hook configured for ``event`` (None when there is none, or no runner)."""
        hook = config.hooks.get(event)
        runner = self.steps.ports.hooks
        if hook is None or runner is None:
            return None
        steps = self.steps
        was = run.phase
        steps.report(run, Phase.HOOKS, f"{event.value} hook: {hook.argv[0]}")
        env = environment(
            event,
            config=config,
            from_backend=rec.from_backend,
            to_backend=rec.to_backend,
            trigger=rec.trigger,
            at=steps.ports.clock.now(),
            ticket=run.ticket,
            ledger_id=rec.id,
            reason=rec.reason,
            outcome=rec.outcome if rec.outcome != Outcome.PENDING.value else "",
            phase=(rec.failed_phase or "") if event is HookEvent.ON_FAILURE else was.value,
            message=message or (rec.message or ""),
        )
        spec = HookSpec(unit_name(event, run.ticket), hook.argv, env, config.hooks.user, hook.timeout_s)
        out = runner.run(spec, lambda: run.cancel_requested_by is not None, steps.beat)
        record(rec, event, hook.argv, config.hooks.user, out)
        rec.durations_s[Phase.HOOKS.value] = round(
            rec.durations_s.get(Phase.HOOKS.value, 0.0) + out.seconds, 3
        )
        self.log.info(
            "hook_finished",
            hook=event.value,
            ticket=run.ticket,
            unit=out.unit,
            result=out.result,
            exit_status=out.exit_status,
            seconds=round(out.seconds, 3),
            detail=out.describe(),
        )
        return out

    def before_stop(self, run: SwitchRun, config: Config, rec: SwitchRecord) -> str | None:
        """Run ``before_stop``; the refusal's message when it is required and failed, else None."""
        hook = config.hooks.before_stop
        out = self.run(HookEvent.BEFORE_STOP, run, config, rec)
        if out is None or out.ok or hook is None or not hook.required or out.result == "cancelled":
            return None
        said = out.output.strip().splitlines()[-1:] if out.output.strip() else []
        return f"the required before_stop hook {hook.argv[0]} said no ({out.describe()})" + (
            f": {said[0]}" if said else ""
        )

    def on_failure(self, run: SwitchRun, config: Config, rec: SwitchRecord) -> None:
        """Run ``on_failure`` for a row that ends failed, rolled back or refused."""
        if rec.outcome in FAILURE_OUTCOMES:
            self.run(HookEvent.ON_FAILURE, run, config, rec)

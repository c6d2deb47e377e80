"""Telling people — the webhook's documents and the ``before_boundary`` hook.

* After every switch (not one that found its target already serving): one JSON document to
  ``[notify] webhook_url`` (:func:`switch_document`).
* Before a scheduled switch, two look-ahead consumers (``keeper/lookahead.py``): the webhook's
  notice ``[notify] lead_s`` before it (:func:`notice_document`; 0 turns it off), and the
  ``before_boundary`` hook ``[hooks] before_boundary.lead_s`` before it, run on a thread of its own
  (a hook may take minutes; a consumer must return at once) and logged as ``hook_finished``.

Every document has a top-level ``text`` line (what Slack- and Mattermost-style incoming webhooks
show) and the structured fields; the sender hides credentials before queueing it.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpushift.config.schema import Config
from gpushift.keeper import Coming
from gpushift.keeper.lookahead import Consumer
from gpushift.notify.webhook import WebhookSender
from gpushift.ports import HookRunner, Ledger
from gpushift.switch import SwitchResult
from gpushift.switch.hooks import environment
from gpushift.values import OFF, HookEvent, HookSpec

HOOK = "before_boundary"
NOTICE = "notice"


def switch_document(result: SwitchResult, host: str, row: Any = None) -> dict[str, Any]:
    """The document for a finished switch (``row``: its ledger record, for who, why and when)."""
    seconds = sum(v for v in result.durations_s.values() if isinstance(v, (int, float)))
    frm = result.from_backend or OFF
    text = f"gpushift on {host}: {frm} → {result.to_backend}: {result.outcome.value}"
    if result.message:
        text += f" — {result.message}"
    doc: dict[str, Any] = {
        "text": text,
        "event": "switch_finished",
        "host": host,
        "ticket": result.ticket,
        "ledger_id": result.ledger_id,
        "from": frm,
        "to": result.to_backend,
        "outcome": result.outcome.value,
        "ok": result.ok,
        "message": result.message,
        "failed_phase": result.failed_phase.value if result.failed_phase else None,
        "backend_version": result.backend_version,
        "seconds": round(seconds, 3),
    }
    if row is not None:
        doc.update(
            trigger=row.trigger,
            requested_by=row.requested_by,
            reason=row.reason,
            started_at=row.started_at.isoformat() if row.started_at else None,
            finished_at=row.finished_at.isoformat() if row.finished_at else None,
        )
    return doc


def notice_document(coming: Coming, host: str, now: datetime) -> dict[str, Any]:
    """The document sent some time before a scheduled switch."""
    minutes = max(0, round((coming.at - now).total_seconds() / 60))
    frm = coming.from_backend or OFF
    return {
        "text": f"gpushift on {host}: in {minutes} min ({coming.at:%H:%M} UTC) {frm} → {coming.target} (scheduled)",
        "event": "switch_coming",
        "host": host,
        "from": frm,
        "to": coming.target,
        "at": coming.at.isoformat(),
        "in_s": round((coming.at - now).total_seconds()),
        "why": coming.why,
    }


class Notices:
    """Args:
    config: the config in force (asked at every use).
    sender: the webhook's queue and thread.
    hooks: the hook runner (None: no hooks can run, e.g. no systemd).
    ledger: the rows a finished switch's document reads who, why and when from.
    now: the wall clock (aware UTC).
    """

    def __init__(
        self,
        config: Callable[[], Config],
        sender: WebhookSender,
        hooks: HookRunner | None,
        ledger: Ledger | None,
        now: Callable[[], datetime],
        log: Any,
        host: str | None = None,
    ) -> None:
        self.config = config
        self.sender = sender
        self.hooks = hooks
        self.ledger = ledger
        self.now = now
        self.log = log
        self.host = host or socket.gethostname()

    def consumers(self) -> list[Consumer]:
        return [
            Consumer(HOOK, self._hook_lead, self._run_hook),
            Consumer(NOTICE, self._notice_lead, self._notice),
        ]

    # ------------------------------------------------------------ after a switch

    def finished(self, result: SwitchResult) -> None:
        """On the worker thread, as a switch ends: queue its document (returns at once)."""
        if result.already or not self.config().notify.enabled:
            return
        row = None
        if self.ledger is not None and result.ledger_id is not None:
            try:
                row = self.ledger.get(result.ledger_id)
            except Exception as e:  # the document goes out without who and why
                self.log.error("webhook_row_unreadable", ledger_id=result.ledger_id, error=repr(e))
        self.sender.enqueue(switch_document(result, self.host, row))

    # ------------------------------------------------------------ before a switch

    def _notice_lead(self, coming: Coming) -> float | None:
        n = self.config().notify
        return n.lead_s if n.enabled and n.lead_s > 0 else None

    def _notice(self, coming: Coming) -> None:
        self.sender.enqueue(notice_document(coming, self.host, self.now()))

    def _hook_lead(self, coming: Coming) -> float | None:
        hook = self.config().hooks.before_boundary
        return hook.lead_s if hook is not None and self.hooks is not None else None

    def _run_hook(self, coming: Coming) -> None:
        cfg = self.config()
        hook, runner = cfg.hooks.before_boundary, self.hooks
        if hook is None or runner is None:
            return
        env = environment(
            HookEvent.BEFORE_BOUNDARY,
            config=cfg,
            from_backend=coming.from_backend,
            to_backend=coming.target,
            trigger="schedule",
            at=coming.at,
            reason=coming.why,
            message=f"{coming.from_backend or OFF} → {coming.target} at {coming.at.isoformat()}",
        )
        name = f"gpushift-hook-before-boundary-{coming.at:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}.service"
        spec = HookSpec(name, hook.argv, env, cfg.hooks.user, hook.timeout_s)

        def run() -> None:
            out = runner.run(spec, lambda: False, lambda: None)
            self.log.info("hook_finished", hook=HOOK, unit=out.unit, result=out.result, exit_status=out.exit_status,
                          seconds=round(out.seconds, 3), detail=out.describe(), to=coming.target,
                          at=coming.at.isoformat(), output=out.output[-500:])  # fmt: skip

        threading.Thread(target=run, name="hook-before-boundary", daemon=True).start()

    # ------------------------------------------------------------ status

    def status(self, armed: dict[str, Any]) -> dict[str, Any]:
        """``status --json``'s ``notices``: the webhook's queue, and what each look-ahead consumer
        is armed for (``armed``: :meth:`LookAhead.status`)."""
        return {
            "webhook": self.sender.status() if self.config().notify.enabled else None,
            "lookahead": armed,
        }

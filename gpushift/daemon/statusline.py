"""systemd's status line of the daemon (``STATUS=`` through sd_notify; ``systemctl status gpushift``):
what serves, the next switch, a mode other than the schedule, and a ledger that is not fine."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpushift.errors import GpushiftError


def text(d: Any) -> str:
    """The line for the running daemon ``d`` (:class:`~gpushift.daemon.core.Daemon`)."""
    try:
        running = d.switcher.running_backends()
    except GpushiftError:
        running = []
    serving = ", ".join(running) if running else "nothing (GPUs free)"
    line = f"serving {serving}"
    ks = d.keeper.status() if hasattr(d, "keeper") else {}
    nxt = (ks.get("schedule") or {}).get("next")
    if nxt:
        local = datetime.fromisoformat(nxt["at_local"])
        line += f"; next: {nxt['target']} at {local:%H:%M}"
        if local.date() != datetime.now(local.tzinfo).date():
            line += f" on {local:%a %d %b}"
    if ks.get("mode") and ks["mode"] != "schedule":
        line += f"; {ks['mode']}"
    return line + ledger_note(d)


def ledger_note(d: Any) -> str:
    """``; ledger: degraded (<reason>)`` for the status line, or a new chain this daemon
    started (docs/ledger.md); nothing while the ledger is fine."""
    try:
        h = d.components.ports.ledger.health()
    except Exception as e:
        return f"; ledger: unreadable ({e!r})"[:120]
    if h.get("state") != "ok":
        return f"; ledger: {h.get('state')} ({h.get('reason') or h.get('error')})"
    brk = h.get("chain_break")
    return f"; ledger: new chain ({brk.get('reason')})" if isinstance(brk, dict) else ""

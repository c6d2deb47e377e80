"""The parts of ``gpushift switch``: its options as the daemon takes them, the progress lines it
prints while it follows the switch, and what it prints and exits with once the switch is queued,
refused or finished.  The command itself (gpushift.cli) asks the daemon and ends the process."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import click

from gpushift.cli.output import say, say_json
from gpushift.errors import GpushiftError, by_dbus_name
from gpushift.safetext import redact, terminal


def options(
    backend: str, reason: str, skip_drain: bool, restart: bool, when_idle: bool, hold: bool, until: str | None
) -> dict[str, Any]:
    """The switch's options for the daemon; a combination that makes no sense is a usage error."""
    if hold and until:
        raise click.UsageError("--hold and --until exclude each other (hold lasts until `gpushift resume`)")
    out: dict[str, Any] = {"reason": reason, "now": skip_drain}
    if restart:
        if backend == "off":
            raise click.UsageError("--restart relaunches a backend; `off` has nothing to restart")
        out["restart"] = True
    if when_idle:
        out["when_idle"] = True
    if hold:
        out["hold"] = True
    if until:
        out["until"] = until
    return out


def progress_printer(t0: float, as_json: bool) -> Callable[[str, str], None]:
    """One line per phase the daemon signals, with the seconds since ``t0``."""

    def progress(phase: str, detail: str) -> None:
        # progress goes to stderr with --json; the phase and detail come from the daemon
        say(
            f"[{time.monotonic() - t0:6.1f}s] {terminal.escape(phase):<9} {terminal.escape(detail)}",
            err=as_json,
        )

    return progress


def say_not_taken(e: GpushiftError, as_json: bool) -> None:
    """With --json, the error that kept the daemon from taking the switch (the caller then fails)."""
    if as_json:
        say_json(json.dumps({"ok": False, "error": e.dbus_name(), "message": redact.redact_text(str(e))}))


def say_queued(backend: str, result: dict[str, Any], as_json: bool) -> None:
    """--no-wait (or --when-idle): the ticket of the queued switch."""
    if as_json:
        say_json(json.dumps(result))
    elif result.get("ticket") == "when-idle":
        say(f"queued: switching to {terminal.escape(backend)} once the serving backend is idle")
    else:
        say(f"queued: ticket {terminal.escape(result.get('ticket') or '?')}")


def say_finished(result: dict[str, Any], t0: float, as_json: bool) -> int:
    """The finished switch's outcome; returns the exit status (0 when the backend is ready)."""
    result = redact.redact_tree(result)
    if as_json:
        say_json(json.dumps(result, indent=2, default=str))
    elapsed = time.monotonic() - t0
    if result.get("ok"):
        if not as_json:
            if result.get("already"):
                say(terminal.escape(result.get("message") or "already active"))
            else:
                led = f"ledger #{result['ledger_id']}, " if result.get("ledger_id") else ""
                say(f"ok: {terminal.escape(result.get('message') or 'switched')} ({led}{elapsed:.1f}s)")
        return 0
    cls = by_dbus_name().get(result.get("error") or "", GpushiftError)
    if not as_json:
        shown = terminal.escape_tree(result)
        outcome = shown.get("outcome") or "failed"
        say(f"gpushift: switch {outcome}: {shown.get('message') or 'no reason given'}", err=True)
    return cls.code if cls.code != 1 else 7

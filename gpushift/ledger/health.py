"""What ``SqliteLedger.health`` says: the ledger's state for the status line, from plain values.

Pure: the writer hands in how many records wait, its last write error, the head file's alarm, the
break it recorded and how many records the full spool lost; this module turns them into the dict
``health()`` returns, with a few words (``reason``) a person reads on the status line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def summary(
    pending: int,
    error: str | None,
    alarm: Mapping[str, Any] | None,
    chain_break: dict[str, Any] | None,
    lost: int,
) -> dict[str, Any]:
    """``{"state": "ok"|"degraded", "pending": N, "error": str|None, "alarm": str|None}``, and where
    they say something: ``reason``, ``chain_break``, ``lost`` (``SqliteLedger.health`` says what
    each means)."""
    state = "degraded" if pending or error else "ok"
    out: dict[str, Any] = {
        "state": state,
        "pending": pending,
        "error": error,
        "alarm": None if alarm is None else str(alarm.get("what")),
    }
    if state != "ok":
        short = short_reason(error)
        out["reason"] = ", ".join(x for x in (short, f"{pending} pending" if pending else "") if x)
    if chain_break is not None:
        out["chain_break"] = chain_break
    if lost:
        out["lost"] = lost
    return out


def short_reason(error: str | None) -> str:
    """A few words for the status line from a write error's text."""
    if not error:
        return ""
    low = error.lower()
    if "cannot be moved aside" in low:
        return "a bad database cannot be moved aside"
    for words, reason in (
        (("disk is full", "no space left"), "disk full"),
        (("readonly", "read-only"), "read-only"),
        (("is locked", "is busy"), "locked"),
        (("not a database", "malformed", " is corrupt "), "not a database"),
        (("permission denied", "unable to open"), "cannot open the database"),
    ):
        if any(w in low for w in words):
            return reason
    return error.split(":", 1)[0]

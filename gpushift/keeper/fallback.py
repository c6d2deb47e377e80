"""The fallback: a crashed backend that cannot be brought back gives way to the one that served before.

Pure.  The serving backend crashed or wedged (:mod:`.watch`), and its relaunches failed
``max_attempts`` times — e.g. a port impostor holds its port, so the preflight refuses the start,
the readiness check finds the impostor, or the real server exits at once.  Giving up there leaves
the host serving nothing until a person acts.  With ``on_failure = "rollback"`` the keeper then
switches, once per crash, to the backend that served before the crashed one (the one the failure
policy's rollback would have brought back had the crashed backend's start been a switch): a ledger
row of its own (trigger ``rollback``) whose reason names the failed relaunches.  The crashed backend
then waits, as before, for the next schedule boundary, ``gpushift switch`` or ``gpushift resume``.

The rule does not apply with ``on_failure = "stay"``, when nothing known served before the crashed
backend, or when something serves already.  The keeper learns who served before whom from the
switches it sees end ``ok``, and at its start from the ledger's newest rows (:func:`ledger_before`:
a daemon restarted since the crashed backend's switch still knows it).  The fallback is tried once:
when it fails too, nothing serves and ``status`` says so; when the switcher refuses it because
another switch runs (``SwitchInProgress``), it is asked for again at the next decision while nothing
serves and no person acted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpushift.ports import Ledger
from gpushift.values import OFF, Outcome, SwitchRecord, Trigger

#: The newest ledger rows the keeper reads at its start to learn who served before whom.
LEDGER_ROWS = 50


@dataclass(frozen=True)
class FallBack:
    """What the keeper does once the relaunches gave up."""

    target: str | None  # switch to it now (None: it was tried already)
    reason: str  # that switch's reason (its ledger row's)
    blocked: str  # what ``status`` says (``blocked``)


def fall_back(
    backend: str,
    before: str | None,
    tried: bool,
    failures: int,
    last_message: str,
    actual: str,
    on_failure: str,
    when: str,
) -> FallBack | None:
    """The fallback for ``backend`` (crashed, ``failures`` failed relaunches, the last one's message
    ``last_message``), which ``before`` served before; ``actual`` is what runs, ``when`` the next
    schedule boundary.  None: the rule does not apply (the keeper gives up as before)."""
    if on_failure != "rollback" or before is None or before in (OFF, backend):
        return None
    if not tried and actual != OFF:
        return None  # something serves already
    relaunches = f"{failures} failed relaunches of {backend} (last: {last_message})"
    wait = f"{backend} waits for the next boundary ({when}), `gpushift switch` or `gpushift resume`"
    if not tried:
        reason = f"fallback: {relaunches}; {before} served before it"
        return FallBack(before, reason, f"fell back to {before} after {relaunches}; {wait}")
    if actual == before:
        return FallBack(None, "", f"fell back to {before} after {relaunches}; {wait}")
    now = "nothing serves" if actual == OFF else f"{actual} runs"
    return FallBack(
        None, "", f"fell back to {before} after {relaunches}, but {before} does not serve ({now}); {wait}"
    )


def served_before(target: str, was: str | None) -> tuple[str, str] | None:
    """(``target``, ``was``) when a switch from ``was`` that ended ok says who served before
    ``target``; None when it says nothing (nothing ran before it, or it was a relaunch)."""
    if was is None or was in (OFF, target):
        return None
    return target, was


def rows_before(rows: Iterable[SwitchRecord]) -> tuple[str, str] | None:
    """Who served before whom, from ledger rows newest first: the newest switch of gpushift's that
    ended ok from another backend (a person's ``systemctl``, trigger ``external``, is not one; the
    keeper does not learn from it either)."""
    for r in rows:
        if r.outcome != Outcome.OK.value or r.trigger == Trigger.EXTERNAL.value or not r.to_backend:
            continue
        learned = served_before(r.to_backend, r.from_backend)
        if learned is not None:
            return learned
    return None


def ledger_before(ledger: Ledger, log: Any) -> tuple[str, str] | None:
    """:func:`rows_before` of the ledger's :data:`LEDGER_ROWS` newest rows.  A ledger that cannot be
    read is a warning, never a failed start (the keeper then learns it from the switches it sees)."""
    try:
        rows = ledger.list(limit=LEDGER_ROWS)
    except Exception as e:  # whatever the ledger raises, the daemon starts
        log.warning("fallback_ledger_unreadable", error=str(e))
        return None
    return rows_before(rows)

"""A host's own ledger row against its copy in the central table (pure).

A row changes on its host in known ways only (``ledger/store.py``): the intent row is finished, or
marked ``interrupted`` by the next daemon (its outcome leaves ``pending``, the record is rewritten,
``uuid``, ``ticket`` and ``started_at`` stay); and a row after a rewritten one is re-linked (only
``prev_hash`` and ``hash`` change).  The mirror carries exactly those changes (it updates the
central row).  Any other difference — the central row edited, or a host whose ledger was replaced —
is a mismatch: reported, never overwritten.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpushift.fleet.central import canon
from gpushift.ledger.chain import ROW_COLUMNS, row_hash
from gpushift.values import Outcome

SAME = "same"
CARRY = "carry"
MISMATCH = "mismatch"

#: What a finish or an interruption keeps of the intent row.
_KEPT_AT_FINISH = ("id", "uuid", "ticket", "started_at")
#: What a re-link changes.
_RELINK = {"prev_hash", "hash"}


@dataclass(frozen=True)
class Verdict:
    kind: str  # SAME, CARRY or MISMATCH
    what: str = ""  # for CARRY: the change ("finished", "relinked"); for MISMATCH: why


def compare(local: Mapping[str, Any], central_chain_row: str, central_ok: str | None) -> Verdict:
    """The verdict for one row: ``local`` (its columns by name), the central row's ``chain_row``
    and its self-check (``central.self_check``: None when it is what some host wrote)."""
    mine = canon(local)
    try:
        theirs = json.loads(central_chain_row)
    except ValueError:
        theirs = None
    if not isinstance(theirs, dict):
        return Verdict(MISMATCH, "the central row holds no readable row")
    if theirs == mine:
        return (
            Verdict(SAME)
            if central_ok is None
            else Verdict(MISMATCH, f"the central row was edited: {central_ok}")
        )
    if central_ok is not None:
        return Verdict(MISMATCH, f"the central row was edited: {central_ok}")
    changed = {c for c in ROW_COLUMNS if theirs.get(c) != mine.get(c)}
    if changed <= _RELINK:
        return Verdict(CARRY, "relinked")
    was_pending = theirs.get("outcome") == Outcome.PENDING.value
    if was_pending and all(theirs.get(c) == mine.get(c) for c in _KEPT_AT_FINISH):
        how = "interrupted" if mine.get("outcome") == Outcome.INTERRUPTED.value else "finished"
        return Verdict(CARRY, how)
    if theirs.get("uuid") != mine.get("uuid"):
        return Verdict(
            MISMATCH,
            "the host's row is another switch than the central one (the host's ledger was replaced?)",
        )
    return Verdict(MISMATCH, f"the host's row differs from the central one in {', '.join(sorted(changed))}")


def consistent(values: Mapping[str, Any]) -> bool:
    """Whether a local row matches its own hash (an edited local row is the local verify's to report)."""
    return row_hash(canon(values)) == values.get("hash")

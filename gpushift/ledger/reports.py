"""What ``gpushift ledger`` shows beyond raw rows: the list, one record in full (``show``), the
per-machine deployment README (``export --format markdown``) and the JSON lines export.

One record in full lives in ``show.py``, the README in ``readme.py``, the comparison of two launches
in ``diff.py``; their public names are re-exported here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gpushift.ledger.diff import describe_change, diff_records, launch_facts
from gpushift.ledger.reader import LedgerReader
from gpushift.ledger.readme import export_markdown
from gpushift.ledger.show import format_record
from gpushift.ledger.text import duration, for_terminal, local_time, one_line, table
from gpushift.values import Outcome, SwitchRecord

__all__ = [
    "degraded_note",
    "describe_change",
    "diff_records",
    "export_jsonl",
    "export_markdown",
    "format_list",
    "format_record",
    "iter_items",
    "json_list",
    "launch_facts",
    "list_items",
]

# --------------------------------------------------------------------------- the list


def list_items(rows: Iterable[SwitchRecord], pending_ids: set[int | None]) -> list[dict[str, Any]]:
    """``gpushift ledger --json``: each record's ``to_dict()``; ``pending_write`` marks the spooled."""
    return list(iter_items(rows, pending_ids))


def iter_items(rows: Iterable[SwitchRecord], pending_ids: set[int | None]) -> Iterator[dict[str, Any]]:
    """``list_items``, one record at a time."""
    for r in rows:
        d = r.to_dict()
        if r.id in pending_ids:
            d["pending_write"] = True
        yield d


def json_list(rows: Iterable[SwitchRecord], pending_ids: set[int | None]) -> Iterator[str]:
    """``gpushift ledger --json`` streamed: the text of ``json.dumps(list_items(...), indent=2,
    ensure_ascii=False, default=str)``, to the byte, one record's part at a time."""
    first = True
    for d in iter_items(rows, pending_ids):
        item = json.dumps(d, indent=2, ensure_ascii=False, default=str)
        yield ("[\n  " if first else ",\n  ") + item.replace("\n", "\n  ")
        first = False
    yield "[]" if first else "\n]"


def format_list(
    rows: list[SwitchRecord], pending_ids: set[int | None], paint: Callable[[str], str] | None = None
) -> str:
    """``gpushift ledger``: one line per switch, newest first; ``*`` marks a record still spooled.
    ``paint`` colours the outcome column (None: plain)."""
    cells = []
    for r in map(for_terminal, rows):
        rid = f"{r.id}*" if r.id in pending_ids else str(r.id)
        cells.append(
            [
                rid,
                local_time(r.started_at),
                f"{r.from_backend or '-'} → {r.to_backend}"
                if r.outcome != Outcome.CHAIN_BREAK.value
                else "(new chain)",
                r.outcome,
                duration(r),
                r.trigger,
                r.requested_by,
                one_line(r.backend_version, 24) or "-",
                one_line(r.reason, 60) or "-",
            ]
        )
    headers = ["ID", "STARTED", "SWITCH", "OUTCOME", "TOOK", "TRIGGER", "BY", "VERSION", "REASON"]
    out = table(headers, cells, {3: paint} if paint else None)
    if pending_ids & {r.id for r in rows}:
        out += "\n* not yet in the database (pending in the spool)"
    return out


def degraded_note(led: LedgerReader) -> str | None:
    """A line saying that records wait in the spool (None when none does)."""
    pending = len(led.pending_records())
    if not pending:
        return None
    return (
        f"ledger: degraded ({pending} pending in {led.spool_dir}; the daemon writes them when the "
        f"database accepts writes again)"
    )


# --------------------------------------------------------------------------- exports


def export_jsonl(led: LedgerReader) -> Iterator[str]:
    """Every record as one JSON line, oldest first; then the records pending in the spool."""
    for rec in led.iter_all():
        yield json.dumps(rec.to_dict(), ensure_ascii=False, default=str) + "\n"
    for rec in led.pending_records():
        d = rec.to_dict()
        d["pending_write"] = True
        yield json.dumps(d, ensure_ascii=False, default=str) + "\n"

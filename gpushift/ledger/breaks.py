"""A break in the chain: the database is not a database, or was deleted or replaced under the writer.

The writer never stops at one (docs/ledger.md, "When the database breaks"): it moves a bad file
aside (``ledger.db.corrupt-<UTC time>``, with its ``-wal``/``-shm``) and starts a new chain whose
first row records the break: ``extra["chain_break"]`` = ``{"reason", "moved_to", "old_head", "at",
"error", "path"}``, ``old_head`` being the old chain's last row (id and hash) as the head file named
it.  That row is an ordinary record (trigger ``recovery``, outcome ``chain_break``) queued first in
the spool, so it is the first row of the new database, also when the daemon restarts before it
lands.  ``verify`` reports such a row as a break recorded by the daemon.

Reasons: ``corrupt`` (SQLite says the file is not a database, or its image is malformed),
``deleted`` and ``replaced`` (the path no longer names the file the writer opened: ``st_dev`` and
``st_ino`` are compared before each write and at every periodic flush), ``missing`` (no database at
the writer's open, while the head file names rows).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from gpushift import __version__
from gpushift.ledger.files import fsync_dir
from gpushift.values import Outcome, SwitchRecord, Trigger

CORRUPT = "corrupt"
DELETED = "deleted"
REPLACED = "replaced"
MISSING = "missing"

#: What the first row of a new chain says happened, by reason.
_REASON_TEXT = {
    CORRUPT: "the ledger database was not a database (corrupt)",
    DELETED: "the ledger database was deleted while the daemon ran",
    REPLACED: "the ledger database was replaced by another file while the daemon ran",
    MISSING: "the ledger database was missing at the daemon's start, while the head file named rows",
}

# SQLITE_CORRUPT and SQLITE_NOTADB (primary result codes; extended codes keep them in the low byte).
_CORRUPT_CODES = (11, 26)
_CORRUPT_TEXT = ("file is not a database", "database disk image is malformed")

#: A file's identity: (st_dev, st_ino).
FileId = tuple[int, int]


def is_corrupt(e: BaseException) -> bool:
    """True when SQLite says the file is not a database or its image is malformed (retrying the same
    file never helps), False for every other error (full, locked, read-only: those pass)."""
    if not isinstance(e, sqlite3.DatabaseError):
        return False
    code = getattr(e, "sqlite_errorcode", None)  # Python 3.11+
    if isinstance(code, int):
        return code & 0xFF in _CORRUPT_CODES
    return any(t in str(e) for t in _CORRUPT_TEXT)


def file_id(path: str) -> FileId | None:
    """The identity of the file at ``path`` (None when there is none)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino)


class DbFile:
    """The database file the writer opened, so that a file deleted or replaced under it is noticed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.id: FileId | None = None

    def opened(self) -> None:
        """The writer has just opened the file at the path: remember which file it is."""
        self.id = file_id(self.path)

    def moved(self) -> str | None:
        """``deleted`` or ``replaced`` when the path no longer names the file last opened, else None.

        Raises:
            OSError: the path cannot be looked at (a directory lost its permissions).
        """
        if self.id is None:
            return None
        now = file_id(self.path)
        if now is None:
            return DELETED
        return REPLACED if now != self.id else None


def move_aside(db_path: str, kind: str, at: datetime, main: bool = True, own_wal: bool = True) -> str | None:
    """Rename the database to ``<db>.<kind>-<UTC time>`` and its ``-wal``/``-shm`` beside it.

    ``own_wal``: the ``-wal``/``-shm`` at the path belong to the file at the path (a corrupt one)
    and keep their pairing names.  Otherwise they are what is left of a file deleted or replaced
    under the writer (SQLite does not checkpoint a database that moved), renamed
    ``<...>.orphan-wal``/``.orphan-shm`` so that SQLite never replays them into another database.
    With ``main`` False only those are moved.  Returns the database's new name (None when ``main``
    is False).

    Raises:
        OSError: a rename failed (read-only directory, ...); the database stays where it was.
    """
    stamp = at.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    base = target = f"{db_path}.{kind}-{stamp}"
    names = ("", "-wal", "-shm", ".orphan-wal", ".orphan-shm")
    n = 1
    while any(os.path.lexists(target + s) for s in names):
        n += 1
        target = f"{base}.{n}"
    # The WAL first: a database moved without its WAL is no worse than it was, a WAL left behind
    # would be replayed into the next database at this path.
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.rename(db_path + suffix, target + (suffix if own_wal else ".orphan" + suffix))
    if main:
        os.rename(db_path, target)
    fsync_dir(os.path.dirname(os.path.abspath(db_path)))
    return target if main else None


def old_head(head_file: Mapping[str, Any] | None, known: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The old chain's end: what the head file names, else the last head this writer saw."""
    for source, h in (("head_file", head_file), ("writer", known)):
        if h and isinstance(h.get("id"), int) and h["id"] > 0 and isinstance(h.get("hash"), str):
            return {"id": h["id"], "hash": h["hash"], "source": source}
    return None


def break_info(
    reason: str,
    db_path: str,
    moved_to: str | None,
    old: dict[str, Any] | None,
    error: str | None,
    at: datetime,
) -> dict[str, Any]:
    """What ``extra["chain_break"]`` of the new chain's first row holds."""
    return {
        "reason": reason,
        "path": db_path,
        "moved_to": moved_to,
        "old_head": old,
        "at": at.isoformat(),
        "error": error,
    }


def describe(info: Mapping[str, Any]) -> str:
    """One line for a person: what broke, where the old file went, where the old chain ended."""
    parts = [_REASON_TEXT.get(str(info.get("reason")), f"the ledger database broke ({info.get('reason')})")]
    if info.get("error"):
        parts[0] += f" ({info['error']})"
    if info.get("moved_to"):
        parts.append(f"moved to {info['moved_to']}")
    old = info.get("old_head")
    if isinstance(old, Mapping):
        parts.append(f"the old chain ended at row {old.get('id')} hash {str(old.get('hash'))[:16]}")
    else:
        parts.append("the old chain's head is not known")
    return "; ".join(parts)


def break_record(info: Mapping[str, Any], ticket: str) -> dict[str, Any]:
    """The first record of a new chain (its ``to_dict()`` form): no switch, the break."""
    at = datetime.fromisoformat(str(info["at"]))
    rec = SwitchRecord(
        trigger=Trigger.RECOVERY.value,
        requested_by="gpushift",
        reason=f"{_REASON_TEXT.get(str(info.get('reason')), 'the ledger database broke')}: a new chain starts",
        from_backend=None,
        to_backend="",
        started_at=at,
        ticket=ticket,
        gpushift_version=__version__,
    )
    rec.outcome = Outcome.CHAIN_BREAK.value
    rec.finished_at = at
    rec.message = describe(info)
    rec.extra["chain_break"] = dict(info)
    return rec.to_dict()


def recorded_break(values: Mapping[str, Any]) -> dict[str, Any] | None:
    """``extra["chain_break"]`` of a row (its columns by name) that starts a new chain, else None."""
    if values.get("outcome") != Outcome.CHAIN_BREAK.value:
        return None
    try:
        extra = json.loads(str(values.get("record"))).get("extra") or {}
    except (ValueError, AttributeError):
        return None
    brk = extra.get("chain_break") if isinstance(extra, dict) else None
    return dict(brk) if isinstance(brk, dict) else None

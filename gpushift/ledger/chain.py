"""The hash chain that makes tampering with the ledger evident.

Each row stores ``prev_hash`` and ``hash`` = sha256 over a canonical serialisation of every other
column (including ``prev_hash``), so editing any column of any row breaks that row's hash.  The head
(last id + hash) is also kept outside the database in a head file (``ledger.head`` next to the
database, replaced atomically and fsynced) and in the log line of each write, so that recomputing the
whole chain after an edit is caught too: the head no longer matches.

The head file is read with the one careful reader (:func:`gpushift.host.safefile.read_bounded`):
a regular file of its own directory only, at most :data:`HEAD_MAX_BYTES` — a FIFO there must not
block the daemon, nor ``/dev/zero`` fill its memory.  A reader is told it is unreadable; the writer
(its first open, every write's check) moves such a file aside (``ledger.head.bad-<UTC time>``,
:func:`gpushift.config.textfile.set_aside`), logs ``ledger_head_set_aside`` and raises the tamper
alarm naming it — gpushift never writes one — which ``gpushift status`` shows and ``verify``
reports until a person clears it; then it writes the head anew.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpushift.config import validate
from gpushift.config.textfile import set_aside
from gpushift.host import safefile
from gpushift.ledger.breaks import describe, recorded_break
from gpushift.ledger.files import write_file_atomic
from gpushift.ledger.rows import now_iso

#: ``prev_hash`` of the first row.
GENESIS_HASH = "0" * 64

#: Largest head file read (what :meth:`HeadFile.write` writes is a few hundred bytes).
HEAD_MAX_BYTES = 1024 * 1024

#: The head of a chain without rows.
EMPTY_HEAD: dict[str, Any] = {"id": 0, "hash": GENESIS_HASH}

#: Versions the hash input; a later migration that changes the columns re-links with a new tag.
HASH_TAG = "gpushift-ledger-row-v2"

# Every column but ``hash``, in the order they enter the hash.  Changing this list needs a
# migration that re-links the chain under a new HASH_TAG.
CHAIN_COLUMNS: tuple[str, ...] = (
    "id",
    "uuid",
    "ticket",
    "started_at",
    "finished_at",
    "trigger",
    "requested_by",
    "uid",
    "reason",
    "from_backend",
    "to_backend",
    "outcome",
    "failed_phase",
    "message",
    "unit",
    "backend_version",
    "gpushift_version",
    "record",
    "prev_hash",
)

#: Every column of a chained row, ``hash`` last.
ROW_COLUMNS: tuple[str, ...] = CHAIN_COLUMNS + ("hash",)


def _canon_value(v: Any) -> Any:
    # A column edited with the sqlite3 tool may hold a BLOB; verify must name the row, not crash.
    if isinstance(v, (bytes, bytearray, memoryview)):
        return "blob:" + bytes(v).hex()
    return v


def row_hash(values: Mapping[str, Any]) -> str:
    """sha256 of a row's canonical serialisation: every chained column, in a fixed order, as JSON.

    JSON keeps SQLite's types apart (``1000`` vs ``"1000"`` vs ``1000.0``), so changing a value's
    type is an edit too.
    """
    import hashlib  # here, not at the top: `gpushift ledger` (reads only) starts faster without it

    payload = [HASH_TAG] + [_canon_value(values.get(c)) for c in CHAIN_COLUMNS]
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def select_chain_row(conn: sqlite3.Connection, row_id: int) -> dict[str, Any]:
    """Every column of row ``row_id`` by name (empty when there is no such row)."""
    cur = conn.execute(f"SELECT {', '.join(ROW_COLUMNS)} FROM switches WHERE id = ?", (row_id,))
    row = cur.fetchone()
    return dict(zip(ROW_COLUMNS, row, strict=True)) if row else {}


def _rows_from(conn: sqlite3.Connection, row_id: int) -> list[dict[str, Any]]:
    """Row ``row_id`` and every row after it, by name, oldest first."""
    sql = f"SELECT {', '.join(ROW_COLUMNS)} FROM switches WHERE id >= ? ORDER BY id"
    return [dict(zip(ROW_COLUMNS, r, strict=True)) for r in conn.execute(sql, (row_id,))]


def db_head(conn: sqlite3.Connection) -> dict[str, Any]:
    """The database's end of the chain: ``{"id", "hash"}`` of its last row (id 0 when empty)."""
    last = conn.execute("SELECT id, hash FROM switches ORDER BY id DESC LIMIT 1").fetchone()
    return {"id": last[0], "hash": last[1]} if last else {"id": 0, "hash": GENESIS_HASH}


def segment_intact(rows: Sequence[Mapping[str, Any]]) -> bool:
    """True when every row of ``rows`` matches its hash and links to the one before it."""
    prev: str | None = None
    for r in rows:
        if prev is not None and r["prev_hash"] != prev:
            return False
        if row_hash(r) != r["hash"]:
            return False
        prev = r["hash"]
    return True


def insert_row(conn: sqlite3.Connection, values: dict[str, Any]) -> dict[str, Any]:
    """Append a row (``values``: every chained column, ``prev_hash`` the head's hash); return the new head."""
    values["hash"] = row_hash(values)
    conn.execute(
        f"INSERT INTO switches ({', '.join(ROW_COLUMNS)}) VALUES ({', '.join('?' * len(ROW_COLUMNS))})",
        [values[c] for c in ROW_COLUMNS],
    )
    return {"id": values["id"], "hash": values["hash"]}


def rewrite_row(conn: sqlite3.Connection, values: dict[str, Any], head: HeadFile) -> dict[str, Any]:
    """Rewrite row ``values["id"]`` in place; re-link the rows after it when it is not the newest.

    The rows after it are re-linked only when that part of the chain verifies; otherwise the tamper
    alarm is raised and they are left alone, so that a rewrite never blesses an edit made behind
    gpushift's back.  Returns the new head.
    """
    row_id = values["id"]
    rows = _rows_from(conn, row_id)
    intact = segment_intact(rows)
    if not intact:
        head.raise_alarm(
            f"rows from {row_id} on did not verify when gpushift rewrote row {row_id} (edited outside "
            f"gpushift)"
        )
    values["prev_hash"] = rows[0]["prev_hash"]
    values["hash"] = row_hash(values)
    sets = ", ".join(f"{c} = ?" for c in ROW_COLUMNS[1:])
    conn.execute(f"UPDATE switches SET {sets} WHERE id = ?", [values[c] for c in ROW_COLUMNS[1:]] + [row_id])
    if len(rows) == 1:
        return {"id": row_id, "hash": values["hash"]}
    if not intact:
        # Leave the successors alone: re-linking them would hide the edit verify must report.
        return {"id": rows[-1]["id"], "hash": rows[-1]["hash"]}
    head.emit("info", "ledger_relinked", rewritten=row_id, rows_after=len(rows) - 1)
    prev = values["hash"]
    for r in rows[1:]:
        r["prev_hash"] = prev
        prev = row_hash(r)
        conn.execute(
            "UPDATE switches SET prev_hash = ?, hash = ? WHERE id = ?", (r["prev_hash"], prev, r["id"])
        )
    return {"id": rows[-1]["id"], "hash": prev}


def same_head(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    if not a or not b:
        return False
    return a.get("id") == b.get("id") and a.get("hash") == b.get("hash")


# --------------------------------------------------------------------------- the head file


class HeadFile:
    """The head of the chain kept outside the database, and the tamper alarm.

    Args:
        path: the file (``ledger.head`` next to the database by default).
        group: the group given to the file when it is written.
        emit: where log lines go (``emit(level, event, **fields)``).
    """

    def __init__(self, path: str, group: str | None, emit: Callable[..., None]) -> None:
        self.path = path
        self.group = group
        self.emit = emit
        #: ``{"at", "what"}`` once the file disagreed with the database; written into every later
        #: head, it stands until a person removes it from the file.
        self.alarm: dict[str, Any] | None = None

    def read(self) -> dict[str, Any] | None:
        """The file's content; None when it does not exist, an ``error`` entry when unreadable."""
        return self._read()[0]

    def _read(self) -> tuple[dict[str, Any] | None, safefile.Skipped | None]:
        """:meth:`read`'s answer, and why the careful reader skipped the file (None: it did not)."""
        try:
            raw = safefile.read_bounded(self.path, HEAD_MAX_BYTES, within=os.path.dirname(self.path) or ".")
            text = raw.decode("utf-8")
            too_deep = validate.nesting_problem(text)
            if too_deep is not None:
                raise ValueError(too_deep)
            data = json.loads(text)
        except FileNotFoundError:
            return None, None
        except safefile.Skipped as e:
            return {"id": None, "hash": None, "error": f"unreadable: {e}"}, e
        except (OSError, ValueError) as e:
            return {"id": None, "hash": None, "error": f"unreadable: {e}"}, None
        if not isinstance(data, dict):
            return {"id": None, "hash": None, "error": "not an object"}, None
        return data, None

    def _read_writing(self) -> tuple[dict[str, Any] | None, bool]:
        """The writer's :meth:`read`: a file the careful reader skipped is moved aside and raises
        the alarm (then it reads as missing).  Returns the content and whether one was moved."""
        hf, skipped = self._read()
        if skipped is None:
            return hf, False
        moved = set_aside(self.path)
        self.emit("error", "ledger_head_set_aside", path=self.path, error=str(skipped), moved_to=moved)
        where = f"moved to {moved}" if moved else "it could not be moved aside"
        self.raise_alarm(f"the head file {self.path} could not be read safely ({skipped}); {where}")
        return None, True

    def write(self, head: Mapping[str, Any], prev: Mapping[str, Any] | None) -> None:
        """Name ``head``; ``prev`` is the head before a write that is not yet committed.

        A write names its new head with ``prev`` before its COMMIT, and names it alone after (see
        ``settle``): so ``prev`` is only ever accepted for a write cut off between the two.
        """
        data: dict[str, Any] = {"id": head["id"], "hash": head["hash"], "written_at": now_iso()}
        if prev is not None and not same_head(head, prev):
            data["prev"] = {"id": prev["id"], "hash": prev["hash"]}
        if self.alarm is not None:
            data["alarm"] = self.alarm
        write_file_atomic(self.path, (json.dumps(data, indent=1) + "\n").encode(), self.group)

    def settle(self, head: Mapping[str, Any]) -> None:
        """After a COMMIT: name ``head`` alone, so that removing that row is caught.  Never raises
        (the row is written; until this succeeds the file names it with ``prev``, which verify
        accepts as a write cut off before its end)."""
        try:
            self.write(head, None)
        except OSError as e:
            self.emit("warning", "ledger_head_not_settled", path=self.path, error=str(e), head_id=head["id"])

    def restart(self) -> None:
        """A new chain starts (``breaks.py``): name the empty chain, keeping a standing alarm."""
        hf = self.read()
        if self.alarm is None and hf is not None and isinstance(hf.get("alarm"), dict):
            self.alarm = hf["alarm"]
        self.write(EMPTY_HEAD, None)

    def names_lost_rows(self, head: Mapping[str, Any]) -> bool:
        """True when the file names rows that a database ending at ``head`` does not have (and not
        as a write cut off before its COMMIT)."""
        hf = self.read()
        if hf is None or not isinstance(hf.get("id"), int) or isinstance(hf.get("id"), bool):
            return False
        return bool(hf["id"] > head["id"] and not same_head(head, hf.get("prev")))

    def raise_alarm(self, what: str) -> None:
        if self.alarm is None:
            self.alarm = {"at": now_iso(), "what": what}
        self.emit("error", "ledger_tamper_alarm", what=what)

    def check(self, head: Mapping[str, Any]) -> None:
        """Raise the alarm unless the file names the database's ``head`` (or the one just before it)."""
        hf, moved = self._read_writing()
        if moved or (hf is not None and (same_head(head, hf) or same_head(head, hf.get("prev")))):
            return  # moved: the alarm is raised, naming the file
        if hf is None:
            if head["id"] == 0:
                return
            what = f"the head file {self.path} was missing while the database has rows up to {head['id']}"
        else:
            what = (
                f"the head file named row {hf.get('id')} hash {str(hf.get('hash'))[:16]} but the database "
                f"ended at row {head['id']} hash {head['hash'][:16]}"
            )
        self.raise_alarm(what)

    def check_at_open(self, head: Mapping[str, Any], migrated: bool) -> None:
        """At the writer's first open: write a missing head for a new/migrated database, complete
        an interrupted head update, or raise the alarm when the file disagrees (or is no regular
        file of its directory: then it is moved aside, and the head written anew)."""
        hf, moved = self._read_writing()
        if moved:
            self.write(head, None)
            return
        if hf is not None and isinstance(hf.get("alarm"), dict):
            self.alarm = hf["alarm"]  # an alarm stands until a person removes it
        if hf is None and (migrated or head["id"] == 0):
            # A new database, or one just migrated from version 1 (a chain, but never a head file).
            self.write(head, None)
            return
        self.check(head)
        if hf is not None and hf.get("prev") is not None and same_head(head, hf.get("prev")):
            # The last write was cut off between writing the head and its COMMIT: settle it.
            self.write(head, None)
        elif hf is not None and hf.get("prev") is not None and same_head(head, hf):
            # ... or between its COMMIT and naming the head alone.
            self.write(head, None)


# --------------------------------------------------------------------------- verify


@dataclass(frozen=True)
class VerifyResult:
    """What ``verify()`` found.  ``first_bad_id`` names the first row that fails, when one does."""

    ok: bool
    rows: int
    first_bad_id: int | None = None
    problem: str | None = None
    head: dict[str, Any] = field(default_factory=dict)  # the database's last row: id, hash
    head_file: dict[str, Any] | None = None
    #: Breaks the daemon recorded (``extra["chain_break"]`` of the rows that start a new chain, with
    #: ``row``); any of them makes the result not ok.
    breaks: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> str:
        """One line for a person."""
        h = self.head
        if self.ok:
            return f"ledger ok: {self.rows} rows, head row {h.get('id')} hash {str(h.get('hash'))[:16]}"
        recorded = "; ".join(
            f"chain break recorded by the daemon at row {b['row']}: {describe(b)}" for b in self.breaks
        )
        if self.problem is None:
            return (
                f"ledger verify FAILED: {recorded}; from there the chain verifies ({self.rows} rows, "
                f"head row {h.get('id')} hash {str(h.get('hash'))[:16]})"
            )
        return f"ledger verify FAILED: {self.problem}" + (f" (earlier, {recorded})" if recorded else "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "rows": self.rows,
            "first_bad_id": self.first_bad_id,
            "problem": self.problem,
            "head": self.head,
            "head_file": self.head_file,
            "breaks": self.breaks,
        }


#: How verify names a break that no row of the chain records.
NOT_RECORDED = "chain break not recorded by the daemon"


def verify_rows(conn: sqlite3.Connection, head_file: dict[str, Any] | None, head_path: str) -> VerifyResult:
    """Check every row's hash and link, oldest first, then the head file against the last row.

    A row that starts a new chain (``breaks.py``) is a break the daemon recorded: the result is
    not ok, and says so apart from a break nothing recorded.
    """
    prev_hash = GENESIS_HASH
    prev_id: int | None = None
    count = 0
    breaks: list[dict[str, Any]] = []
    for row in conn.execute(f"SELECT {', '.join(ROW_COLUMNS)} FROM switches ORDER BY id"):
        values = dict(zip(ROW_COLUMNS, row, strict=True))
        count += 1
        rid = values["id"]
        if values["prev_hash"] != prev_hash:
            after = f"row {prev_id}" if prev_id is not None else "the start of the chain"
            problem = (
                f"{NOT_RECORDED}: row {rid} does not link to {after} (a row before it was rewritten, "
                f"or rows between them were removed)"
            )
            return VerifyResult(False, count, rid, problem, {}, head_file, breaks)
        if row_hash(values) != values["hash"]:
            problem = f"{NOT_RECORDED}: hash mismatch at row {rid} (its content was edited outside gpushift)"
            return VerifyResult(False, count, rid, problem, {}, head_file, breaks)
        brk = recorded_break(values)
        if brk is not None:
            breaks.append({"row": rid, **brk})
        prev_hash, prev_id = values["hash"], rid
    head = {"id": prev_id or 0, "hash": prev_hash}
    head_problem = _head_problem(head, head_file, count, head_path)
    return VerifyResult(not head_problem and not breaks, count, None, head_problem, head, head_file, breaks)


def _head_problem(
    head: dict[str, Any], head_file: dict[str, Any] | None, rows: int, head_path: str
) -> str | None:
    if head_file is None:
        if rows == 0:
            return None
        return f"the head file {head_path} is missing (the chain cannot be checked against it)"
    if head_file.get("alarm"):
        a = head_file["alarm"]
        return f"the head file records an alarm from {a.get('at')}: {a.get('what')}"
    if same_head(head, head_file) or same_head(head, head_file.get("prev")):
        # "prev": the write that named this head was cut off before its commit finished.
        return None
    named = f"the head file names row {head_file.get('id')} hash {str(head_file.get('hash'))[:16]}"
    ends = f"the database ends at row {head['id']} hash {head['hash'][:16]}"
    hid = head_file.get("id")
    if isinstance(hid, int) and hid > head["id"]:
        return f"{NOT_RECORDED}: rows missing after row {head['id']} ({named}, {ends})"
    return f"{NOT_RECORDED}: {named} but {ends} (the database was changed or its chain recomputed outside gpushift)"

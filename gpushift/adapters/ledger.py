"""L4: the deployment ledger in SQLite (the ``Ledger`` port).

One row per switch attempt: written as the intent row before anything is stopped (``begin``) and
rewritten when the switch ends (``finish``) or when a new daemon finds it unfinished
(``mark_interrupted``).  Queryable columns sit beside the full record as JSON (``record``), which is
what users see (``SwitchRecord.to_dict()``).

Three promises, each with its mechanism:

* **Readers never block the writer.**  WAL journal; ``gpushift ledger`` opens the file read-only.
* **No row is lost quietly.**  When the database cannot be written (disk full, read-only, locked
  past ``lock_timeout_s``) ``begin``/``finish`` do not raise: the full record goes to the log as one
  structured line (``ledger_pending``) and to a spool file under ``spool_dir`` (the runtime
  directory, another filesystem), fsynced.  Every later write first replays the spool; a new
  ``SqliteLedger`` on the same paths (the daemon restarted after a crash) replays it too.  A spooled
  record carries a key (``uuid`` column, unique) so a replay that is interrupted after the commit
  but before the spool file is removed updates the same row instead of adding a second one.
  ``begin`` while degraded returns a *provisional* id: a negative number, unique within the spool;
  ``finish`` of that record lands in the same row (matched by key), and ``finish`` sets
  ``record.id`` to the real row id once the row is in the database.
* **Tampering is evident.**  Each row stores ``prev_hash`` and ``hash`` = sha256 over a canonical
  serialisation of every other column (including ``prev_hash``), so editing any column of any row
  breaks that row's hash.  The head (last id + hash) is also kept outside the database in a head
  file (default ``ledger.head`` next to the database) and in the log line of each write, so that
  recomputing the whole chain after an edit is caught too (the head no longer matches).  A row is
  rewritten at finish; with one writer it is then the newest row and only its own hash changes.
  When it is not the newest (a spooled record replayed late, ``mark_interrupted`` of an old row),
  the rows after it are re-linked, but only after checking that that part of the chain is intact,
  so a rewrite never blesses an edit made behind gpushift's back.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..errors import LedgerError
from ..model import OFF, Outcome, SwitchRecord

#: The schema this code writes.  Older files migrate forward at the writer's open.
SCHEMA_VERSION = 2

#: ``prev_hash`` of the first row.
GENESIS_HASH = "0" * 64

#: Versions the hash input; a later migration that changes the columns re-links with a new tag.
HASH_TAG = "gpushift-ledger-row-v2"

#: Subdirectory of ``spool_dir`` holding one JSON file per pending record.
SPOOL_SUBDIR = "ledger-pending"

#: The database, its WAL files, the head file and the spool files: owner rw, group r.
FILE_MODE = 0o640
DIR_MODE = 0o750

DEFAULT_GROUP = "gpushift"
DEFAULT_LOCK_TIMEOUT_S = 5.0

#: What "the database cannot be written" looks like at this edge.  Everything else is a bug.
_WRITE_ERRORS: tuple[type[BaseException], ...] = (sqlite3.Error, OSError, LedgerError)

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

# --------------------------------------------------------------------------- schema and migrations

_V1_STATEMENTS = (
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    "INSERT INTO schema_version (version) VALUES (0)",
    """CREATE TABLE switches (
        id INTEGER PRIMARY KEY,
        ticket TEXT NOT NULL DEFAULT '',
        started_at TEXT NOT NULL,
        finished_at TEXT,
        trigger TEXT NOT NULL,
        requested_by TEXT NOT NULL,
        uid INTEGER,
        reason TEXT NOT NULL,
        from_backend TEXT,
        to_backend TEXT NOT NULL,
        outcome TEXT NOT NULL,
        failed_phase TEXT,
        message TEXT,
        unit TEXT,
        backend_version TEXT,
        record TEXT NOT NULL
    )""",
    "CREATE INDEX switches_to ON switches (to_backend, id)",
    "CREATE INDEX switches_outcome ON switches (outcome, id)",
)


def _migrate_to_1(conn: sqlite3.Connection) -> None:
    """Version 1: the core row (issue "safe switch"): queryable columns plus the record JSON."""
    for stmt in _V1_STATEMENTS:
        conn.execute(stmt)


def _migrate_to_2(conn: sqlite3.Connection) -> None:
    """Version 2: idempotency key, gpushift version column, and the hash chain over old rows."""
    for stmt in (
        "ALTER TABLE switches ADD COLUMN uuid TEXT",
        "ALTER TABLE switches ADD COLUMN gpushift_version TEXT",
        "ALTER TABLE switches ADD COLUMN prev_hash TEXT",
        "ALTER TABLE switches ADD COLUMN hash TEXT",
    ):
        conn.execute(stmt)
    prev = GENESIS_HASH
    rows = conn.execute("SELECT id, record FROM switches ORDER BY id").fetchall()
    for row_id, record_text in rows:
        try:
            version = json.loads(record_text).get("gpushift_version")
        except (ValueError, AttributeError):
            version = None
        conn.execute(
            "UPDATE switches SET uuid = ?, gpushift_version = ? WHERE id = ?",
            (_new_key(), version, row_id),
        )
        values = _select_chain_row(conn, row_id)
        values["prev_hash"] = prev
        prev = row_hash(values)
        conn.execute(
            "UPDATE switches SET prev_hash = ?, hash = ? WHERE id = ?", (values["prev_hash"], prev, row_id)
        )
    conn.execute("CREATE UNIQUE INDEX switches_uuid ON switches (uuid)")
    conn.execute("CREATE INDEX switches_from ON switches (from_backend, id)")


#: ``MIGRATIONS[n]`` brings a database from version n-1 to n.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _migrate_to_1, 2: _migrate_to_2}


def schema_version(conn: sqlite3.Connection) -> int:
    """The schema version of an open database (0 for an empty file)."""
    has_table = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    if not has_table:
        return 0
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    return int(row[0]) if row else 0


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Bring the database forward to ``target`` in one transaction; return the version it had.

    Raises:
        LedgerError: the file was written by a newer gpushift (never downgraded).
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        old = schema_version(conn)
        if old > SCHEMA_VERSION:
            raise LedgerError(
                f"ledger schema version {old} is newer than this gpushift understands ({SCHEMA_VERSION})"
            )
        for n in range(old + 1, target + 1):
            MIGRATIONS[n](conn)
            conn.execute("UPDATE schema_version SET version = ?", (n,))
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise
    return old


# --------------------------------------------------------------------------- hashing and rows


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


def _select_chain_row(conn: sqlite3.Connection, row_id: int) -> dict[str, Any]:
    cols = ", ".join(CHAIN_COLUMNS + ("hash",))
    cur = conn.execute(f"SELECT {cols} FROM switches WHERE id = ?", (row_id,))
    row = cur.fetchone()
    return dict(zip(CHAIN_COLUMNS + ("hash",), row, strict=True)) if row else {}


def _utc_text(value: Any) -> str | None:
    """A timestamp as sortable UTC text (``2025-01-31T07:00:00.000000Z``); naive means UTC."""
    if value is None:
        return None
    dt = value if isinstance(value, datetime) else _parse_dt(str(value))
    if dt is None:
        return _text(value)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_dt(text: str | None) -> datetime | None:
    if not text:
        return None
    t = text.strip()
    if t.endswith("Z"):  # fromisoformat on 3.10 does not take "Z"
        t = t[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(t)
    except ValueError:
        return None


def _record_json(d: Mapping[str, Any]) -> str:
    # default=str: a stray value in ``extra`` must not cost the row.  Keys keep their order (the
    # phases in ``durations_s`` are in the order they ran); the hash is over the stored text.
    text = json.dumps(d, ensure_ascii=False, separators=(",", ":"), default=str)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (an argv decoded with surrogateescape) is not UTF-8 and SQLite would
        # refuse the row: escaped, JSON keeps it exactly.
        text = json.dumps(d, ensure_ascii=True, separators=(",", ":"), default=str)
    return text


def _text(v: Any) -> str | None:
    """A column value as valid UTF-8 text (None stays None)."""
    if v is None:
        return None
    return str(v).encode("utf-8", "replace").decode("utf-8")


def _row_values(d: Mapping[str, Any], row_id: int, key: str, prev_hash: str) -> dict[str, Any]:
    rec = dict(d)
    rec["id"] = row_id
    uid = rec.get("uid")
    if not isinstance(uid, int) or isinstance(uid, bool) or not -(2**63) <= uid < 2**63:
        uid = None
    return {
        "id": row_id,
        "uuid": key,
        "ticket": _text(rec.get("ticket") or ""),
        "started_at": _utc_text(rec.get("started_at")) or "",
        "finished_at": _utc_text(rec.get("finished_at")),
        "trigger": _text(rec.get("trigger") or ""),
        "requested_by": _text(rec.get("requested_by") or ""),
        "uid": uid,
        "reason": _text(rec.get("reason") or ""),
        "from_backend": _text(rec.get("from")),
        "to_backend": _text(rec.get("to") or ""),
        "outcome": _text(rec.get("outcome") or Outcome.PENDING.value),
        "failed_phase": _text(rec.get("failed_phase")),
        "message": _text(rec.get("message")),
        "unit": _text(rec.get("unit")),
        "backend_version": _text(rec.get("backend_version")),
        "gpushift_version": _text(rec.get("gpushift_version")),
        "record": _record_json(rec),
        "prev_hash": prev_hash,
    }


def record_from_dict(d: Mapping[str, Any], row_id: int | None = None) -> SwitchRecord:
    """Rebuild a :class:`SwitchRecord` from its ``to_dict()`` form (the ``record`` column)."""

    def strs(v: Any) -> list[str]:
        return [str(x) for x in v] if isinstance(v, (list, tuple)) else []

    def dct(v: Any) -> dict[str, Any]:
        return dict(v) if isinstance(v, dict) else {}

    uid = d.get("uid")
    return SwitchRecord(
        trigger=str(d.get("trigger") or ""),
        requested_by=str(d.get("requested_by") or ""),
        reason=str(d.get("reason") or ""),
        from_backend=d.get("from"),
        to_backend=str(d.get("to") or ""),
        started_at=_parse_dt(d.get("started_at")) or datetime.fromtimestamp(0, timezone.utc),
        ticket=str(d.get("ticket") or ""),
        uid=uid if isinstance(uid, int) else None,
        id=row_id if row_id is not None else d.get("id"),
        finished_at=_parse_dt(d.get("finished_at")),
        outcome=str(d.get("outcome") or Outcome.PENDING.value),
        failed_phase=d.get("failed_phase"),
        message=d.get("message"),
        unit=d.get("unit"),
        unit_path=d.get("unit_path"),
        unit_sha256=d.get("unit_sha256"),
        argv_configured=strs(d.get("argv_configured")),
        argv_running=strs(d.get("argv_running")),
        systemd_result=d.get("systemd_result"),
        backend_version=d.get("backend_version"),
        version_source=d.get("version_source"),
        gpushift_version=str(d.get("gpushift_version") or ""),
        gpu_facts=dct(d.get("gpu_facts")),
        vram=dct(d.get("vram")),
        durations_s=dct(d.get("durations_s")),
        extra=dct(d.get("extra")),
    )


def _rollback(conn: sqlite3.Connection) -> None:
    # After SQLITE_FULL SQLite has already rolled back; an explicit ROLLBACK would then fail.
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


# --------------------------------------------------------------------------- files


def _apply_group(fd_or_path: int | str, group: str | None) -> None:
    """Give the file to ``group`` when that group exists (no group on a dev box: leave it)."""
    if not group:
        return
    try:
        import grp

        gid = grp.getgrnam(group).gr_gid
    except (KeyError, ImportError):
        return
    with contextlib.suppress(OSError):  # not a member and not root: the mode still protects it
        if isinstance(fd_or_path, int):
            os.fchown(fd_or_path, -1, gid)
        else:
            os.chown(fd_or_path, -1, gid)


def _create_private_file(path: str, group: str | None) -> None:
    """Create ``path`` empty with mode 0640 (whatever the umask) unless it exists."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have taken bits away
        _apply_group(fd, group)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_file_atomic(path: str, data: bytes, group: str | None) -> None:
    """tmp + fsync + rename + fsync(dir): after a crash the file is the old or the new one."""
    d = os.path.dirname(path) or "."
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        _apply_group(fd, group)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(d)


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class VerifyResult:
    """What ``verify()`` found.  ``first_bad_id`` names the first row that fails, when one does."""

    ok: bool
    rows: int
    first_bad_id: int | None = None
    problem: str | None = None
    head: dict[str, Any] = field(default_factory=dict)  # the database's last row: id, hash
    head_file: dict[str, Any] | None = None

    def describe(self) -> str:
        """One line for a person."""
        if self.ok:
            h = self.head
            return f"ledger ok: {self.rows} rows, head row {h.get('id')} hash {str(h.get('hash'))[:16]}"
        return f"ledger verify FAILED: {self.problem}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "rows": self.rows,
            "first_bad_id": self.first_bad_id,
            "problem": self.problem,
            "head": self.head,
            "head_file": self.head_file,
        }


# --------------------------------------------------------------------------- the adapter


class SqliteLedger:
    """The ledger on one SQLite file, with a pending spool and a head file beside it.

    Args:
        db_path: the database file (``<state_dir>/ledger.db``); created 0640 (group ``group`` when
            that group exists) with its parent directory.
        spool_dir: the runtime directory (``/run/gpushift``); pending records go to
            ``spool_dir/ledger-pending/``.  ``None`` keeps pending records in memory only.
        head_path: the head file; default ``ledger.head`` next to the database.
        log: where the one structured line per write goes: a structlog-like logger (``.info``,
            ``.warning``, ``.error`` taking ``event, **fields``), a stdlib ``logging.Logger``, or a
            callable ``log(event, **fields)``.  ``None``: structlog's ``gpushift.ledger`` logger.
        lock_timeout_s: how long a write waits for a lock held by another connection before the
            record goes to the spool.
        group: the group given to the files it creates.
        readonly: open for reading only (``gpushift ledger``): nothing is created, migrated or
            replayed; pending spool files are shown, not written.
        connect_hook: called with every new writer connection (tests use it for
            ``PRAGMA max_page_count`` to simulate a full disk).  After a failed write the
            connection is dropped, so the next attempt runs the hook again.
    """

    def __init__(
        self,
        db_path: str | os.PathLike[str],
        spool_dir: str | os.PathLike[str] | None = None,
        head_path: str | os.PathLike[str] | None = None,
        log: Any = None,
        *,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
        group: str | None = DEFAULT_GROUP,
        readonly: bool = False,
        connect_hook: Callable[[sqlite3.Connection], None] | None = None,
    ) -> None:
        self.db_path = os.fspath(db_path)
        self.head_path = (
            os.fspath(head_path)
            if head_path is not None
            else os.path.join(os.path.dirname(os.path.abspath(self.db_path)), "ledger.head")
        )
        self.spool_dir = os.path.join(os.fspath(spool_dir), SPOOL_SUBDIR) if spool_dir is not None else None
        self.readonly = readonly
        self.lock_timeout_s = lock_timeout_s
        self.group = group
        self._log = log
        self._connect_hook = connect_hook
        self._wlock = threading.RLock()  # one write at a time, in this process
        self._rlock = threading.Lock()
        # Guards _pending against readers on other threads (status): they must never wait for
        # _wlock, which a write holds while SQLite waits up to lock_timeout_s.
        self._plock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._rconn: sqlite3.Connection | None = None
        self._pending: dict[str, dict[str, Any]] = {}  # key -> spool entry, replayed by seq
        self._keys: dict[int, str] = {}  # row id or provisional id -> key, for finish()
        self._landed: dict[int, int] = {}  # provisional id -> real id, once replayed
        self._next_provisional = -1
        self._replayed_total = 0
        self._error: str | None = None
        self._alarm: str | None = None
        self._alarm_record: dict[str, Any] | None = None
        self._head_checked = False
        self._load_spool()
        if not readonly:
            # A restarted daemon lands what its predecessor could not write.
            self.flush_pending()

    @classmethod
    def open_readonly(
        cls,
        db_path: str | os.PathLike[str],
        spool_dir: str | os.PathLike[str] | None = None,
        head_path: str | os.PathLike[str] | None = None,
    ) -> SqliteLedger:
        """A reader (the CLI): never creates, migrates, replays or writes anything."""
        return cls(db_path, spool_dir, head_path, readonly=True)

    def close(self) -> None:
        """Close both connections (a later call reopens them)."""
        with self._wlock:
            self._drop_writer()
        with self._rlock:
            if self._rconn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._rconn.close()
                self._rconn = None

    def __enter__(self) -> SqliteLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- the port: writes

    def begin(self, record: SwitchRecord) -> int:
        """Write the intent row and return its id (negative: provisional, the record is pending).

        Never raises for an unwritable database: the record is logged and spooled instead.
        """
        key = _new_key()
        with self._wlock:
            try:
                row_id = self._write_with_replay(key, record.to_dict(), row_id=None, op="begin")
            except Exception as e:  # noqa: BLE001 - the switcher's record is never lost to an exception
                pid = self._new_provisional_id()
                record.id = pid
                self._keys[pid] = key
                self._queue(key, record.to_dict(), row_id=None, provisional_id=pid, op="begin", error=e)
                return pid
            record.id = row_id
            self._keys[row_id] = key
            return row_id

    def finish(self, record: SwitchRecord) -> None:
        """Complete the row of ``record`` (matched by the key ``begin`` gave it).

        Never raises for an unwritable database; sets ``record.id`` to the real row id once the
        row is in the database.
        """
        with self._wlock:
            rid = record.id
            key = self._keys.get(rid) if rid is not None else None
            row_id = rid if rid is not None and rid > 0 else None
            if key is None:
                key = self._key_of_row(row_id) if row_id is not None else None
                key = key or _new_key()
            if rid is not None and rid < 0 and rid in self._landed:
                row_id = self._landed[rid]
            try:
                new_id = self._write_with_replay(key, record.to_dict(), row_id=row_id, op="finish")
            except Exception as e:  # noqa: BLE001 - the switcher's record is never lost to an exception
                prev = self._pending.get(key, {})
                self._queue(
                    key,
                    record.to_dict(),
                    row_id=row_id or prev.get("row_id"),
                    provisional_id=rid if rid is not None and rid < 0 else prev.get("provisional_id"),
                    op="finish",
                    error=e,
                )
                return
            if rid is not None and rid < 0:
                self._landed[rid] = new_id
            record.id = new_id
            self._keys[new_id] = key

    def mark_interrupted(self, now: datetime) -> builtins.list[int]:
        """Mark every unfinished row (and pending spooled record) ``interrupted``; return their ids.

        Ids are real row ids where the row is in the database, provisional ids where it still waits
        in the spool.
        """
        message = "the daemon stopped before this switch finished (found unfinished at the next start)"

        def interrupt(d: dict[str, Any]) -> dict[str, Any]:
            d = dict(d)
            d["outcome"] = Outcome.INTERRUPTED.value
            d["finished_at"] = now.isoformat()
            d["message"] = f"{d['message']}; {message}" if d.get("message") else message
            return d

        ids: builtins.list[int] = []
        with self._wlock:
            # Pending spool entries first: they are older than anything a new write would add.
            spooled: builtins.list[tuple[str, int | None, int | None]] = []
            for key, entry in builtins.list(self._pending.items()):
                if entry["record"].get("outcome") == Outcome.PENDING.value:
                    self._queue(
                        key,
                        interrupt(entry["record"]),
                        row_id=entry.get("row_id"),
                        provisional_id=entry.get("provisional_id"),
                        op="interrupted",
                        error=None,
                    )
                    spooled.append((key, entry.get("row_id"), entry.get("provisional_id")))
            try:
                self._replay()
                conn = self._writer()
                rows = conn.execute(
                    "SELECT id, uuid, record FROM switches WHERE outcome = ? ORDER BY id",
                    (Outcome.PENDING.value,),
                ).fetchall()
                for row_id, key, text in rows:
                    d = interrupt(json.loads(text))
                    try:
                        ids.append(self._write(key, d, row_id=row_id, op="interrupted"))
                    except _WRITE_ERRORS as e:
                        self._queue(key, d, row_id=row_id, provisional_id=None, op="interrupted", error=e)
                        ids.append(row_id)
            except Exception as e:  # noqa: BLE001 - a daemon must start even on a damaged ledger
                self._note_error(e)
                self._emit("error", "ledger_interrupt_failed", error=self._error)
                ids += self._interrupt_unwritable(interrupt)
            for key, row_id, pid in spooled:
                if key in self._pending:
                    ids.append(row_id or pid or 0)
                elif pid is not None:
                    ids.append(self._landed.get(pid, pid))
                elif row_id is not None:
                    ids.append(row_id)
        return sorted(set(ids))

    def _interrupt_unwritable(
        self, interrupt: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> builtins.list[int]:
        """The database can be read but not written: queue the interrupted rows for later."""
        try:
            with self._reader() as conn:
                rows = (
                    conn.execute(
                        "SELECT id, uuid, record FROM switches WHERE outcome = ? ORDER BY id",
                        (Outcome.PENDING.value,),
                    ).fetchall()
                    if conn is not None
                    else []
                )
        except LedgerError as e:
            self._emit("error", "ledger_interrupt_failed", error=str(e))
            return []
        out = []
        for row_id, key, text in rows:
            if key in self._pending:
                continue
            try:
                d = json.loads(text)
            except ValueError:
                continue  # verify reports a damaged row; nothing to mark here
            self._queue(
                key,
                interrupt(d),
                row_id=row_id,
                provisional_id=None,
                op="interrupted",
                error=None,
            )
            out.append(row_id)
        return out

    def flush_pending(self) -> int:
        """Write every pending record to the database; return how many landed.  Never raises.

        The daemon calls this at start and then periodically (a disk that gets space back between
        two switches should not wait for the next switch).
        """
        if self.readonly:
            return 0
        with self._wlock:
            before = self._replayed_total
            try:
                self._replay()
            except Exception as e:  # noqa: BLE001 - called from a timer: report, never raise
                self._note_error(e)
                if self._pending:
                    self._emit(
                        "warning", "ledger_still_degraded", pending=len(self._pending), error=self._error
                    )
            return self._replayed_total - before

    # ----------------------------------------------------------------- the port: reads

    def last(self) -> SwitchRecord | None:
        """The newest switch (a pending spooled record counts)."""
        rows = self.list(limit=1)
        return rows[0] if rows else None

    def get(self, row_id: int) -> SwitchRecord | None:
        """One switch by id (a provisional id finds a pending record, or the row it became)."""
        if row_id < 0 and row_id in self._landed:
            row_id = self._landed[row_id]
        for entry in self._pending_entries():
            # A pending finish is newer than the row's begin in the database.
            if row_id in (entry.get("provisional_id"), entry.get("row_id")):
                return record_from_dict(entry["record"], row_id)
        if row_id < 0:
            return None
        with self._reader() as conn:
            if conn is None:
                return None
            row = conn.execute("SELECT id, record FROM switches WHERE id = ?", (row_id,)).fetchone()
        if row is None:
            return None
        return record_from_dict(json.loads(row[1]), row[0])

    def list(
        self,
        limit: int = 20,
        backend: str | None = None,
        since: datetime | None = None,
        outcome: str | None = None,
        **filters: Any,
    ) -> builtins.list[SwitchRecord]:
        """Newest first.  ``backend`` matches rows switching to or away from it; ``since`` is an
        instant (naive = UTC) compared with ``started_at``; pending spooled records are included."""
        if filters:
            raise TypeError(f"unknown ledger filter(s): {', '.join(sorted(filters))}")
        since_text = _utc_text(since) if since is not None else None
        where: builtins.list[str] = []
        args: builtins.list[Any] = []
        if backend is not None:
            where.append("(to_backend = ? OR from_backend = ?)")
            args += [backend, backend]
        if since_text is not None:
            where.append("started_at >= ?")
            args.append(since_text)
        if outcome is not None:
            where.append("outcome = ?")
            args.append(outcome)
        sql = "SELECT id, record FROM switches"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(int(limit))
        with self._reader() as conn:
            rows = conn.execute(sql, args).fetchall() if conn is not None else []
        out = [record_from_dict(json.loads(text), rid) for rid, text in rows]
        pending = []
        for entry in self._pending_entries():
            rec = record_from_dict(entry["record"], entry.get("row_id") or entry.get("provisional_id"))
            if backend is not None and backend not in (rec.to_backend, rec.from_backend):
                continue
            if since_text is not None and (_utc_text(rec.started_at) or "") < since_text:
                continue
            if outcome is not None and rec.outcome != outcome:
                continue
            pending.append(rec)
        if pending:
            # A pending record supersedes its own (older) row in the database.
            pending_ids = {r.id for r in pending if r.id is not None and r.id > 0}
            out = [r for r in out if r.id not in pending_ids] + pending
            out.sort(key=lambda r: (_utc_text(r.started_at) or "", r.id or 0), reverse=True)
        return out[: int(limit)]

    def iter_all(self) -> Iterator[SwitchRecord]:
        """Every row in the database, oldest first (for export), read in batches."""
        last = 0
        while True:
            batch = self._fetch("SELECT id, record FROM switches WHERE id > ? ORDER BY id LIMIT 500", (last,))
            for rid, text in batch:
                yield record_from_dict(json.loads(text), rid)
            if len(batch) < 500:
                return
            last = batch[-1][0]

    def iter_to(self, backend: str) -> Iterator[SwitchRecord]:
        """Switches to ``backend``, newest first (pending spooled ones first), read in batches."""
        pending = [r for r in self.pending_records() if r.to_backend == backend]
        seen = {r.id for r in pending}
        yield from reversed(pending)
        last = None
        sql: str
        args: tuple[Any, ...]
        while True:
            if last is None:
                sql, args = (
                    "SELECT id, record FROM switches WHERE to_backend = ? ORDER BY id DESC LIMIT 50",
                    (backend,),
                )
            else:
                sql = "SELECT id, record FROM switches WHERE to_backend = ? AND id < ? ORDER BY id DESC LIMIT 50"
                args = (backend, last)
            batch = self._fetch(sql, args)
            for rid, text in batch:
                if rid not in seen:
                    yield record_from_dict(json.loads(text), rid)
            if len(batch) < 50:
                return
            last = batch[-1][0]

    def backends(self) -> builtins.list[str]:
        """Every backend some switch went to (``off`` left out), by name."""
        names = {r[0] for r in self._fetch("SELECT DISTINCT to_backend FROM switches", ())}
        names |= {r.to_backend for r in self.pending_records()}
        names.discard(OFF)
        return sorted(names)

    def _fetch(self, sql: str, args: Sequence[Any]) -> builtins.list[Any]:
        with self._reader() as conn:
            return conn.execute(sql, args).fetchall() if conn is not None else []

    def pending_records(self) -> builtins.list[SwitchRecord]:
        """Records waiting in the spool, oldest first."""
        return [
            record_from_dict(e["record"], e.get("row_id") or e.get("provisional_id"))
            for e in self._pending_entries()
        ]

    def health(self) -> dict[str, Any]:
        """``{"state": "ok"|"degraded", "pending": N, "error": str|None, "alarm": str|None}``.

        ``alarm`` is a tamper alarm (the head file disagreed with the database at a write); it does
        not make the ledger degraded (it still writes) but ``verify`` fails while it stands.
        """
        pending = len(self._pending_entries())
        error = self._error
        state = "degraded" if pending or error else "ok"
        return {"state": state, "pending": pending, "error": error, "alarm": self._alarm}

    def verify(self) -> VerifyResult:
        """Check every row's hash and link, then the head file against the last row.

        Returns the first bad row (``first_bad_id``) and what is wrong with it.  Never raises.
        """
        head_file = self._read_head_file()
        try:
            return self._verify(head_file)
        except LedgerError as e:
            return VerifyResult(False, 0, None, str(e), {}, head_file)

    def _verify(self, head_file: dict[str, Any] | None) -> VerifyResult:
        with self._reader() as conn:
            if conn is None:
                if head_file and head_file.get("id"):
                    return VerifyResult(
                        False,
                        0,
                        None,
                        f"the database {self.db_path} is missing but the head file "
                        f"names row {head_file.get('id')}",
                        {},
                        head_file,
                    )
                return VerifyResult(True, 0, None, None, {"id": 0, "hash": GENESIS_HASH}, head_file)
            try:
                version = schema_version(conn)
                if version < 2:
                    return VerifyResult(
                        False,
                        0,
                        None,
                        f"the database is at schema version {version} (no hash chain yet); the daemon "
                        f"migrates it when it next starts",
                        {},
                        head_file,
                    )
                return self._verify_rows(conn, head_file)
            except sqlite3.Error as e:
                return VerifyResult(False, 0, None, f"cannot read the database: {e}", {}, head_file)

    # ----------------------------------------------------------------- verify

    def _verify_rows(self, conn: sqlite3.Connection, head_file: dict[str, Any] | None) -> VerifyResult:
        cols = ", ".join(CHAIN_COLUMNS + ("hash",))
        prev_hash = GENESIS_HASH
        prev_id: int | None = None
        count = 0
        for row in conn.execute(f"SELECT {cols} FROM switches ORDER BY id"):
            values = dict(zip(CHAIN_COLUMNS + ("hash",), row, strict=True))
            count += 1
            rid = values["id"]
            if values["prev_hash"] != prev_hash:
                after = f"row {prev_id}" if prev_id is not None else "the start of the chain"
                return VerifyResult(
                    False,
                    count,
                    rid,
                    f"row {rid}: does not link to {after} (a row before it was rewritten, or rows "
                    f"between them were removed)",
                    {},
                    head_file,
                )
            if row_hash(values) != values["hash"]:
                return VerifyResult(
                    False,
                    count,
                    rid,
                    f"row {rid}: its content does not match its hash (edited outside gpushift)",
                    {},
                    head_file,
                )
            prev_hash, prev_id = values["hash"], rid
        head = {"id": prev_id or 0, "hash": prev_hash}
        problem = self._head_problem(head, head_file, count)
        if problem:
            return VerifyResult(False, count, None, problem, head, head_file)
        return VerifyResult(True, count, None, None, head, head_file)

    def _head_problem(self, head: dict[str, Any], head_file: dict[str, Any] | None, rows: int) -> str | None:
        if head_file is None:
            if rows == 0:
                return None
            return f"the head file {self.head_path} is missing (the chain cannot be checked against it)"
        if head_file.get("alarm"):
            a = head_file["alarm"]
            return f"the head file records an alarm from {a.get('at')}: {a.get('what')}"
        if _same_head(head, head_file) or _same_head(head, head_file.get("prev")):
            # "prev": the write that named this head was interrupted before its commit finished.
            return None
        return (
            f"the head file names row {head_file.get('id')} hash {str(head_file.get('hash'))[:16]} "
            f"but the database ends at row {head['id']} hash {head['hash'][:16]} (the database was "
            f"changed or its chain recomputed outside gpushift)"
        )

    # ----------------------------------------------------------------- writing

    def _write_with_replay(self, key: str, d: Mapping[str, Any], row_id: int | None, op: str) -> int:
        """Replay pending records first (their rows are older), then write this one."""
        self._replay()
        return self._write(key, d, row_id=row_id, op=op)

    def _replay(self) -> None:
        if not self._pending:
            self._writer()  # still proves the database opens
            return
        quarantined = 0
        for key, entry in sorted(builtins.list(self._pending.items()), key=lambda kv: kv[1]["seq"]):
            try:
                row_id = self._write(key, entry["record"], row_id=entry.get("row_id"), op="replay")
            except Exception as e:  # noqa: BLE001 - sorted below: unavailable, or this record
                if _is_unavailable(e):
                    raise
                # The database works but refuses this one record (a bug, a damaged spool file):
                # set it aside so that it does not stall every later record.
                self._quarantine(key, e)
                quarantined += 1
                continue
            pid = entry.get("provisional_id")
            if pid is not None:
                self._landed[pid] = row_id
                self._keys[pid] = key
            self._keys[row_id] = key
            self._replayed_total += 1
            with self._plock:
                del self._pending[key]
            self._unlink_spool(key)
        self._error = (
            f"{quarantined} pending record(s) could not be written: see ledger_record_quarantined"
            if quarantined
            else None
        )

    def _quarantine(self, key: str, e: BaseException) -> None:
        with self._plock:
            entry = self._pending.pop(key)
        path = self._spool_file(key)
        kept = None
        if path is not None and os.path.exists(path):
            with contextlib.suppress(OSError):
                os.replace(path, path + ".bad")
                kept = path + ".bad"
        self._emit(
            "error",
            "ledger_record_quarantined",
            uuid=key,
            error=f"{type(e).__name__}: {e}",
            kept=kept,
            record=entry.get("record"),
        )

    def _write(self, key: str, d: Mapping[str, Any], row_id: int | None, op: str) -> int:
        """Insert or rewrite one row in one transaction; the head file is written before COMMIT."""
        conn = self._writer()
        head_before: dict[str, Any] | None = None
        head_written = False
        try:
            conn.execute("BEGIN IMMEDIATE")
            last = conn.execute("SELECT id, hash FROM switches ORDER BY id DESC LIMIT 1").fetchone()
            head_before = {"id": last[0], "hash": last[1]} if last else {"id": 0, "hash": GENESIS_HASH}
            self._check_head_file(head_before)
            target = self._find_row(conn, key, row_id, d)
            if target is None:
                new_id = int(head_before["id"]) + 1
                values = _row_values(d, new_id, key, head_before["hash"])
                values["hash"] = row_hash(values)
                cols = CHAIN_COLUMNS + ("hash",)
                conn.execute(
                    f"INSERT INTO switches ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    [values[c] for c in cols],
                )
                head_after = {"id": new_id, "hash": values["hash"]}
            else:
                new_id = target[0]
                head_after = self._rewrite(conn, new_id, target[1], d, head_before)
            self._write_head(head_after, head_before)
            head_written = True
            conn.execute("COMMIT")
        except BaseException as e:
            _rollback(conn)
            self._drop_writer()
            if head_written and head_before is not None:
                # The head file must not claim a write that did not happen.
                with contextlib.suppress(OSError):
                    self._write_head(head_before, None)
            if isinstance(e, _WRITE_ERRORS):
                self._note_error(e)
            raise
        self._error = None
        rec = _row_values(d, new_id, key, "")
        self._emit(
            "info",
            "ledger_written",
            id=new_id,
            op=op,
            uuid=key,
            ticket=rec["ticket"],
            outcome=rec["outcome"],
            to=rec["to_backend"],
            head_id=head_after["id"],
            head_hash=head_after["hash"],
        )
        return new_id

    def _find_row(
        self, conn: sqlite3.Connection, key: str, row_id: int | None, d: Mapping[str, Any]
    ) -> tuple[int, str] | None:
        row = conn.execute("SELECT id, uuid FROM switches WHERE uuid = ?", (key,)).fetchone()
        if row is not None:
            return int(row[0]), str(row[1])
        if row_id is not None and row_id > 0:
            # Known by id only (the key was lost with a restart): accept it only if it is the same
            # switch, never overwrite another switch that happens to have this id.
            row = conn.execute(
                "SELECT id, uuid, started_at, ticket FROM switches WHERE id = ?", (row_id,)
            ).fetchone()
            if (
                row is not None
                and row[2] == _utc_text(d.get("started_at"))
                and row[3] == str(d.get("ticket") or "")
            ):
                return int(row[0]), str(row[1])
        return None

    def _rewrite(
        self,
        conn: sqlite3.Connection,
        row_id: int,
        key: str,
        d: Mapping[str, Any],
        head_before: dict[str, Any],
    ) -> dict[str, Any]:
        """Rewrite row ``row_id``; re-link the rows after it when it is not the newest."""
        cols = ", ".join(CHAIN_COLUMNS + ("hash",))
        rows = [
            dict(zip(CHAIN_COLUMNS + ("hash",), r, strict=True))
            for r in conn.execute(f"SELECT {cols} FROM switches WHERE id >= ? ORDER BY id", (row_id,))
        ]
        intact = _segment_intact(rows)
        if not intact:
            self._raise_alarm(
                f"rows from {row_id} on did not verify when gpushift rewrote row {row_id} (edited outside "
                f"gpushift)"
            )
        values = _row_values(d, row_id, key, rows[0]["prev_hash"])
        values["hash"] = row_hash(values)
        sets = ", ".join(f"{c} = ?" for c in CHAIN_COLUMNS[1:] + ("hash",))
        conn.execute(
            f"UPDATE switches SET {sets} WHERE id = ?",
            [values[c] for c in CHAIN_COLUMNS[1:] + ("hash",)] + [row_id],
        )
        if len(rows) == 1:
            return {"id": row_id, "hash": values["hash"]}
        if not intact:
            # Leave the successors alone: re-linking them would hide the edit verify must report.
            return {"id": rows[-1]["id"], "hash": rows[-1]["hash"]}
        self._emit("info", "ledger_relinked", rewritten=row_id, rows_after=len(rows) - 1)
        prev = values["hash"]
        for r in rows[1:]:
            r["prev_hash"] = prev
            prev = row_hash(r)
            conn.execute(
                "UPDATE switches SET prev_hash = ?, hash = ? WHERE id = ?", (r["prev_hash"], prev, r["id"])
            )
        return {"id": rows[-1]["id"], "hash": prev}

    def _key_of_row(self, row_id: int) -> str | None:
        try:
            with self._reader() as conn:
                if conn is None:
                    return None
                row = conn.execute("SELECT uuid FROM switches WHERE id = ?", (row_id,)).fetchone()
        except (sqlite3.Error, LedgerError):
            return None
        return str(row[0]) if row and row[0] else None

    # ----------------------------------------------------------------- connections

    def _writer(self) -> sqlite3.Connection:
        if self.readonly:
            raise LedgerError("the ledger was opened read-only")
        if self._conn is not None:
            return self._conn
        parent = os.path.dirname(os.path.abspath(self.db_path))
        os.makedirs(parent, mode=DIR_MODE, exist_ok=True)
        _create_private_file(self.db_path, self.group)
        conn = sqlite3.connect(
            self.db_path, timeout=self.lock_timeout_s, isolation_level=None, check_same_thread=False
        )
        try:
            # WAL: `gpushift ledger` reads while the daemon writes.  FULL: a switch record is
            # worth an fsync per commit (a few per day).
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            if self._connect_hook is not None:
                self._connect_hook(conn)
            old = migrate(conn)
            if old < SCHEMA_VERSION:
                self._emit(
                    "info", "ledger_migrated", path=self.db_path, from_version=old, to_version=SCHEMA_VERSION
                )
            self._conn = conn
            if not self._head_checked:
                self._startup_head_check(conn, migrated=old < SCHEMA_VERSION)
        except BaseException:
            self._conn = None
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            raise
        return conn

    def _drop_writer(self) -> None:
        # After a failure the connection may carry a state (max_page_count, a broken WAL handle);
        # the next attempt starts afresh.
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None

    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection | None]:
        """A connection for reading (``None`` when the database does not exist yet)."""
        with self._rlock:
            if self._rconn is None:
                if not os.path.exists(self.db_path):
                    yield None
                    return
                self._rconn = self._open_reader()
            try:
                yield self._rconn
            except sqlite3.Error as e:
                with contextlib.suppress(sqlite3.Error):
                    self._rconn.close()
                self._rconn = None
                raise LedgerError(f"cannot read the ledger {self.db_path}: {e}") from None

    def _open_reader(self) -> sqlite3.Connection:
        uri = "file:" + _uri_path(os.path.abspath(self.db_path))
        try:
            conn = sqlite3.connect(
                uri + "?mode=ro", uri=True, timeout=self.lock_timeout_s, check_same_thread=False
            )
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError:
            pass
        # A reader that may not create the -shm/-wal files next to the database (a group member,
        # the daemon not running, so SQLite removed them at its last close): with no WAL around,
        # the main file alone is the whole database, and immutable=1 reads it without them.
        try:
            conn = sqlite3.connect(uri + "?mode=ro&immutable=1", uri=True, check_same_thread=False)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.Error as e:
            raise LedgerError(f"cannot open the ledger {self.db_path}: {e}") from None

    # ----------------------------------------------------------------- head file

    def _read_head_file(self) -> dict[str, Any] | None:
        try:
            with open(self.head_path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            return {"id": None, "hash": None, "error": f"unreadable: {e}"}
        return data if isinstance(data, dict) else {"id": None, "hash": None, "error": "not an object"}

    def _write_head(self, head: dict[str, Any], prev: dict[str, Any] | None) -> None:
        data: dict[str, Any] = {"id": head["id"], "hash": head["hash"], "written_at": _now_iso()}
        if prev is not None and not _same_head(head, prev):
            data["prev"] = {"id": prev["id"], "hash": prev["hash"]}
        if self._alarm_record is not None:
            data["alarm"] = self._alarm_record
        _write_file_atomic(self.head_path, (json.dumps(data, indent=1) + "\n").encode(), self.group)

    def _raise_alarm(self, what: str) -> None:
        if self._alarm_record is None:
            self._alarm_record = {"at": _now_iso(), "what": what}
            self._alarm = what
        self._emit("error", "ledger_tamper_alarm", what=what)

    def _startup_head_check(self, conn: sqlite3.Connection, migrated: bool) -> None:
        """At the writer's first open: write a missing head for a new/migrated database, complete
        an interrupted head update, or raise the alarm when the head file disagrees."""
        self._head_checked = True
        hf = self._read_head_file()
        last = conn.execute("SELECT id, hash FROM switches ORDER BY id DESC LIMIT 1").fetchone()
        head = {"id": last[0], "hash": last[1]} if last else {"id": 0, "hash": GENESIS_HASH}
        if hf is not None and isinstance(hf.get("alarm"), dict):
            self._alarm_record = hf["alarm"]  # an alarm stands until a person removes it
            self._alarm = str(hf["alarm"].get("what"))
        if hf is None and (migrated or head["id"] == 0):
            # A new database, or one just migrated from version 1 (a chain, but never a head file).
            self._write_head(head, None)
            return
        self._check_head_file(head)
        if hf is not None and _same_head(head, hf.get("prev")):
            # The last write was cut off between writing the head and its COMMIT: settle it.
            self._write_head(head, None)

    def _check_head_file(self, head: dict[str, Any]) -> None:
        hf = self._read_head_file()
        if hf is not None and (_same_head(head, hf) or _same_head(head, hf.get("prev"))):
            return
        if hf is None:
            if head["id"] == 0:
                return
            what = (
                f"the head file {self.head_path} was missing while the database has rows up to {head['id']}"
            )
        else:
            what = (
                f"the head file named row {hf.get('id')} hash {str(hf.get('hash'))[:16]} but the database "
                f"ended at row {head['id']} hash {head['hash'][:16]}"
            )
        self._raise_alarm(what)

    # ----------------------------------------------------------------- spool

    def _new_provisional_id(self) -> int:
        pid = self._next_provisional
        self._next_provisional -= 1
        return pid

    def _queue(
        self,
        key: str,
        d: Mapping[str, Any],
        row_id: int | None,
        provisional_id: int | None,
        op: str,
        error: BaseException | None,
    ) -> None:
        """Keep a record that could not be written: in memory, in the spool, and in the log."""
        prev = self._pending.get(key)
        entry = {
            "format": 1,
            "uuid": key,
            "seq": prev["seq"] if prev else time.time_ns(),  # keeps the order of first attempts
            "op": op,
            "row_id": row_id,
            "provisional_id": provisional_id,
            "queued_at": _now_iso(),
            "error": f"{type(error).__name__}: {error}" if error is not None else (prev or {}).get("error"),
            "record": dict(d),
        }
        with self._plock:
            self._pending[key] = entry
        if error is not None:
            self._note_error(error)
        spooled = self._write_spool(entry)
        # The journal line carries the whole record: the last resort if /run is lost too.
        self._emit(
            "warning",
            "ledger_pending",
            uuid=key,
            op=op,
            id=row_id or provisional_id,
            error=entry["error"],
            pending=len(self._pending),
            spool=spooled,
            record=entry["record"],
        )

    def _spool_file(self, key: str) -> str | None:
        return os.path.join(self.spool_dir, f"{key}.json") if self.spool_dir else None

    def _write_spool(self, entry: dict[str, Any]) -> str | None:
        path = self._spool_file(entry["uuid"])
        if path is None:
            return None
        try:
            assert self.spool_dir is not None
            os.makedirs(self.spool_dir, mode=DIR_MODE, exist_ok=True)
            _write_file_atomic(path, _record_json(entry).encode("utf-8"), self.group)
        except OSError as e:
            self._emit("error", "ledger_spool_failed", path=path, error=str(e))
            return None
        return path

    def _unlink_spool(self, key: str) -> None:
        path = self._spool_file(key)
        if path is None:
            return
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            # Harmless for correctness (a replay updates the same row), but say so.
            self._emit("warning", "ledger_spool_unlink_failed", path=path, error=str(e))
        assert self.spool_dir is not None
        _fsync_dir(self.spool_dir)

    def _read_spool_dir(self) -> builtins.list[dict[str, Any]]:
        if not self.spool_dir:
            return []
        try:
            names = os.listdir(self.spool_dir)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            self._emit("error", "ledger_spool_unreadable", path=self.spool_dir, error=str(e))
            return []
        out = []
        for name in names:
            if not name.endswith(".json") or name.startswith("."):
                continue
            path = os.path.join(self.spool_dir, name)
            try:
                with open(path, encoding="utf-8") as f:
                    entry = json.load(f)
                _check_spool_entry(entry, name[: -len(".json")])
                out.append(entry)
            except (OSError, ValueError) as e:
                # Kept for a person, out of the replay's way; the log line says where.
                self._emit("error", "ledger_spool_bad_file", path=path, error=str(e))
                if not self.readonly:
                    with contextlib.suppress(OSError):
                        os.replace(path, path + ".bad")
        out.sort(key=lambda e: e["seq"])
        return out

    def _load_spool(self) -> None:
        entries = self._read_spool_dir()
        if self.readonly:
            return
        for entry in entries:
            self._pending[entry["uuid"]] = entry
            pid = entry.get("provisional_id")
            if isinstance(pid, int) and pid < 0:
                self._next_provisional = min(self._next_provisional, pid - 1)
                self._keys[pid] = entry["uuid"]
        if entries:
            self._error = f"{len(entries)} record(s) pending in {self.spool_dir}"

    def _pending_entries(self) -> builtins.list[dict[str, Any]]:
        if self.readonly:
            return self._read_spool_dir()  # the daemon may land them any moment: read afresh
        with self._plock:
            return sorted(self._pending.values(), key=lambda e: e["seq"])

    # ----------------------------------------------------------------- logging

    def _note_error(self, e: BaseException) -> None:
        self._error = f"{type(e).__name__}: {e}"

    def _emit(self, level: str, event: str, **fields: Any) -> None:
        log = self._log
        if log is None:
            import structlog  # imported here: the read-only CLI never logs, and it must start fast

            log = self._log = structlog.get_logger("gpushift.ledger")
        logging = sys.modules.get("logging")  # a stdlib Logger implies the module is loaded
        try:
            if logging is not None and isinstance(log, logging.Logger):
                log.log(
                    getattr(logging, level.upper(), logging.INFO),
                    "%s %s",
                    event,
                    json.dumps(fields, sort_keys=True, default=str),
                )
            elif hasattr(log, level):
                getattr(log, level)(event, **fields)
            else:
                log(event, level=level, **fields)
        except Exception:  # noqa: BLE001 - a broken logger must not cost a ledger write
            pass


def _is_unavailable(e: BaseException) -> bool:
    """True when the database cannot be written right now (retry later), False when it refuses
    this record for what it is (retrying will not help)."""
    if isinstance(e, (sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.DataError)):
        return False
    return isinstance(e, _WRITE_ERRORS)


def _check_spool_entry(entry: Any, key: str) -> None:
    """Raise ValueError unless ``entry`` is a spool entry this code wrote."""
    if not isinstance(entry, dict) or not isinstance(entry.get("record"), dict):
        raise ValueError("not a pending ledger record")
    if entry.setdefault("uuid", key) != key:
        raise ValueError(f"its uuid {entry.get('uuid')!r} does not match the file name")
    entry.setdefault("seq", 0)
    for k in ("seq",):
        if not isinstance(entry[k], int) or isinstance(entry[k], bool):
            raise ValueError(f"{k} is not an integer")
    for k in ("row_id", "provisional_id"):
        v = entry.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise ValueError(f"{k} is not an integer")


def _segment_intact(rows: Sequence[Mapping[str, Any]]) -> bool:
    prev: str | None = None
    for r in rows:
        if prev is not None and r["prev_hash"] != prev:
            return False
        if row_hash(r) != r["hash"]:
            return False
        prev = r["hash"]
    return True


def _same_head(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    if not a or not b:
        return False
    return a.get("id") == b.get("id") and a.get("hash") == b.get("hash")


def _uri_path(path: str) -> str:
    # The three characters that end or escape a path in an SQLite URI.
    return path.replace("%", "%25").replace("?", "%3f").replace("#", "%23")


def _new_key() -> str:
    import uuid

    return uuid.uuid4().hex


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()

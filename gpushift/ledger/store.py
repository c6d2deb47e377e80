"""The deployment ledger in SQLite (the ``Ledger`` port).

One row per switch attempt: written as the intent row before anything is stopped (``begin``) and
rewritten when the switch ends (``finish``) or when a new daemon finds it unfinished
(``mark_interrupted``).  Queryable columns sit beside the full record as JSON (``record``), which is
what users see (``SwitchRecord.to_dict()``).

Three promises, each with its mechanism:

* **Readers never block the writer.**  WAL journal; ``gpushift ledger`` opens the file read-only
  (``reader.py``).
* **No row is lost quietly.**  When the database cannot be written (disk full, read-only, locked
  past ``lock_timeout_s``) ``begin``/``finish`` do not raise: the full record goes to the log as one
  structured line (``ledger_pending``) and to the pending spool (``spool.py``).  Every later write
  first replays the spool; a new ``SqliteLedger`` on the same paths (the daemon restarted after a
  crash) replays it too.  A spooled record carries a key (``uuid`` column, unique) so a replay that
  is interrupted after the commit but before the spool file is removed updates the same row instead
  of adding a second one.  ``begin`` while degraded returns a *provisional* id: a negative number,
  unique within the spool; ``finish`` of that record lands in the same row (matched by key), and
  ``finish`` sets ``record.id`` to the real row id once the row is in the database.
* **Tampering is evident** (``chain.py``).  A row is rewritten at finish; with one writer it is then
  the newest row and only its own hash changes.  When it is not the newest (a spooled record
  replayed late, ``mark_interrupted`` of an old row), the rows after it are re-linked, but only
  after checking that that part of the chain is intact, so a rewrite never blesses an edit made
  behind gpushift's back.
* **A broken database never stops the writer** (``breaks.py``; the write connection,
  ``connection.py``).  A file that is not a database is moved aside, a database deleted or
  replaced under the writer is noticed (its identity is checked before each write and at every
  ``flush_pending``), and a new chain starts whose first row records the break; until the new
  database takes writes, records wait in the spool.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from gpushift.errors import LedgerError
from gpushift.ledger import breaks, health
from gpushift.ledger.chain import HeadFile, db_head, insert_row, rewrite_row
from gpushift.ledger.connection import WriterConnection
from gpushift.ledger.rows import interrupted, new_key, row_values, utc_text
from gpushift.ledger.schema import rollback
from gpushift.ledger.spool import DEFAULT_MAX_BYTES, DEFAULT_MAX_RECORDS, Spool
from gpushift.values import Outcome, SwitchRecord

#: What "the database cannot be written" looks like at this edge.  Everything else is a bug.
_WRITE_ERRORS: tuple[type[BaseException], ...] = (sqlite3.Error, OSError, LedgerError)

DEFAULT_GROUP = "gpushift"
DEFAULT_LOCK_TIMEOUT_S = 5.0

_PENDING_ROWS = "SELECT id, uuid, record FROM switches WHERE outcome = ? ORDER BY id"


def _ident(d: Mapping[str, Any]) -> tuple[str, str]:
    """Which switch a record is (its start and ticket), whatever id it has had in which chain."""
    return (utc_text(d.get("started_at")) or "", str(d.get("ticket") or ""))


class SqliteLedger(WriterConnection):
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
        spool_max_records, spool_max_bytes: the bound of the pending spool; a record beyond it
            is only logged (``ledger_record_lost``, with the whole record).
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
        spool_max_records: int = DEFAULT_MAX_RECORDS,
        spool_max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self._log = log
        path = os.fspath(db_path)
        if head_path is None:
            head_path = os.path.join(os.path.dirname(os.path.abspath(path)), "ledger.head")
        head = HeadFile(os.fspath(head_path), group, self._emit)
        runtime_dir = os.fspath(spool_dir) if spool_dir is not None else None
        spool = Spool(runtime_dir, group, self._emit, readonly, spool_max_records, spool_max_bytes)
        super().__init__(
            path, head, spool, lock_timeout_s, readonly=readonly, group=group, connect_hook=connect_hook
        )
        self._wlock = threading.RLock()  # one write at a time, in this process
        self._keys: dict[tuple[str, str], str] = {}  # which switch (_ident) -> its key, for finish()
        self._replayed_total = 0
        self._error: str | None = None
        entries = self._spool.load()
        if readonly:
            return
        for entry in entries:
            self._keys[_ident(entry["record"])] = entry["uuid"]
        if entries:
            self._error = f"{len(entries)} record(s) pending in {self.spool_dir}"
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
        super().close()

    def health(self) -> dict[str, Any]:
        """``{"state": "ok"|"degraded", "pending": N, "error": str|None, "alarm": str|None}``, and
        where they say something: ``reason``, ``chain_break``, ``lost``.

        ``reason`` (while degraded) is a few words for the status line (``disk full, 2 pending``).
        ``alarm`` is a tamper alarm (the head file disagreed with the database at a write); it does
        not make the ledger degraded (it still writes) but ``verify`` fails while it stands.
        ``chain_break`` is the break this writer recorded (``breaks.py``); ``lost`` how many records
        the full spool could not keep (each one is in the log, ``ledger_record_lost``).
        """
        pending = len(self._spool.entries())
        out = health.summary(pending, self._error, self._head.alarm, self.chain_break, self._spool.lost)
        if self._spool.bad_files:  # spool files that could not be read, set aside (the newest)
            out["bad_files"] = list(self._spool.bad_files)
        return out

    # ----------------------------------------------------------------- the port: writes

    def begin(self, record: SwitchRecord) -> int:
        """Write the intent row and return its id (negative: provisional, the record is pending).

        Never raises for an unwritable database: the record is logged and spooled instead.
        """
        key = new_key()
        with self._wlock:
            self._keys[_ident(record.to_dict())] = key
            try:
                row_id = self._write_with_replay(key, record.to_dict(), row_id=None, op="begin")
            except Exception as e:  # noqa: BLE001 - the switcher's record is never lost to an exception
                pid = self._spool.new_provisional_id()
                record.id = pid
                self._note_error(e)
                self._spool.queue(key, record.to_dict(), row_id=None, provisional_id=pid, op="begin", error=e)
                return pid
            record.id = row_id
            return row_id

    def finish(self, record: SwitchRecord) -> None:
        """Complete the row of ``record`` (matched by the key ``begin`` gave it).

        Never raises for an unwritable database; sets ``record.id`` to the real row id once the
        row is in the database.
        """
        with self._wlock:
            rid = record.id
            ident = _ident(record.to_dict())
            key = self._keys.get(ident)
            row_id = rid if rid is not None and rid > 0 else None
            if key is None:
                key = self._key_of_row(row_id, ident) if row_id is not None else None
                key = self._keys[ident] = key or new_key()
            if rid is not None and rid < 0 and rid in self._landed:
                row_id = self._landed[rid]
            try:
                new_id = self._write_with_replay(key, record.to_dict(), row_id=row_id, op="finish")
            except Exception as e:  # noqa: BLE001 - the switcher's record is never lost to an exception
                prev = self._spool.get(key) or {}
                self._note_error(e)
                self._spool.queue(
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

    def mark_interrupted(self, now: datetime) -> builtins.list[int]:
        """Mark every unfinished row (and pending spooled record) ``interrupted``; return their ids.

        Ids are real row ids where the row is in the database, provisional ids where it still waits
        in the spool.
        """

        ids: builtins.list[int] = []
        with self._wlock:
            # Pending spool entries first: they are older than anything a new write would add.
            spooled: builtins.list[tuple[str, int | None, int | None]] = []
            for key, entry in self._spool.items():
                if entry["record"].get("outcome") == Outcome.PENDING.value:
                    row_id, pid = entry.get("row_id"), entry.get("provisional_id")
                    self._spool.queue(
                        key, interrupted(entry["record"], now), row_id, pid, "interrupted", None
                    )
                    spooled.append((key, row_id, pid))
            try:
                self._replay()
                for row_id, key, text in (
                    self._writer().execute(_PENDING_ROWS, (Outcome.PENDING.value,)).fetchall()
                ):
                    d = interrupted(json.loads(text), now)
                    try:
                        ids.append(self._write(key, d, row_id=row_id, op="interrupted"))
                    except _WRITE_ERRORS as e:
                        self._note_error(e)
                        self._spool.queue(key, d, row_id, provisional_id=None, op="interrupted", error=e)
                        ids.append(row_id)
            except Exception as e:  # noqa: BLE001 - a daemon must start even on a damaged ledger
                self._note_error(e)
                self._emit("error", "ledger_interrupt_failed", error=self._error)
                ids += self._interrupt_unwritable(now)
            for key, row_id, pid in spooled:
                if key in self._spool:
                    ids.append(row_id or pid or 0)
                elif pid is not None:
                    ids.append(self._landed.get(pid, pid))
                elif row_id is not None:
                    ids.append(row_id)
        return sorted(set(ids))

    def _interrupt_unwritable(self, now: datetime) -> builtins.list[int]:
        """The database can be read but not written: queue the interrupted rows for later."""
        try:
            rows = self._fetch(_PENDING_ROWS, (Outcome.PENDING.value,))
        except (LedgerError, sqlite3.Error) as e:
            self._emit("error", "ledger_interrupt_failed", error=str(e))
            return []
        out = []
        for row_id, key, text in rows:
            if key in self._spool:
                continue
            try:
                d = json.loads(text)
            except ValueError:
                continue  # verify reports a damaged row; nothing to mark here
            self._spool.queue(
                key, interrupted(d, now), row_id, provisional_id=None, op="interrupted", error=None
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
                if len(self._spool):
                    self._emit(
                        "warning", "ledger_still_degraded", pending=len(self._spool), error=self._error
                    )
            return self._replayed_total - before

    # ----------------------------------------------------------------- writing

    def _write_with_replay(self, key: str, d: Mapping[str, Any], row_id: int | None, op: str) -> int:
        """Replay pending records first (their rows are older), then write this one.  A write
        that finds the database corrupt is tried once more, in the new chain."""
        self._replay()
        try:
            return self._write(key, d, row_id=row_id, op=op)
        except sqlite3.DatabaseError as e:
            if not breaks.is_corrupt(e):
                raise
        self._replay()
        return self._write(key, d, row_id=row_id, op=op)

    def _replay(self) -> None:
        # First the database itself: it opens, it is still the file this writer opened (a break
        # found here queues the new chain's first row before every pending record).
        self._writer()
        if not len(self._spool):
            return

        def write(key: str, entry: dict[str, Any]) -> int:
            return self._write(key, entry["record"], row_id=entry.get("row_id"), op="replay")

        def landed(key: str, entry: dict[str, Any], row_id: int) -> None:
            pid = entry.get("provisional_id")
            if pid is not None:
                self._landed[pid] = row_id
            self._keys[_ident(entry["record"])] = key
            self._replayed_total += 1

        quarantined = self._spool.flush(write, landed, _is_unavailable)
        self._error = (
            f"{quarantined} pending record(s) could not be written: see ledger_record_quarantined"
            if quarantined
            else None
        )

    def _write(self, key: str, d: Mapping[str, Any], row_id: int | None, op: str) -> int:
        """Insert or rewrite one row in one transaction; the head file names the new head with
        ``prev`` before COMMIT and alone after it."""
        conn = self._writer(allow_break=False)  # _replay, just before, looked at the file
        head_before: dict[str, Any] | None = None
        head_written = False
        try:
            conn.execute("BEGIN IMMEDIATE")
            head_before = db_head(conn)
            self._head.check(head_before)
            target = self._find_row(conn, key, row_id, d)
            if target is None:
                new_id = int(head_before["id"]) + 1
                head_after = insert_row(conn, row_values(d, new_id, key, head_before["hash"]))
            else:
                new_id = target[0]
                head_after = rewrite_row(conn, row_values(d, new_id, target[1], ""), self._head)
            self._head.write(head_after, head_before)
            head_written = True
            conn.execute("COMMIT")
        except BaseException as e:
            rollback(conn)
            self._drop_writer()
            if head_written and head_before is not None:
                # The head file must not claim a write that did not happen.
                with contextlib.suppress(OSError):
                    self._head.write(head_before, None)
            if isinstance(e, _WRITE_ERRORS):
                self._note_error(e)
            if breaks.is_corrupt(e):
                self._corrupt = f"{type(e).__name__}: {e}"  # the next open moves the file aside
            raise
        self._head.settle(head_after)
        self._last_head = head_after
        self._error = None
        rec = row_values(d, new_id, key, "")
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
                and row[2] == utc_text(d.get("started_at"))
                and row[3] == str(d.get("ticket") or "")
            ):
                return int(row[0]), str(row[1])
        return None

    def _key_of_row(self, row_id: int, ident: tuple[str, str]) -> str | None:
        """The key of row ``row_id`` when that row is the same switch (after a restart, or in a
        new chain, the id may name another one)."""
        try:
            row = self._fetch("SELECT uuid, started_at, ticket FROM switches WHERE id = ?", (row_id,))
        except (sqlite3.Error, LedgerError):
            return None
        if not row or not row[0][0] or (row[0][1], row[0][2]) != ident:
            return None
        return str(row[0][0])

    def _note_error(self, e: BaseException) -> None:
        self._error = f"{type(e).__name__}: {e}"
        where = os.path.dirname(os.path.abspath(self.db_path))
        if "unable to open" in str(e) and os.path.isdir(where) and not os.access(where, os.W_OK):
            self._error += f" ({where} is read-only)"  # SQLite cannot say why: WAL needs -shm there


def _is_unavailable(e: BaseException) -> bool:
    """True when the database cannot be written right now (retry later), False when it refuses
    this record for what it is (retrying will not help)."""
    if isinstance(e, (sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.DataError)):
        return False
    return isinstance(e, _WRITE_ERRORS)

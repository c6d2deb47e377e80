"""Reading the ledger: the read-only connection, the queries, verify.

The read side of :class:`~gpushift.ledger.store.SqliteLedger`, which adds the writes.  A reader
opens the database with ``mode=ro`` on its own connection (WAL: readers never block the writer)
and shows records still pending in the spool beside the rows; ``gpushift ledger`` uses nothing
else.
"""

from __future__ import annotations

import builtins
import contextlib
import heapq
import itertools
import json
import os
import sqlite3
import sys
import threading
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, TypeVar

from gpushift.errors import LedgerError
from gpushift.ledger.breaks import FileId, file_id
from gpushift.ledger.chain import GENESIS_HASH, HeadFile, VerifyResult, verify_rows
from gpushift.ledger.rows import record_from_dict, utc_text
from gpushift.ledger.schema import connect_reader, schema_version
from gpushift.ledger.spool import Spool
from gpushift.values import OFF, Outcome, SwitchRecord

_R = TypeVar("_R", bound="LedgerReader")

#: Rows read per query when the ledger is streamed (``iter_list``, ``iter_all``).
BATCH = 500


def _start_key(rec: SwitchRecord) -> tuple[str, int]:
    """How ``list`` orders records when some are pending: by start, then id."""
    return (utc_text(rec.started_at) or "", rec.id or 0)


class LedgerReader:
    """The queries over one ledger database and its pending spool: the read side of ``SqliteLedger``.

    Args:
        db_path: the database file.
        head: its head file.
        spool: its pending spool (a reader's view, or the writer's).
        lock_timeout_s: how long a read waits for a lock.
    """

    #: The log (see ``SqliteLedger``); None: structlog's ``gpushift.ledger`` logger, at first use.
    _log: Any = None

    def __init__(self, db_path: str, head: HeadFile, spool: Spool, lock_timeout_s: float) -> None:
        self.db_path = db_path
        self.head_path = head.path
        self.lock_timeout_s = lock_timeout_s
        self._head = head
        self._spool = spool
        self._rlock = threading.Lock()
        self._rconn: sqlite3.Connection | None = None
        self._rfile: FileId | None = None  # the file the read connection opened
        self._landed: dict[int, int] = {}  # provisional id -> real id, once replayed

    @property
    def spool_dir(self) -> str | None:
        """The directory of pending record files (``<runtime dir>/ledger-pending``), if any."""
        return self._spool.dir

    def close(self) -> None:
        """Close the read connection (a later read reopens it)."""
        with self._rlock:
            if self._rconn is not None:
                with contextlib.suppress(sqlite3.Error):
                    self._rconn.close()
                self._rconn = None

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- queries

    def last(self) -> SwitchRecord | None:
        """The newest switch (a pending spooled record counts; the row that starts a new chain is
        no switch)."""
        for rec in self.list(limit=5):
            if rec.outcome != Outcome.CHAIN_BREAK.value:
                return rec
        return None

    def get(self, row_id: int) -> SwitchRecord | None:
        """One switch by id (a provisional id finds a pending record, or the row it became)."""
        if row_id < 0 and row_id in self._landed:
            row_id = self._landed[row_id]
        for entry in self._spool.entries():
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
        return builtins.list(self.iter_list(limit, backend, since, outcome, **filters))

    def iter_list(
        self,
        limit: int = 20,
        backend: str | None = None,
        since: datetime | None = None,
        outcome: str | None = None,
        **filters: Any,
    ) -> Iterator[SwitchRecord]:
        """What ``list`` returns, in its order, read :data:`BATCH` rows at a time: memory stays
        bounded whatever ``limit`` is (``gpushift ledger --json``).

        Without a matching pending record the rows come newest id first.  With one, a pending record
        supersedes its own (older) row and the ``limit`` newest rows and the pending records are
        merged by start (then id), newest first; those rows are ordered by SQLite on a connection of
        their own, so the read lock is never held between two records.
        """
        if filters:
            raise TypeError(f"unknown ledger filter(s): {', '.join(sorted(filters))}")
        since_text = utc_text(since) if since is not None else None
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
        pending = []
        for rec in self.pending_records():
            if backend is not None and backend not in (rec.to_backend, rec.from_backend):
                continue
            if since_text is not None and (utc_text(rec.started_at) or "") < since_text:
                continue
            if outcome is not None and rec.outcome != outcome:
                continue
            pending.append(rec)
        if not pending:
            return self._newest(where, args, int(limit))
        # A pending record supersedes its own (older) row in the database.
        pending_ids = {r.id for r in pending if r.id is not None and r.id > 0}
        rows = (r for r in self._by_start(where, args, int(limit)) if r.id not in pending_ids)
        merged = heapq.merge(
            rows, sorted(pending, key=_start_key, reverse=True), key=_start_key, reverse=True
        )
        return itertools.islice(merged, max(int(limit), 0))

    def _newest(
        self, where: builtins.list[str], args: builtins.list[Any], limit: int
    ) -> Iterator[SwitchRecord]:
        """The ``limit`` newest rows that match ``where``, newest id first, a batch per query."""
        last: int | None = None
        while limit > 0:
            cond = [*where, "id < ?"] if last is not None else where
            sql = "SELECT id, record FROM switches"
            if cond:
                sql += " WHERE " + " AND ".join(cond)
            size = min(limit, BATCH)
            batch = self._fetch(
                sql + " ORDER BY id DESC LIMIT ?", [*args, *([last] if last is not None else []), size]
            )
            for rid, text in batch:
                yield record_from_dict(json.loads(text), rid)
            if len(batch) < size:
                return
            limit -= size
            last = batch[-1][0]

    def _by_start(
        self, where: builtins.list[str], args: builtins.list[Any], limit: int
    ) -> Iterator[SwitchRecord]:
        """The ``limit`` newest rows (by id) that match ``where``, ordered by start, then id, newest
        first: SQLite sorts their ids, the records are read a batch of ids at a time."""
        newest = "SELECT id, started_at FROM switches"
        if where:
            newest += " WHERE " + " AND ".join(where)
        sql = f"SELECT id FROM ({newest} ORDER BY id DESC LIMIT ?) ORDER BY started_at DESC, id DESC"
        if not db_exists(self.db_path):
            return
        conn = connect_reader(self.db_path, self.lock_timeout_s)
        try:
            cursor = conn.execute(sql, [*args, limit])
            while ids := [r[0] for r in cursor.fetchmany(BATCH)]:
                marks = ", ".join("?" * len(ids))
                texts = dict(conn.execute(f"SELECT id, record FROM switches WHERE id IN ({marks})", ids))
                for rid in ids:
                    yield record_from_dict(json.loads(texts[rid]), rid)
        except sqlite3.Error as e:
            raise LedgerError(f"cannot read the ledger {self.db_path}: {e}") from None
        finally:
            conn.close()

    def iter_all(self) -> Iterator[SwitchRecord]:
        """Every row in the database, oldest first (for export), read in batches."""
        last = 0
        while True:
            batch = self._fetch(
                "SELECT id, record FROM switches WHERE id > ? ORDER BY id LIMIT ?", (last, BATCH)
            )
            for rid, text in batch:
                yield record_from_dict(json.loads(text), rid)
            if len(batch) < BATCH:
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

    def pending_records(self) -> builtins.list[SwitchRecord]:
        """Records waiting in the spool, oldest first."""
        return [
            record_from_dict(e["record"], e.get("row_id") or e.get("provisional_id"))
            for e in self._spool.entries()
        ]

    def _fetch(self, sql: str, args: Sequence[Any]) -> builtins.list[Any]:
        with self._reader() as conn:
            return conn.execute(sql, args).fetchall() if conn is not None else []

    def check_readable(self) -> None:
        """Raise ``LedgerError`` (one line) unless the database can be read: it is not a database,
        cannot be read, or is missing while the head file names rows (it was deleted).  A ledger
        never written (no database, no head file) is fine: it is empty."""
        if not db_exists(self.db_path):
            hf = self._head.read() or {}
            hid = hf.get("id")
            if isinstance(hid, int) and not isinstance(hid, bool) and hid > 0:
                raise LedgerError(
                    f"the ledger {self.db_path} is missing, but the head file {self.head_path} names row "
                    f"{hid}: it was deleted (the daemon records the break and starts a new chain when it "
                    f"next writes)"
                )
            return
        with self._reader() as conn:
            if conn is not None:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()

    # ----------------------------------------------------------------- verify

    def verify(self) -> VerifyResult:
        """Check every row's hash and link, then the head file against the last row.

        Returns the first bad row (``first_bad_id``) and what is wrong with it.  Never raises.
        """
        head_file = self._head.read()
        try:
            return self._verify(head_file)
        except LedgerError as e:
            return VerifyResult(False, 0, None, str(e), {}, head_file)

    def _verify(self, head_file: dict[str, Any] | None) -> VerifyResult:
        with self._reader() as conn:
            if conn is None:
                if head_file and head_file.get("id"):
                    problem = (
                        f"the database {self.db_path} is missing but the head file "
                        f"names row {head_file.get('id')}"
                    )
                    return VerifyResult(False, 0, None, problem, {}, head_file)
                return VerifyResult(True, 0, None, None, {"id": 0, "hash": GENESIS_HASH}, head_file)
            try:
                version = schema_version(conn)
                if version < 2:
                    problem = (
                        f"the database is at schema version {version} (no hash chain yet); the daemon "
                        f"migrates it when it next starts"
                    )
                    return VerifyResult(False, 0, None, problem, {}, head_file)
                return verify_rows(conn, head_file, self.head_path)
            except sqlite3.Error as e:
                return VerifyResult(False, 0, None, f"cannot read the database: {e}", {}, head_file)

    # ----------------------------------------------------------------- the read connection

    @contextlib.contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection | None]:
        """A connection for reading (``None`` when the database does not exist yet).

        The connection follows the path: when the file there is another one than it opened
        (deleted, replaced, a new chain), it is reopened.
        """
        with self._rlock:
            try:
                same_file = file_id(self.db_path) == self._rfile
            except OSError:
                same_file = False  # db_exists below says why
            if self._rconn is not None and not same_file:
                with contextlib.suppress(sqlite3.Error):
                    self._rconn.close()
                self._rconn = None
            if self._rconn is None:
                if not db_exists(self.db_path):
                    yield None
                    return
                self._rconn = connect_reader(self.db_path, self.lock_timeout_s)
                self._rfile = file_id(self.db_path)
            try:
                yield self._rconn
            except sqlite3.Error as e:
                with contextlib.suppress(sqlite3.Error):
                    self._rconn.close()
                self._rconn = None
                raise LedgerError(f"cannot read the ledger {self.db_path}: {e}") from None

    # ----------------------------------------------------------------- logging

    def _emit(self, level: str, event: str, **fields: Any) -> None:
        """One structured log line through ``log`` (see ``SqliteLedger``); never raises."""
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


def db_exists(path: str) -> bool:
    """Whether the database file exists.

    Raises:
        LedgerError: it cannot be known (a directory on the way may not be entered): "no ledger
            yet" would be a wrong answer.
    """
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        raise LedgerError(
            f"cannot read the ledger {path}: {e.strerror.lower() if e.strerror else e}"
        ) from None
    return True

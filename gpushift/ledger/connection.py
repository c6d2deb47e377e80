"""The ledger's write connection: opened (and migrated) when there is none, held against the head
file, and a new chain when the database breaks under it (``breaks.py``).

The part of :class:`~gpushift.ledger.store.SqliteLedger` below its writes: ``store.py`` decides what
is written, when, and what waits in the spool; this class owns the one connection that writes and
what happens when the file behind it is deleted, replaced or no database any more: the bad file
is moved aside and the new chain's first row, which records the break, is queued before every
pending record.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from gpushift.errors import LedgerError
from gpushift.ledger import breaks
from gpushift.ledger.chain import HeadFile, db_head
from gpushift.ledger.reader import LedgerReader
from gpushift.ledger.rows import new_key
from gpushift.ledger.schema import SCHEMA_VERSION, connect_writer
from gpushift.ledger.spool import CHAIN_BREAK_OP, Spool


class WriterConnection(LedgerReader):
    """The read side plus the write connection of one ledger (see ``SqliteLedger`` for the args)."""

    def __init__(
        self,
        db_path: str,
        head: HeadFile,
        spool: Spool,
        lock_timeout_s: float,
        *,
        readonly: bool,
        group: str | None,
        connect_hook: Callable[[sqlite3.Connection], None] | None,
    ) -> None:
        super().__init__(db_path, head, spool, lock_timeout_s)
        self.readonly = readonly
        self.group = group
        self._connect_hook = connect_hook
        self._conn: sqlite3.Connection | None = None
        self._head_checked = False
        self._db_file = breaks.DbFile(db_path)
        self._last_head: dict[str, Any] | None = None  # the head of this writer's last open or write
        self._corrupt: str | None = None  # a write found the open database corrupt: break at reopen
        #: The break this writer recorded (``extra["chain_break"]`` of the new chain's first row).
        self.chain_break: dict[str, Any] | None = None

    def _writer(self, allow_break: bool = True) -> sqlite3.Connection:
        """The write connection, opened (and migrated) when there is none.

        With ``allow_break`` it first checks that the path still names the file it opened, and
        a database that is deleted, replaced or not a database starts a new chain (``breaks.py``).
        """
        if self.readonly:
            raise LedgerError("the ledger was opened read-only")
        if self._conn is not None and not allow_break:
            return self._conn
        moved = self._db_file.moved() if allow_break else None
        if self._conn is not None and moved is None:
            return self._conn
        if moved is not None:
            self._new_chain(moved, None)
        elif allow_break and self._corrupt is not None:
            self._new_chain(breaks.CORRUPT, self._corrupt)
        try:
            return self._open(allow_break)
        except sqlite3.DatabaseError as e:
            if not (allow_break and breaks.is_corrupt(e)):
                raise
            self._new_chain(breaks.CORRUPT, f"{type(e).__name__}: {e}")
            return self._open(allow_break)

    def _open(self, allow_break: bool) -> sqlite3.Connection:
        """Connect, migrate, and hold the head file against the database."""
        created = not os.path.exists(self.db_path)
        conn, old = self._connect()
        try:
            if old < SCHEMA_VERSION:
                self._emit(
                    "info", "ledger_migrated", path=self.db_path, from_version=old, to_version=SCHEMA_VERSION
                )
            head = db_head(conn)
            if head["id"] == 0:
                if (
                    created
                    and allow_break
                    and self._spool.pending_break() is None
                    and self._head.names_lost_rows(head)
                ):
                    # No database where the head file names rows: it was deleted.  (Rows deleted
                    # from a database that is there are an edit: check_at_open raises the alarm.)
                    reason = breaks.DELETED if self._db_file.id is not None else breaks.MISSING
                    self._new_chain(reason, None, connected=True)
                if self._spool.pending_break() is not None:
                    self._head.restart()
                    self._head_checked = False
            if not self._head_checked:
                self._head_checked = True
                self._head.check_at_open(head, migrated=old < SCHEMA_VERSION)
            self._db_file.opened()
            self._last_head = head
            self._conn = conn
        except BaseException:
            self._conn = None
            with contextlib.suppress(sqlite3.Error):
                conn.close()
            raise
        return conn

    def _connect(self) -> tuple[sqlite3.Connection, int]:
        if not os.path.exists(self.db_path):
            # A -wal/-shm without their database belong to a file that is gone: a new database
            # must not replay them.
            breaks.move_aside(
                self.db_path, breaks.MISSING, datetime.now(timezone.utc), main=False, own_wal=False
            )
        return connect_writer(self.db_path, self.lock_timeout_s, self.group, self._connect_hook)

    def _new_chain(self, reason: str, error: str | None, connected: bool = False) -> None:
        """The database broke (``breaks.py``): close it, move a bad file aside, and queue the new
        chain's first row (before every pending record).  A break already waiting to land is
        kept, not doubled (the daemon restarted, or the new file broke again before it landed).

        Raises:
            LedgerError: the file cannot be moved aside (read-only directory): nothing changed,
                the records wait in the spool and the next write tries again.
        """
        self._drop_writer()
        LedgerReader.close(self)  # a reader on the old file would show the old rows
        at = datetime.now(timezone.utc)
        moved_to = None
        if not connected:
            try:
                moved_to = breaks.move_aside(
                    self.db_path,
                    reason,
                    at,
                    main=reason in (breaks.CORRUPT, breaks.REPLACED),
                    own_wal=reason == breaks.CORRUPT,
                )
            except OSError as e:
                raise LedgerError(
                    f"the ledger {self.db_path} is {reason} and cannot be moved aside: {e}"
                ) from None
        self._db_file.id = None
        self._corrupt = None
        self._landed.clear()  # provisional ids that landed in the old chain name other rows now
        pending = self._spool.pending_break()
        old = breaks.old_head(self._head.read(), self._last_head)
        info = breaks.break_info(reason, self.db_path, moved_to, old, error, at)
        self._emit("error", "ledger_chain_break", again=pending is not None, **info)
        if pending is not None:
            return
        self.chain_break = info
        self._spool.queue(
            new_key(),
            breaks.break_record(info, ticket="chain-break-" + new_key()[:12]),
            row_id=None,
            provisional_id=None,
            op=CHAIN_BREAK_OP,
            error=None,
        )

    def _drop_writer(self) -> None:
        # After a failure the connection may carry a state (max_page_count, a broken WAL handle);
        # the next attempt starts afresh.
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None

"""The host's own ledger rows, as the mirror reads them: a read-only SQLite connection of its own.

The mirror never shares the writer's connection or lock: a read on WAL never blocks the writer (the
switch), and the writer never waits on the mirror.  A database that is not there (no switch yet) or
cannot be read reads as empty; the next cycle looks again.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from typing import Any

from gpushift.errors import LedgerError
from gpushift.ledger.breaks import file_id
from gpushift.ledger.chain import ROW_COLUMNS
from gpushift.ledger.reader import db_exists
from gpushift.ledger.schema import connect_reader, schema_version
from gpushift.values import Outcome

_COLS = ", ".join(ROW_COLUMNS)


class LocalRows:
    def __init__(self, db_path: str, timeout_s: float = 2.0) -> None:
        self.db_path = db_path
        self.timeout_s = timeout_s
        self._conn: sqlite3.Connection | None = None
        self._file: Any = None

    def _reader(self) -> sqlite3.Connection | None:
        """The connection, reopened when the path names another file (a new chain, a replaced file)."""
        try:
            now = file_id(self.db_path)
        except OSError:
            now = None
        if self._conn is not None and now != self._file:
            self.close()
        if self._conn is None:
            if not db_exists(self.db_path):
                return None
            conn = connect_reader(self.db_path, self.timeout_s)
            if schema_version(conn) < 2:  # no chain yet: the daemon migrates it at its first write
                conn.close()
                return None
            self._conn, self._file = conn, now
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None

    def _query(self, sql: str, args: Sequence[Any]) -> list[Any]:
        try:
            conn = self._reader()
            if conn is None:
                return []
            return conn.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            self.close()
            raise LedgerError(f"cannot read the ledger {self.db_path}: {e}") from None

    def head(self) -> tuple[int, str] | None:
        """(id, hash) of the newest row, or None when there is none."""
        rows = self._query("SELECT id, hash FROM switches ORDER BY id DESC LIMIT 1", ())
        return (int(rows[0][0]), str(rows[0][1])) if rows else None

    def first(self) -> dict[str, Any] | None:
        """Row 1 of the chain (its key names the chain), or None."""
        rows = self.rows_from(1, 1)
        return rows[0] if rows and rows[0]["id"] == 1 else None

    def rows_from(self, first_id: int, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit`` rows from ``first_id`` on, oldest first, every column by name."""
        sql = f"SELECT {_COLS} FROM switches WHERE id >= ? ORDER BY id LIMIT ?"
        return [dict(zip(ROW_COLUMNS, r, strict=True)) for r in self._query(sql, (first_id, limit))]

    def rows_between(self, first_id: int, last_id: int) -> list[dict[str, Any]]:
        sql = f"SELECT {_COLS} FROM switches WHERE id >= ? AND id <= ? ORDER BY id"
        return [dict(zip(ROW_COLUMNS, r, strict=True)) for r in self._query(sql, (first_id, last_id))]

    def pending_ids(self, ids: Sequence[int]) -> list[int]:
        """Which of ``ids`` are rows still ``pending``."""
        if not ids:
            return []
        marks = ", ".join("?" * len(ids))
        sql = f"SELECT id FROM switches WHERE outcome = ? AND id IN ({marks})"
        return sorted(int(r[0]) for r in self._query(sql, (Outcome.PENDING.value, *ids)))

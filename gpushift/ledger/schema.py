"""The ledger database: its SQL schema, the schema versions and migrations, and how it is opened.

Migrations run forward in one transaction at the writer's open (``MIGRATIONS[n]`` takes version n-1
to n); a reader never migrates, and a database written by a newer gpushift is never touched.  The
writer uses WAL, so that readers (``gpushift ledger``, read-only) never block it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable

from gpushift.errors import LedgerError
from gpushift.ledger.breaks import is_corrupt
from gpushift.ledger.chain import GENESIS_HASH, row_hash, select_chain_row
from gpushift.ledger.files import DIR_MODE, create_private_file
from gpushift.ledger.rows import new_key

#: The schema this code writes.  Older files migrate forward at the writer's open.
SCHEMA_VERSION = 2

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
            (new_key(), version, row_id),
        )
        values = select_chain_row(conn, row_id)
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
        rollback(conn)
        raise
    return old


def rollback(conn: sqlite3.Connection) -> None:
    """End a failed transaction, if SQLite has not ended it already."""
    # After SQLITE_FULL SQLite has already rolled back; an explicit ROLLBACK would then fail.
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


# --------------------------------------------------------------------------- connections


def connect_writer(
    db_path: str,
    timeout_s: float,
    group: str | None,
    hook: Callable[[sqlite3.Connection], None] | None = None,
) -> tuple[sqlite3.Connection, int]:
    """Open (creating it 0640 with its directory) and migrate the database; return it and the
    version it had.  ``hook`` sees the connection before the migration."""
    os.makedirs(os.path.dirname(os.path.abspath(db_path)), mode=DIR_MODE, exist_ok=True)
    create_private_file(db_path, group)
    conn = sqlite3.connect(db_path, timeout=timeout_s, isolation_level=None, check_same_thread=False)
    try:
        # WAL: `gpushift ledger` reads while the daemon writes.  FULL: a switch record is
        # worth an fsync per commit (a few per day).
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = FULL")
        if hook is not None:
            hook(conn)
        return conn, migrate(conn)
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.close()
        raise


def connect_reader(db_path: str, timeout_s: float) -> sqlite3.Connection:
    """Open the database read-only (it must exist).

    Raises:
        LedgerError: it cannot be opened.
    """
    uri = "file:" + _uri_path(os.path.abspath(db_path))
    try:
        return _open_checked(uri + "?mode=ro", timeout_s)
    except sqlite3.DatabaseError as e:
        if is_corrupt(e):
            raise LedgerError(not_a_database(db_path, e)) from None
    # A reader that may not create the -shm/-wal files next to the database (a group member,
    # the daemon not running, so SQLite removed them at its last close): with no WAL around,
    # the main file alone is the whole database, and immutable=1 reads it without them.
    try:
        return _open_checked(uri + "?mode=ro&immutable=1", timeout_s)
    except sqlite3.Error as e:
        if is_corrupt(e):
            raise LedgerError(not_a_database(db_path, e)) from None
        if os.path.exists(db_path) and not os.access(db_path, os.R_OK):
            raise LedgerError(f"cannot read the ledger {db_path}: permission denied") from None
        raise LedgerError(f"cannot open the ledger {db_path}: {e}") from None


def _open_checked(uri: str, timeout_s: float) -> sqlite3.Connection:
    """Open ``uri`` and read its schema (SQLite opens lazily); closed again when that fails."""
    conn = sqlite3.connect(uri, uri=True, timeout=timeout_s, check_same_thread=False)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn


def not_a_database(db_path: str, e: BaseException) -> str:
    """The one line for a ledger file SQLite cannot read as a database."""
    return (
        f"the ledger {db_path} is not a database ({e}); the daemon moves it aside and starts a new "
        f"chain when it next writes"
    )


def _uri_path(path: str) -> str:
    # The three characters that end or escape a path in an SQLite URI.
    return path.replace("%", "%25").replace("?", "%3f").replace("#", "%23")

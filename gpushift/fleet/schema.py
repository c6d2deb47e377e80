"""The central database's schema: created and migrated by gpushift itself, additive only.

``MIGRATIONS[n]`` takes the schema from version n-1 to n; each runs in one transaction under
``pg_advisory_xact_lock`` (:data:`LOCK_KEY`), so two hosts starting at once never migrate twice,
and is recorded in ``gpushift_schema`` (one row per version: when, by which gpushift).  A migration
only ever adds (tables, columns with defaults, indexes): a host running an older gpushift keeps
writing and reading a database a newer one has migrated, and an older gpushift never touches a
newer schema.  docs/fleet.md describes every table.
"""

from __future__ import annotations

from typing import Any

from gpushift import __version__
from gpushift.errors import FleetError

#: The schema this code writes; a database at a higher version is used as it is (additive only).
SCHEMA_VERSION = 1
#: ``pg_advisory_xact_lock`` key of the migrations: "gpushift" in ASCII, as a bigint.
LOCK_KEY = 0x67707573686966


_V1 = (
    """CREATE TABLE IF NOT EXISTS gpushift_hosts (
        host text PRIMARY KEY,
        machine_id text,
        gpushift_version text,
        first_seen timestamptz NOT NULL DEFAULT now(),
        last_seen timestamptz NOT NULL DEFAULT now()
    )""",
    "CREATE INDEX IF NOT EXISTS gpushift_hosts_machine_id ON gpushift_hosts (machine_id)",
    """CREATE TABLE IF NOT EXISTS gpushift_chains (
        host text NOT NULL,
        chain text NOT NULL,
        first_seen timestamptz NOT NULL DEFAULT now(),
        chain_break jsonb,
        PRIMARY KEY (host, chain)
    )""",
    """CREATE TABLE IF NOT EXISTS gpushift_ledger (
        host text NOT NULL,
        chain text NOT NULL,
        id bigint NOT NULL,
        seq bigserial NOT NULL,
        uuid text,
        prev_hash text NOT NULL,
        hash text NOT NULL,
        started_at timestamptz NOT NULL,
        finished_at timestamptz,
        trigger text,
        requested_by text,
        from_backend text,
        to_backend text,
        outcome text,
        gpushift_version text,
        record jsonb NOT NULL,
        chain_row text NOT NULL,
        mirrored_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz,
        PRIMARY KEY (host, chain, id)
    )""",
    # fleet ledger: newest first over every host, one host, one outcome (docs/fleet.md "Indexes").
    "CREATE INDEX IF NOT EXISTS gpushift_ledger_started ON gpushift_ledger (started_at DESC, host DESC, id DESC)",
    "CREATE INDEX IF NOT EXISTS gpushift_ledger_host ON gpushift_ledger (host, started_at DESC, id DESC)",
    "CREATE INDEX IF NOT EXISTS gpushift_ledger_outcome ON gpushift_ledger (outcome, started_at DESC)",
    """CREATE TABLE IF NOT EXISTS gpushift_host_state (
        host text PRIMARY KEY,
        updated_at timestamptz NOT NULL DEFAULT now(),
        state jsonb NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS gpushift_reports (
        seq bigserial PRIMARY KEY,
        host text NOT NULL,
        chain text,
        id bigint,
        kind text NOT NULL,
        what text NOT NULL,
        at timestamptz NOT NULL DEFAULT now()
    )""",
    "CREATE INDEX IF NOT EXISTS gpushift_reports_host ON gpushift_reports (host, seq DESC)",
)

#: ``MIGRATIONS[n]``: the statements that take the schema from version n-1 to n (only additions).
MIGRATIONS: dict[int, tuple[str, ...]] = {1: _V1}

_VERSION_TABLE = """CREATE TABLE IF NOT EXISTS gpushift_schema (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now(),
    applied_by text NOT NULL
)"""


def version(conn: Any) -> int:
    """The schema version of the database (0: none yet), read without a lock."""
    row = conn.execute("SELECT to_regclass('gpushift_schema') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return 0
    got = conn.execute("SELECT coalesce(max(version), 0) FROM gpushift_schema").fetchone()
    return int(got[0]) if got else 0


def ensure(conn: Any, target: int = SCHEMA_VERSION) -> int:
    """Bring the schema to ``target`` (under the advisory lock, one transaction); return the version
    it had.  A database already at or beyond ``target`` is not touched (not even locked).

    Raises:
        FleetError: the user may not create the tables (naming the database's error).
    """
    from gpushift.fleet.pg import DatabaseError

    try:
        old = version(conn)
        conn.commit()
        if old >= target:
            return old
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
            conn.execute(_VERSION_TABLE)
            old = version(conn)  # another host may have migrated while this one waited
            for n in range(old + 1, target + 1):
                for stmt in MIGRATIONS[n]:
                    conn.execute(stmt)
                conn.execute(
                    "INSERT INTO gpushift_schema (version, applied_by) VALUES (%s, %s)",
                    (n, f"gpushift {__version__}"),
                )
        return old
    except DatabaseError as e:
        from gpushift.fleet.db import one_line

        raise FleetError(f"cannot create or migrate the central schema: {one_line(e)}") from None

"""The mirror's statements against the central tables (``schema.py``): one host's writes.

Every method runs on the caller's open transaction (the mirror commits once per batch).  Rows are
written with ``INSERT ... ON CONFLICT (host, chain, id) DO NOTHING``: a row sent twice (a restart
between a commit and the position's write, two daemons by mistake) is one row.  An existing row is
changed only by :meth:`CentralStore.carry`, for the local changes ``compare.py`` recognises.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushift.fleet.central import QUERY_COLUMNS
from gpushift.ledger.rows import parse_dt

_INSERT_COLUMNS = (
    "host", "chain", "id", "uuid", "prev_hash", "hash", "started_at", "finished_at", "trigger",
    "requested_by", "from_backend", "to_backend", "outcome", "gpushift_version", "record", "chain_row",
)  # fmt: skip
_INSERT = (
    f"INSERT INTO gpushift_ledger ({', '.join(_INSERT_COLUMNS)}) VALUES "
    f"({', '.join('%s::jsonb' if c == 'record' else '%s' for c in _INSERT_COLUMNS)}) "
    "ON CONFLICT (host, chain, id) DO NOTHING"
)
_CARRIED = [c for c in _INSERT_COLUMNS if c not in ("host", "chain", "id")]
#: The ``timestamptz`` columns: central.py keeps them as ISO texts; the driver takes datetimes.
_TIMES = ("started_at", "finished_at")
_CARRY = (
    "UPDATE gpushift_ledger SET "
    + ", ".join(f"{c} = %s::jsonb" if c == "record" else f"{c} = %s" for c in _CARRIED)
    + ", updated_at = now() WHERE host = %s AND chain = %s AND id = %s"
)


@dataclass(frozen=True)
class CentralRow:
    id: int
    chain_row: str
    hash: str
    prev_hash: str
    record: Any
    columns: Mapping[str, Any]


class CentralStore:
    def __init__(self, conn: Any, host: str) -> None:
        self.conn = conn
        self.host = host

    def register(self, machine_id: str | None, version: str) -> list[str]:
        """This host in ``gpushift_hosts`` (its machine-id, version, last seen); returns the other
        hosts that recorded the same machine-id (cloned images)."""
        self.conn.execute(
            "INSERT INTO gpushift_hosts (host, machine_id, gpushift_version) VALUES (%s, %s, %s) "
            "ON CONFLICT (host) DO UPDATE SET machine_id = excluded.machine_id, "
            "gpushift_version = excluded.gpushift_version, last_seen = now()",
            (self.host, machine_id, version),
        )
        if not machine_id:
            return []
        rows = self.conn.execute(
            "SELECT host FROM gpushift_hosts WHERE machine_id = %s AND host <> %s ORDER BY host",
            (machine_id, self.host),
        ).fetchall()
        return [str(r[0]) for r in rows]

    def note_chain(self, chain: str, chain_break: Mapping[str, Any] | None) -> None:
        self.conn.execute(
            "INSERT INTO gpushift_chains (host, chain, chain_break) VALUES (%s, %s, %s::jsonb) "
            "ON CONFLICT (host, chain) DO NOTHING",
            (self.host, chain, json.dumps(chain_break) if chain_break is not None else None),
        )

    def rows(self, chain: str, first: int, last: int) -> dict[int, CentralRow]:
        """The central rows of ``chain`` with ids in [first, last], by id."""
        cols = ", ".join(QUERY_COLUMNS)
        cur = self.conn.execute(
            f"SELECT id, chain_row, hash, prev_hash, record, {cols} FROM gpushift_ledger "
            "WHERE host = %s AND chain = %s AND id BETWEEN %s AND %s",
            (self.host, chain, first, last),
        )
        out = {}
        for r in cur.fetchall():
            out[int(r[0])] = CentralRow(
                int(r[0]), str(r[1]), str(r[2]), str(r[3]), r[4], dict(zip(QUERY_COLUMNS, r[5:], strict=True))
            )
        return out

    def max_id(self, chain: str) -> int:
        row = self.conn.execute(
            "SELECT coalesce(max(id), 0) FROM gpushift_ledger WHERE host = %s AND chain = %s",
            (self.host, chain),
        ).fetchone()
        return int(row[0]) if row else 0

    def insert(self, rows: Iterable[Mapping[str, Any]]) -> None:
        batch = [tuple(_bound(r, c) for c in _INSERT_COLUMNS) for r in rows]
        if batch:
            self.conn.executemany(_INSERT, batch)

    def carry(self, values: Mapping[str, Any]) -> None:
        """Rewrite one central row with the host's newer version of it (a known local change)."""
        self.conn.execute(
            _CARRY, [*(_bound(values, c) for c in _CARRIED), values["host"], values["chain"], values["id"]]
        )

    def report(self, chain: str | None, row_id: int | None, kind: str, what: str) -> None:
        self.conn.execute(
            "INSERT INTO gpushift_reports (host, chain, id, kind, what) VALUES (%s, %s, %s, %s, %s)",
            (self.host, chain, row_id, kind, what),
        )

    def put_state(self, state: Mapping[str, Any]) -> None:
        self.conn.execute(
            "INSERT INTO gpushift_host_state (host, updated_at, state) VALUES (%s, now(), %s::jsonb) "
            "ON CONFLICT (host) DO UPDATE SET updated_at = now(), state = excluded.state",
            (self.host, json.dumps(state, default=str)),
        )


def _bound(values: Mapping[str, Any], column: str) -> Any:
    """One column's value as the driver binds it (a timestamp text as its datetime)."""
    v = values[column]
    if column in _TIMES and isinstance(v, str):
        return parse_dt(v)
    return v


def ids_missing(sent: Sequence[int], present: Iterable[int]) -> list[int]:
    """Which of ``sent`` the central table does not hold."""
    have = set(present)
    return [i for i in sent if i not in have]

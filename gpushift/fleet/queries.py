"""What ``gpushift fleet`` reads of the central database: hosts and their state, rows, chains.

Reads only: nothing is created, migrated or written (a database without gpushift's tables says so:
:data:`NO_TABLES`).
Every statement runs under the connection's ``statement_timeout`` (``db.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpushift.fleet.verify import Row

#: The columns ``fleet ledger`` shows (the record only with ``--json``).
LIST_COLUMNS = (
    "host", "chain", "id", "started_at", "finished_at", "trigger", "requested_by", "from_backend",
    "to_backend", "outcome",
)  # fmt: skip


#: What a command says when the database has none of gpushift's tables (its first statement fails
#: with ``undefined_table``: the commands do not spend round trips asking for the schema first).
NO_TABLES = "the central database holds no gpushift tables yet (no host has mirrored to it)"


def hosts(conn: Any) -> list[dict[str, Any]]:
    """Every host with its state row and the state's age by the database's clock (seconds)."""
    cur = conn.execute(
        "SELECT h.host, h.machine_id, h.gpushift_version, h.last_seen, s.updated_at, s.state, "
        "extract(epoch FROM now() - s.updated_at), "
        "(SELECT count(*) FROM gpushift_reports r WHERE r.host = h.host) "
        "FROM gpushift_hosts h LEFT JOIN gpushift_host_state s ON s.host = h.host ORDER BY h.host"
    )
    out = []
    for host, mid, version, last_seen, updated, state, age, reports in cur.fetchall():
        out.append({
            "host": host, "machine_id": mid, "gpushift_version": version, "last_seen": last_seen,
            "updated_at": updated, "age_s": float(age) if age is not None else None,
            "state": state if isinstance(state, dict) else {}, "reports": int(reports),
        })  # fmt: skip
    return out


def reports(conn: Any, limit: int = 20) -> list[dict[str, Any]]:
    cur = conn.execute(
        "SELECT host, chain, id, kind, what, at FROM gpushift_reports ORDER BY seq DESC LIMIT %s", (limit,)
    )
    keys = ("host", "chain", "id", "kind", "what", "at")
    return [dict(zip(keys, r, strict=True)) for r in cur.fetchall()]


def ledger(
    conn: Any,
    limit: int,
    host: str | None = None,
    since: datetime | None = None,
    outcome: str | None = None,
    with_record: bool = False,
) -> list[dict[str, Any]]:
    """The newest rows (by start, then host, then id) that match; with their record for ``--json``."""
    where: list[str] = []
    args: list[Any] = []
    if host is not None:
        where.append("host = %s")
        args.append(host)
    if since is not None:
        where.append("started_at >= %s")
        args.append(since)
    if outcome is not None:
        where.append("outcome = %s")
        args.append(outcome)
    cols = [*LIST_COLUMNS, *(["record"] if with_record else [])]
    sql = f"SELECT {', '.join(cols)} FROM gpushift_ledger"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY started_at DESC, host DESC, id DESC LIMIT %s"
    cur = conn.execute(sql, [*args, limit])
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def chains(conn: Any) -> list[tuple[str, str]]:
    """Every (host, chain) a mirror noted or that has rows, in order (a chain whose every row was
    deleted is still there)."""
    cur = conn.execute(
        "SELECT host, chain FROM gpushift_chains UNION SELECT DISTINCT host, chain FROM gpushift_ledger "
        "ORDER BY 1, 2"
    )
    return [(str(h), str(c)) for h, c in cur.fetchall()]


def chain_rows(conn: Any, host: str, chain: str, batch: int = 2000) -> Iterator[Row]:
    """One chain's rows in id order, ``batch`` at a time (bounded memory at any size)."""
    # Imported here: they bring the ledger's hash chain, which only ``fleet verify`` needs.
    from gpushift.fleet.central import QUERY_COLUMNS
    from gpushift.fleet.verify import Row

    cols = ", ".join(QUERY_COLUMNS)
    last = 0
    while True:
        cur = conn.execute(
            f"SELECT id, seq, prev_hash, hash, chain_row, record, {cols} FROM gpushift_ledger "
            "WHERE host = %s AND chain = %s AND id > %s ORDER BY id LIMIT %s",
            (host, chain, last, batch),
        )
        got = cur.fetchall()
        for r in got:
            yield Row(int(r[0]), int(r[1]), str(r[2]), str(r[3]), str(r[4]), r[5],
                      dict(zip(QUERY_COLUMNS, r[6:], strict=True)))  # fmt: skip
        if len(got) < batch:
            return
        last = int(got[-1][0])

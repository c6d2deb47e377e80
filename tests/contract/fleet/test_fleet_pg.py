"""The blocking connection over asyncpg (gpushift/fleet/pg.py) against a real PostgreSQL: the
transaction rules the mirror's batches rely on, JSON both ways, and errors as DatabaseError."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from gpushift.config.mirror import MirrorConfig
from gpushift.fleet import db
from gpushift.fleet.pg import Connection, DatabaseError
from tests.support.pgcluster import PgCluster


@pytest.fixture
def conn(pg: PgCluster, mirror_config: MirrorConfig) -> Iterator[Connection]:
    pg.sql("CREATE TABLE t (k int PRIMARY KEY, doc jsonb, at timestamptz)", db="fleet")
    pg.sql("ALTER TABLE t OWNER TO gs", db="fleet")
    c = db.connect(mirror_config)
    try:
        yield c
    finally:
        c.close()


def _count(pg: PgCluster) -> int:
    return int(pg.sql("SELECT count(*) FROM t", db="fleet")[0][0])


def test_a_statement_is_seen_by_others_only_after_commit(pg: PgCluster, conn: Connection) -> None:
    conn.execute("INSERT INTO t (k) VALUES (%s)", (1,))
    assert _count(pg) == 0  # the first statement opened a transaction
    conn.commit()
    assert _count(pg) == 1


def test_rollback_drops_what_the_transaction_did(pg: PgCluster, conn: Connection) -> None:
    conn.executemany("INSERT INTO t (k) VALUES (%s)", [(1,), (2,), (3,)])
    conn.rollback()
    conn.commit()
    assert _count(pg) == 0


def test_a_transaction_block_commits_whole_or_not_at_all(pg: PgCluster, conn: Connection) -> None:
    with conn.transaction():
        conn.execute("INSERT INTO t (k) VALUES (%s)", (1,))
    assert _count(pg) == 1
    with pytest.raises(DatabaseError, match="duplicate key"), conn.transaction():
        conn.execute("INSERT INTO t (k) VALUES (%s)", (2,))
        conn.execute("INSERT INTO t (k) VALUES (%s)", (1,))
    assert _count(pg) == 1  # 2 went with the failed block
    # Inside an open transaction a block is a savepoint: its failure keeps what came before.
    conn.execute("INSERT INTO t (k) VALUES (%s)", (5,))
    with pytest.raises(DatabaseError), conn.transaction():
        conn.execute("INSERT INTO t (k) VALUES (%s)", (5,))
    conn.commit()
    assert sorted(r[0] for r in pg.sql("SELECT k FROM t", db="fleet")) == [1, 5]


def test_json_goes_in_as_text_or_a_value_and_comes_back_parsed(conn: Connection) -> None:
    at = datetime(2026, 3, 1, 8, 0, tzinfo=timezone.utc)
    conn.execute("INSERT INTO t VALUES (%s, %s::jsonb, %s)", (1, '{"a": [1, "x"]}', at))
    conn.execute("INSERT INTO t VALUES (%s, %s, %s)", (2, {"b": None}, at))
    rows = conn.execute("SELECT k, doc, at FROM t ORDER BY k").fetchall()
    assert rows == [(1, {"a": [1, "x"]}, at), (2, {"b": None}, at)]


def test_a_closed_connection_or_a_server_error_is_a_database_error(
    pg: PgCluster, mirror_config: MirrorConfig
) -> None:
    c = db.connect(mirror_config)
    with pytest.raises(DatabaseError, match="does not exist"):
        c.execute("SELECT * FROM no_such_table")
    c.rollback()
    assert c.execute("SELECT %s::int + 1", (1,)).fetchone() == (2,)
    c.close()
    assert c.closed
    with pytest.raises(DatabaseError, match="closed"):
        c.execute("SELECT 1")
    # The server going away under an open connection.
    c = db.connect(mirror_config)
    pg.sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'gs'")
    with pytest.raises(DatabaseError):
        c.execute("SELECT 1")
    c.close()


def test_close_from_another_thread_ends_a_call_in_progress(mirror_config: MirrorConfig) -> None:
    # The daemon's stop closes the mirror's connection while the mirror's thread waits on the server.
    import threading

    c = db.connect(mirror_config)
    got: list[BaseException] = []

    def wait_long() -> None:
        try:
            c.execute("SELECT pg_sleep(60)")
        except BaseException as e:  # noqa: BLE001 - what the call ended with is the test's result
            got.append(e)

    t = threading.Thread(target=wait_long)
    t.start()
    deadline = 30.0
    for _ in range(300):  # until the statement is running on the server
        if c._loop.is_running():  # noqa: SLF001 - the call is in progress
            break
        t.join(0.1)
    c.close()
    t.join(deadline)
    assert not t.is_alive(), "the call went on after close()"
    assert got and isinstance(got[0], DatabaseError), got

"""The private PostgreSQL cluster of the fleet tests: never the system's, always stopped again."""

from __future__ import annotations

import os

import pytest

from tests.support import pgcluster
from tests.support.pgcluster import PgCluster, PgMissing, private_cluster


def test_a_private_cluster_on_its_own_port_and_socket(pg: PgCluster) -> None:
    assert pg.port != 5432
    assert str(pg.base) in pg.sql("SHOW data_directory")[0][0]
    assert pg.sql("SHOW unix_socket_directories")[0][0] == str(pg.sock)
    assert pg.sql("SHOW listen_addresses")[0][0] == "127.0.0.1"
    # It runs as an unprivileged user (initdb refuses root).
    owner = os.stat(pg.data).st_uid
    assert owner != 0


def test_a_role_with_a_password_logs_in_over_loopback(pg: PgCluster) -> None:
    from gpushift.fleet.pg import Connection, DatabaseError

    url = pg.make_db("fleet", "gs", "s3cret-pw")
    with Connection.open(dsn=url, password="s3cret-pw", timeout=10) as conn:
        assert conn.execute("SELECT current_user, current_database()").fetchone() == ("gs", "fleet")
    with pytest.raises(DatabaseError, match="password authentication failed"):
        Connection.open(dsn=url, password="wrong", timeout=10)


def test_stopped_and_started_again_keeps_its_data(pg: PgCluster) -> None:
    pg.sql("CREATE TABLE kept (x int)")
    pg.sql("INSERT INTO kept VALUES (7)")
    pg.stop_server()
    assert not pg.running
    pg.start()
    assert pg.sql("SELECT x FROM kept") == [(7,)]


def test_stopped_and_removed_even_when_the_test_fails() -> None:
    seen: dict[str, object] = {}
    with pytest.raises(RuntimeError, match="the test failed"), private_cluster() as cluster:
        seen["base"] = cluster.base
        seen["pid"] = cluster._postmaster
        assert cluster.running
        raise RuntimeError("the test failed")
    assert not os.path.exists(str(seen["base"]))
    pid = seen["pid"]
    assert isinstance(pid, tuple)
    assert not pgcluster.alive(*pid)


def test_missing_binaries_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pgcluster, "PG_BIN_GLOB", "/nonexistent/postgresql/*/bin")
    with pytest.raises(PgMissing, match=r"/usr/lib/postgresql/15/bin/initdb.*apt-get install postgresql"):
        PgCluster()

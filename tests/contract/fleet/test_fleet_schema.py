"""The central schema against a real PostgreSQL: created, versioned, migrated once under the lock."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from gpushift.config.mirror import MirrorConfig
from gpushift.errors import FleetError
from gpushift.fleet import db, schema
from tests.support.pgcluster import PgCluster

PASSWORD = "pw-of-the-fleet-9f3a"


def mirror_for(pg: PgCluster, tmp_path: Any, **kw: Any) -> MirrorConfig:
    url = pg.make_db("fleet", "gs", PASSWORD)
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD + "\n")
    return MirrorConfig(url=url, password_file=str(pw), **kw)


def test_the_schema_is_created_with_its_version_and_indexes(pg: PgCluster, tmp_path: Any) -> None:
    m = mirror_for(pg, tmp_path)
    with db.connect(m) as conn:
        assert schema.ensure(conn) == 0
        conn.commit()
        assert schema.version(conn) == schema.SCHEMA_VERSION
        assert schema.ensure(conn) == schema.SCHEMA_VERSION  # the second time: nothing to do
    tables = {r[0] for r in pg.sql("SELECT tablename FROM pg_tables WHERE schemaname = 'public'", db="fleet")}
    assert {"gpushift_schema", "gpushift_hosts", "gpushift_chains", "gpushift_ledger",
            "gpushift_host_state", "gpushift_reports"} <= tables  # fmt: skip
    indexes = {
        r[0]
        for r in pg.sql("SELECT indexname FROM pg_indexes WHERE tablename = 'gpushift_ledger'", db="fleet")
    }
    assert {"gpushift_ledger_started", "gpushift_ledger_host", "gpushift_ledger_outcome"} <= indexes
    rows = pg.sql("SELECT version, applied_by FROM gpushift_schema", db="fleet")
    assert rows == [(1, rows[0][1])] and rows[0][1].startswith("gpushift ")


def test_two_hosts_migrating_at_once_migrate_once(pg: PgCluster, tmp_path: Any) -> None:
    m = mirror_for(pg, tmp_path)
    results: list[int] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            with db.connect(m) as conn:
                results.append(schema.ensure(conn))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sorted(results) == [0, 1, 1, 1]
    assert pg.sql("SELECT count(*) FROM gpushift_schema", db="fleet") == [(1,)]


def test_a_newer_schema_is_used_as_it_is(pg: PgCluster, tmp_path: Any) -> None:
    m = mirror_for(pg, tmp_path)
    with db.connect(m) as conn:
        schema.ensure(conn)
        conn.commit()
    pg.sql("INSERT INTO gpushift_schema (version, applied_by) VALUES (7, 'gpushift 99')", db="fleet")
    with db.connect(m) as conn:
        assert schema.ensure(conn) == 7  # an older gpushift never migrates (or downgrades) it


def test_every_connection_has_its_deadlines(pg: PgCluster, tmp_path: Any) -> None:
    m = mirror_for(pg, tmp_path, statement_timeout_s=0.25, connect_timeout_s=3)
    with db.connect(m) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "250ms"
        assert conn.execute("SHOW lock_timeout").fetchone()[0] == "250ms"
        assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0] == "1500ms"
        with pytest.raises(db.DatabaseError, match="statement timeout"):
            conn.execute("SELECT pg_sleep(5)")


def test_a_server_that_accepts_but_never_answers_fails_at_the_connect_deadline(tmp_path: Any) -> None:
    # A listening socket that never says a word: the login cannot finish, so only the connect
    # deadline (connect_timeout_s = 2) ends the wait.
    import socket
    import time

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    try:
        (tmp_path / "pw").write_text(PASSWORD)
        m = MirrorConfig(
            url=f"postgresql://gs@127.0.0.1:{silent.getsockname()[1]}/fleet?sslmode=disable",
            password_file=str(tmp_path / "pw"),
            connect_timeout_s=2,
        )
        t0 = time.monotonic()
        with pytest.raises(FleetError, match="cannot reach the central database") as e:
            db.connect(m)
        assert time.monotonic() - t0 < 60, "the connect deadline did not end the wait"
        assert PASSWORD not in str(e.value)
    finally:
        silent.close()


def test_an_unreachable_or_refusing_server_is_one_line_without_the_password(
    pg: PgCluster, tmp_path: Any
) -> None:
    m = mirror_for(pg, tmp_path)
    (tmp_path / "wrong").write_text("not-" + PASSWORD)
    wrong = MirrorConfig(url=m.url, password_file=str(tmp_path / "wrong"))
    with pytest.raises(
        FleetError, match=r"cannot reach the central database gs@127\.0\.0\.1:\d+/fleet: "
    ) as e:
        db.connect(wrong)
    assert PASSWORD not in str(e.value) and "\n" not in str(e.value)
    pg.stop_server()
    with pytest.raises(FleetError, match="cannot reach the central database") as e:
        db.connect(m)
    assert PASSWORD not in str(e.value)


def test_the_password_comes_from_a_systemd_credential(
    pg: PgCluster, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = mirror_for(pg, tmp_path)
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "mirror.password").write_text(PASSWORD)
    cm = MirrorConfig(url=m.url, password_credential="mirror.password")
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    with pytest.raises(
        FleetError, match=r"CREDENTIALS_DIRECTORY is not set .*LoadCredential=mirror\.password:"
    ):
        db.connect(cm)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    with db.connect(cm) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("gs",)

"""Contract tests of the ledger's schema versions: a version 1 file migrates (and joins the chain), a
reader never migrates, a newer file is never touched.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from ledger_support import Log, finish, make_record, spool_files

from gpushift.ledger import SqliteLedger
from gpushift.ledger.schema import SCHEMA_VERSION, migrate


def test_ledger_migrates_a_version_1_database(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    db.parent.mkdir(parents=True)
    old = make_record(1)
    old.id = 1
    old.outcome = "ok"
    conn = sqlite3.connect(db, isolation_level=None)
    migrate(conn, target=1)
    d = old.to_dict()
    conn.execute(
        "INSERT INTO switches (id, ticket, started_at, trigger, requested_by, uid, reason, from_backend, "
        "to_backend, outcome, record) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            old.ticket,
            d["started_at"],
            old.trigger,
            old.requested_by,
            old.uid,
            old.reason,
            "vllm",
            "llama",
            "ok",
            json.dumps(d),
        ),
    )
    conn.close()

    log = Log()
    led = SqliteLedger(db, run, log=log)
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    assert log.events("ledger_migrated")[0]["from_version"] == 1
    got = led.get(1)
    assert got is not None and got.reason == "switch number 1" and got.outcome == "ok"
    assert led.verify().ok  # the old row joined the chain, and the head file was written
    new = make_record(2)
    assert led.begin(new) == 2
    finish(led, new)
    assert led.verify().ok


def test_ledger_read_only_view_of_a_version_1_database_lists_rows(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db, isolation_level=None)
    migrate(conn, target=1)
    d = make_record(1).to_dict()
    conn.execute(
        "INSERT INTO switches (id, started_at, trigger, requested_by, reason, to_backend, outcome, record) "
        "VALUES (1, ?, 'manual', 'alice', 'x', 'llama', 'ok', ?)",
        (d["started_at"], json.dumps(d)),
    )
    conn.close()
    reader = SqliteLedger.open_readonly(db, run)
    assert [r.id for r in reader.list()] == [1]
    res = reader.verify()
    assert not res.ok and "schema version 1" in (res.problem or "")
    with sqlite3.connect(db) as c:  # the reader migrated nothing
        assert c.execute("SELECT version FROM schema_version").fetchone()[0] == 1


def test_ledger_newer_schema_is_not_touched_and_records_are_kept(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    db.parent.mkdir(parents=True)
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        c.execute("INSERT INTO schema_version VALUES (99)")
    led = SqliteLedger(db, run, log=Log())
    rec = make_record(1)
    assert led.begin(rec) < 0  # not written into a schema it does not know; kept in the spool
    assert "newer" in led.health()["error"] and len(spool_files(run)) == 1

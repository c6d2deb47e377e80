"""Contract tests of the ledger's hash chain and head file: every edit made outside gpushift is named
by ``verify``, a forged chain is caught by the head, the head names the row just written (so removing
the newest row is caught), and rewrites re-link only an intact chain.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from ledger_support import Log, finish, make_record, rows, sqlite3_tool

from gpushift.ledger import SqliteLedger, VerifyResult
from gpushift.ledger.chain import CHAIN_COLUMNS, GENESIS_HASH, row_hash


def _five_rows(db: Path, run: Path, log: Log | None = None) -> SqliteLedger:
    led = SqliteLedger(db, run, log=log or Log())
    for i in range(1, 6):
        rec = make_record(i)
        led.begin(rec)
        finish(led, rec)
    assert led.verify().ok
    return led


def _verify_after_edit(ledger_paths: tuple[Path, Path], sql: str) -> VerifyResult:
    """Five rows, then ``sql`` run with the sqlite3 tool, then ``verify``."""
    db, run = ledger_paths
    led = _five_rows(db, run)
    sqlite3_tool(db, sql)
    return led.verify()


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE switches SET reason = 'nothing to see' WHERE id = 2",
        "UPDATE switches SET outcome = 'refused' WHERE id = 2",
        "UPDATE switches SET uid = 0 WHERE id = 2",
        "UPDATE switches SET started_at = '2024-01-01T00:00:00.000000Z' WHERE id = 2",
        "UPDATE switches SET record = replace(record, 'b4100', 'b9999') WHERE id = 2",
        "UPDATE switches SET backend_version = NULL WHERE id = 2",
        "UPDATE switches SET hash = '" + "a" * 64 + "' WHERE id = 2",
    ],
)
def test_ledger_verify_names_the_row_edited_with_sqlite3_tool(
    ledger_paths: tuple[Path, Path], sql: str
) -> None:
    res = _verify_after_edit(ledger_paths, sql)
    assert not res.ok
    assert res.first_bad_id == 2, res.problem
    assert "row 2" in (res.problem or "")


def _recompute_chain(db: Path) -> None:
    """What a careful forger does after an edit: recompute every hash in order."""
    with sqlite3.connect(db) as c:
        prev = GENESIS_HASH
        cols = ", ".join(CHAIN_COLUMNS)
        for row in c.execute(f"SELECT {cols} FROM switches ORDER BY id").fetchall():
            values = dict(zip(CHAIN_COLUMNS, row, strict=True))
            values["prev_hash"] = prev
            prev = row_hash(values)
            c.execute(
                "UPDATE switches SET prev_hash = ?, hash = ? WHERE id = ?",
                (values["prev_hash"], prev, values["id"]),
            )


def test_ledger_verify_catches_an_edit_with_every_hash_recomputed(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    log = Log()
    led = _five_rows(db, run, log)
    true_head = json.loads(Path(led.head_path).read_text())
    sqlite3_tool(db, "UPDATE switches SET reason = 'approved by the boss' WHERE id = 2")
    _recompute_chain(db)
    res = led.verify()
    assert not res.ok
    assert res.first_bad_id is None  # every row is self-consistent now...
    assert "head file" in (res.problem or "")  # ...but the chain no longer ends where it did
    # The log line of each write carries the head too (the journal keeps it beyond the host).
    head_line = log.events("ledger_written")[-1]
    assert (head_line["head_id"], head_line["head_hash"]) == (5, true_head["hash"])
    assert res.head["hash"] != true_head["hash"]


def test_ledger_next_write_after_forgery_keeps_the_alarm(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led = _five_rows(db, run)
    led.close()
    sqlite3_tool(db, "UPDATE switches SET reason = 'approved by the boss' WHERE id = 2")
    _recompute_chain(db)
    log = Log()
    daemon = SqliteLedger(db, run, log=log)  # the daemon writes again: it must not bless the forgery
    rec = make_record(6)
    daemon.begin(rec)
    finish(daemon, rec)
    assert log.events("ledger_tamper_alarm")
    assert daemon.health()["alarm"]
    res = daemon.verify()
    assert not res.ok and "alarm" in (res.problem or "")


def test_ledger_verify_catches_removed_newest_row(ledger_paths: tuple[Path, Path]) -> None:
    res = _verify_after_edit(ledger_paths, "DELETE FROM switches WHERE id = 5")
    assert not res.ok and "head file names row 5" in (res.problem or "")


def test_ledger_verify_catches_removed_middle_row(ledger_paths: tuple[Path, Path]) -> None:
    res = _verify_after_edit(ledger_paths, "DELETE FROM switches WHERE id = 3")
    assert not res.ok and res.first_bad_id == 4


def test_ledger_head_ahead_of_database_after_cut_off_write_is_accepted(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    led = _five_rows(db, run)
    head = json.loads(Path(led.head_path).read_text())
    # The daemon wrote the new head, then died before its COMMIT.
    Path(led.head_path).write_text(
        json.dumps({"id": 6, "hash": "f" * 64, "prev": {"id": 5, "hash": head["hash"]}})
    )
    assert led.verify().ok
    led.close()
    restarted = SqliteLedger(db, run, log=Log())
    assert json.loads(Path(restarted.head_path).read_text())["id"] == 5  # settled at open
    assert restarted.verify().ok and not restarted.health()["alarm"]


def test_ledger_rewriting_an_older_row_relinks_the_chain(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led = SqliteLedger(db, run, log=Log())
    a, b = make_record(1), make_record(2)
    led.begin(a)
    led.begin(b)  # a is no longer the newest row when it finishes
    finish(led, a)
    finish(led, b, "failed")
    assert rows(db) == [(1, "ticket-1", "ok"), (2, "ticket-2", "failed")]
    assert led.verify().ok


def test_ledger_rewrite_does_not_relink_over_an_edit(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    log = Log()
    led = SqliteLedger(db, run, log=log)
    a, b = make_record(1), make_record(2)
    led.begin(a)
    led.begin(b)
    sqlite3_tool(db, "UPDATE switches SET reason = 'edited' WHERE id = 2")
    finish(led, a)  # rewriting row 1 must not re-hash the edited row 2 into a valid chain
    res = led.verify()
    assert not res.ok
    assert log.events("ledger_tamper_alarm")


# --------------------------------------------------------------------------- the head after a write


def _head(led: SqliteLedger) -> dict:
    return dict(json.loads(Path(led.head_path).read_text()))


def test_ledger_head_names_the_row_just_written(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led = _five_rows(db, run)
    led.begin(make_record(6))  # an insert
    head = _head(led)
    assert head["id"] == 6 and "prev" not in head
    with sqlite3.connect(db) as c:
        assert head["hash"] == c.execute("SELECT hash FROM switches WHERE id = 6").fetchone()[0]


def test_ledger_newest_row_deleted_after_its_insert_fails_verify(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led = _five_rows(db, run)
    led.begin(make_record(6))  # an insert, completed: row 6
    led.close()
    sqlite3_tool(db, "DELETE FROM switches WHERE id = 6")
    res = SqliteLedger.open_readonly(db, run).verify()
    assert not res.ok and "rows missing after row 5" in (res.problem or "")
    assert "not recorded by the daemon" in res.describe()
    log = Log()
    SqliteLedger(db, run, log=log).begin(make_record(9))  # the next writer raises the alarm too
    assert log.events("ledger_tamper_alarm")


def test_ledger_cut_off_between_commit_and_naming_the_head_alone_is_accepted(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    led = _five_rows(db, run)
    led.begin(make_record(6))
    head = _head(led)
    led.close()
    with sqlite3.connect(db) as c:
        prev_hash = c.execute("SELECT hash FROM switches WHERE id = 5").fetchone()[0]
    # The commit of row 6 happened; the daemon died before it named the head alone.
    Path(led.head_path).write_text(
        json.dumps({"id": 6, "hash": head["hash"], "prev": {"id": 5, "hash": prev_hash}})
    )
    assert SqliteLedger.open_readonly(db, run).verify().ok
    reopened = SqliteLedger(db, run, log=Log())
    assert "prev" not in _head(reopened) and _head(reopened)["id"] == 6  # settled at open
    assert reopened.verify().ok and not reopened.health()["alarm"]

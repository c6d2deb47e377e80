"""Contract tests of a ledger that degrades but never stops the switching, on real SQLite files: a
file that is not a database, a database deleted or replaced under a live writer, a read-only
directory and a full disk (a real tiny tmpfs).  (The spool's bound: test_ledger_spool.py; the head
that names the newest row: test_ledger_chain.py.)
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest
from ledger_support import (
    GARBAGE,
    Disk,
    Log,
    TinyFs,
    chain_rows,
    finish,
    head_of,
    make_record,
    put_garbage,
    rows,
    spool_files,
    sqlite3_tool,
    tiny_fs,
    with_finished_row,
)

from gpushift.ledger import GENESIS_HASH, SqliteLedger


def three_rows(db: Path, run: Path, log: Log | None = None) -> SqliteLedger:
    led = SqliteLedger(db, run, log=log or Log())
    for i in range(3):
        rec = make_record(i)
        led.begin(rec)
        finish(led, rec)
    return led


def closed_with_three_rows(db: Path, run: Path) -> dict:
    """Three finished rows, the writer closed (the daemon stopped); returns the head file."""
    three_rows(db, run).close()
    return dict(json.loads((db.parent / "ledger.head").read_text()))


def switch_while_degraded(led: SqliteLedger, i: int) -> dict:
    """A switch's two writes while the database takes none: both go to the spool, and the switch
    is never refused for it.  Returns the ledger's health then."""
    rec = make_record(i)
    assert led.begin(rec) < 0
    finish(led, rec)
    h = led.health()
    assert h["state"] == "degraded" and h["pending"] >= 1, h
    return dict(h)


def garbage_after_three_rows(db: Path, run: Path) -> tuple[Path, dict]:
    """Three rows, the daemon stopped, then ``ledger.db`` is garbage; returns it and the head file."""
    old = closed_with_three_rows(db, run)
    put_garbage(db)
    return db, old


def root_page(db: Path, name: str) -> int:
    """The first page of a table or an index."""
    with sqlite3.connect(db) as c:
        return int(c.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0])


def moved_files(db: Path, kind: str) -> list[Path]:
    return sorted(p for p in db.parent.glob(f"ledger.db.{kind}-*") if not p.name.endswith(("-wal", "-shm")))


def assert_new_chain(db: Path, reason: str, old_head: dict | None) -> dict:
    """Row 1 starts a new chain and records the break; return its ``chain_break``."""
    first = chain_rows(db)[0]
    assert first["id"] == 1 and first["outcome"] == "chain_break" and first["prev_hash"] == GENESIS_HASH
    assert first["record"]["trigger"] == "recovery" and first["record"]["to"] == ""
    brk = first["record"]["extra"]["chain_break"]
    assert brk["reason"] == reason and datetime.fromisoformat(brk["at"]).tzinfo is not None
    if old_head is None:
        assert brk["old_head"] is None
    else:
        assert (brk["old_head"]["id"], brk["old_head"]["hash"]) == (old_head["id"], old_head["hash"])
    return dict(brk)


# --------------------------------------------------------------------------- not a database


def test_ledger_not_a_database_at_open_is_moved_aside_and_the_new_chain_records_it(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    three_rows(db, run).close()
    old = head_of(SqliteLedger.open_readonly(db, run))
    put_garbage(db)
    log = Log()
    led = SqliteLedger(db, run, log=log)  # the daemon's start: must not raise
    (moved,) = moved_files(db, "corrupt")
    assert moved.read_bytes() == GARBAGE  # kept for a person
    brk = assert_new_chain(db, "corrupt", old)
    assert brk["moved_to"] == str(moved) and "not a database" in brk["error"]
    assert log.events("ledger_chain_break")[0]["moved_to"] == str(moved)
    rec = make_record(7)
    assert led.begin(rec) == 2  # switching goes on, in the new chain
    finish(led, rec)
    assert [(r["id"], r["ticket"]) for r in chain_rows(db)][1:] == [(2, "ticket-7")]
    h = led.health()
    assert h["state"] == "ok" and h["chain_break"]["reason"] == "corrupt"
    assert led.last() is not None and led.last().ticket == "ticket-7"  # type: ignore[union-attr]
    res = led.verify()
    assert not res.ok and res.problem is None and [b["row"] for b in res.breaks] == [1]
    assert "recorded by the daemon at row 1" in res.describe() and str(moved) in res.describe()


def overwrite_page(db: Path, page_no: int) -> None:
    """Garbage over one page of the database file (pages count from 1)."""
    with sqlite3.connect(db) as c:
        size = int(c.execute("PRAGMA page_size").fetchone()[0])
    with open(db, "r+b") as f:
        f.seek((page_no - 1) * size)
        f.write(b"\xa5" * size)


def test_ledger_malformed_database_is_moved_aside_too(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    old = closed_with_three_rows(db, run)
    with sqlite3.connect(db) as c:
        pages = int(c.execute("PRAGMA page_count").fetchone()[0])
    for n in range(2, pages + 1):  # the header page intact, every other page garbage
        overwrite_page(db, n)
    led = SqliteLedger(db, run, log=Log())
    assert len(moved_files(db, "corrupt")) == 1
    assert "malformed" in assert_new_chain(db, "corrupt", old)["error"]
    assert led.begin(make_record(9)) == 2


def test_ledger_corrupt_table_found_by_a_write_breaks_and_the_write_lands(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    old = closed_with_three_rows(db, run)
    overwrite_page(db, root_page(db, "switches"))  # the schema reads fine; the rows do not
    rec = make_record(5)
    led = SqliteLedger(db, run, log=Log())
    assert led.begin(rec) == 2
    finish(led, rec)
    assert_new_chain(db, "corrupt", old)
    assert [(r["ticket"], r["outcome"]) for r in chain_rows(db)][1:] == [("ticket-5", "ok")]


def test_ledger_corrupt_index_found_inside_a_write_breaks_and_the_write_lands(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    old = closed_with_three_rows(db, run)
    root = root_page(db, "switches_uuid")
    led = SqliteLedger(db, run, log=Log())  # opens fine: the head is read through the table
    overwrite_page(db, root)  # the write looks its key up in this index
    rec = make_record(5)
    assert led.begin(rec) == 2  # the write found it, the new chain took it at once
    assert_new_chain(db, "corrupt", old)
    assert [r["ticket"] for r in chain_rows(db)][1:] == ["ticket-5"]


def test_ledger_garbage_with_no_head_file_starts_a_chain_with_no_old_head(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    db.parent.mkdir(parents=True)
    db.write_bytes(GARBAGE)
    led = SqliteLedger(db, run, log=Log())
    assert_new_chain(db, "corrupt", None)
    assert led.begin(make_record(1)) == 2


# --------------------------------------------------------------------------- deleted, replaced


def test_ledger_deleted_under_a_live_writer_next_row_lands_in_a_new_chain(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    log = Log()
    led = three_rows(db, run, log)
    old = head_of(led)
    db.unlink()  # the -wal and -shm stay, as after `rm ledger.db`
    rec = make_record(4)
    assert led.begin(rec) == 2
    finish(led, rec)
    assert_new_chain(db, "deleted", old)
    assert [(r["id"], r["ticket"], r["outcome"]) for r in chain_rows(db)][1:] == [(2, "ticket-4", "ok")]
    assert led.get(2) is not None and led.get(2).ticket == "ticket-4"  # type: ignore[union-attr]
    assert led.health()["chain_break"]["reason"] == "deleted"
    res = led.verify()
    assert not res.ok and res.breaks and "deleted" in res.describe()


def test_ledger_deleted_in_the_middle_of_a_switch_its_finish_lands_whole(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    led = three_rows(db, run)
    rec = make_record(4)
    assert led.begin(rec) == 4  # the intent row, in the old file
    old = head_of(led)
    db.unlink()
    finish(led, rec)  # the finished record lands in the new chain, complete
    assert_new_chain(db, "deleted", old)
    assert [(r["id"], r["ticket"], r["outcome"]) for r in chain_rows(db)][1:] == [(2, "ticket-4", "ok")]
    assert rec.id == 2
    assert chain_rows(db)[1]["record"]["backend_version"] == "b4100"


def test_ledger_deleted_with_its_wal_under_a_live_writer(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led = three_rows(db, run)
    old = head_of(led)
    for p in db.parent.glob("ledger.db*"):
        p.unlink()
    assert led.begin(make_record(4)) == 2
    assert_new_chain(db, "deleted", old)


def test_ledger_deleted_under_an_idle_writer_is_noticed_by_the_periodic_flush(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    led = three_rows(db, run)
    old = head_of(led)
    db.unlink()
    assert led.flush_pending() == 1  # what the daemon calls every reconcile interval
    assert_new_chain(db, "deleted", old)
    assert head_of(led)["id"] == 1 and "prev" not in head_of(led)


def test_ledger_replaced_under_a_live_writer_is_moved_aside_and_recorded(
    ledger_paths: tuple[Path, Path], tmp_path: Path
) -> None:
    db, run = ledger_paths
    led = three_rows(db, run)
    old = head_of(led)
    # Somebody puts another database in its place (an old copy, say).
    other = tmp_path / "other.db"
    SqliteLedger(other, tmp_path / "other-run", log=Log()).close()
    os.replace(other, db)
    assert led.begin(make_record(4)) == 2
    (moved,) = moved_files(db, "replaced")
    brk = assert_new_chain(db, "replaced", old)
    assert brk["moved_to"] == str(moved)
    with sqlite3.connect(moved) as c:  # the replacement is kept as it was
        assert c.execute("SELECT count(*) FROM switches").fetchone()[0] == 0


def test_ledger_deleted_while_the_daemon_was_down_is_a_missing_break(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led = three_rows(db, run)
    old = head_of(led)
    led.close()
    db.unlink()
    SqliteLedger(db, run, log=Log())
    assert_new_chain(db, "missing", old)


def test_ledger_every_row_deleted_from_a_database_that_is_there_is_an_edit_not_a_break(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    closed_with_three_rows(db, run)
    sqlite3_tool(db, "DELETE FROM switches")  # the file stays: nothing for the daemon to record
    log = Log()
    led = SqliteLedger(db, run, log=log)
    assert not log.events("ledger_chain_break") and log.events("ledger_tamper_alarm")
    res = led.verify()
    assert not res.ok and not res.breaks and "not recorded by the daemon" in res.describe()
    assert "rows missing after row 0" in res.describe()


def test_ledger_reader_of_a_live_writer_follows_the_new_chain(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led = three_rows(db, run)
    assert led.last() is not None and led.last().ticket == "ticket-2"  # type: ignore[union-attr]
    db.unlink()
    led.begin(make_record(8))
    last = led.last()
    assert last is not None and last.ticket == "ticket-8" and last.id == 2


# --------------------------------------------------------------------------- read-only, full disk


@pytest.fixture
def state_fs(tmp_path: Path) -> Iterator[TinyFs]:
    with tiny_fs(tmp_path / "state", "1m") as fs:
        yield fs


def test_ledger_read_only_directory_spools_then_lands(state_fs: TinyFs, tmp_path: Path) -> None:
    db, run = state_fs.path / "ledger.db", tmp_path / "run"
    led = with_finished_row(db, run, 0)
    led.close()  # a filesystem with files open for writing cannot be remounted read-only
    state_fs.remount(read_only=True)
    assert "read-only" in switch_while_degraded(led, 1)["reason"]
    state_fs.remount(read_only=False)
    assert led.flush_pending() == 1
    assert rows(db) == [(1, "ticket-0", "ok"), (2, "ticket-1", "ok")]
    assert led.health()["state"] == "ok" and led.verify().ok


def test_ledger_not_a_database_in_a_read_only_directory_waits_then_breaks(
    state_fs: TinyFs, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    db, old = garbage_after_three_rows(state_fs.path / "ledger.db", run)
    state_fs.remount(read_only=True)
    led = SqliteLedger(db, run, log=Log())  # cannot move it aside: degraded, never raises
    assert "cannot be moved aside" in switch_while_degraded(led, 5)["reason"]
    assert moved_files(db, "corrupt") == [] and db.read_bytes() == GARBAGE
    state_fs.remount(read_only=False)
    led.flush_pending()
    assert len(moved_files(db, "corrupt")) == 1
    assert_new_chain(db, "corrupt", old)
    assert [(r["ticket"], r["outcome"]) for r in chain_rows(db)][1:] == [("ticket-5", "ok")]
    assert led.health()["state"] == "ok"


def test_ledger_full_disk_spools_then_lands(state_fs: TinyFs, tmp_path: Path) -> None:
    db, run = state_fs.path / "ledger.db", tmp_path / "run"
    led = with_finished_row(db, run, 0)
    filler = state_fs.fill()
    assert "disk full" in switch_while_degraded(led, 1)["reason"]
    filler.unlink()
    assert led.flush_pending() == 1
    assert rows(db) == [(1, "ticket-0", "ok"), (2, "ticket-1", "ok")] and led.verify().ok


def test_ledger_not_a_database_on_a_full_disk_breaks_once_space_is_back(
    state_fs: TinyFs, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    db, old = garbage_after_three_rows(state_fs.path / "ledger.db", run)
    filler = state_fs.fill()
    log = Log()
    led = SqliteLedger(db, run, log=log)  # moved aside (a rename needs no space), no room for a new one
    switch_while_degraded(led, 5)
    assert len(moved_files(db, "corrupt")) == 1
    filler.unlink()
    led.flush_pending()
    assert_new_chain(db, "corrupt", old)
    assert [(r["ticket"], r["outcome"]) for r in chain_rows(db)][1:] == [("ticket-5", "ok")]
    assert len(log.events("ledger_chain_break")) == 1


def test_ledger_break_waiting_to_land_survives_a_restart_and_is_not_doubled(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    three_rows(db, run).close()
    put_garbage(db)
    disk = Disk()
    disk.pages = 1  # the new database cannot even hold its schema: the break waits in the spool
    led = SqliteLedger(db, run, log=Log(), connect_hook=disk)
    rec = make_record(5)
    led.begin(rec)
    assert len(spool_files(run)) == 2 and led.health()["state"] == "degraded"
    led.close()  # the daemon dies; it restarts with space
    log = Log()
    SqliteLedger(db, run, log=log)
    assert [r["outcome"] for r in chain_rows(db)] == ["chain_break", "pending"]
    assert not log.events("ledger_chain_break") and spool_files(run) == []


# --------------------------------------------------------------------------- the tamper alarm


def test_ledger_break_keeps_a_standing_tamper_alarm(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    three_rows(db, run).close()
    head_path = db.parent / "ledger.head"
    head = json.loads(head_path.read_text())
    head["alarm"] = {"at": datetime.now(timezone.utc).isoformat(), "what": "found earlier"}
    head_path.write_text(json.dumps(head))
    put_garbage(db)
    led = SqliteLedger(db, run, log=Log())
    assert json.loads(head_path.read_text())["alarm"]["what"] == "found earlier"
    assert led.health()["alarm"] == "found earlier"

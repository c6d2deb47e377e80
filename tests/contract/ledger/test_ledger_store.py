"""Contract tests of ``SqliteLedger`` on temp files: rows, never losing a record (full disk, read-only
database, lock held, a daemon killed while degraded), interrupted switches, WAL readers.

A full disk is simulated with ``PRAGMA max_page_count`` (set through the ledger's connect hook: the
pragma lives per connection, and the ledger opens a fresh connection after a failed write).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from ledger_support import (
    T0,
    Disk,
    Log,
    ReadOnly,
    finish,
    full_after_one_row,
    make_record,
    rows,
    spool_files,
    with_finished_row,
)

from gpushift.ledger import SqliteLedger

# --------------------------------------------------------------------------- rows


def test_ledger_begin_writes_intent_row_before_finish(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led = SqliteLedger(db, run, log=Log())
    rec = make_record(1)
    row_id = led.begin(rec)
    assert row_id > 0 and rec.id == row_id
    intent = led.get(row_id)
    assert intent is not None and intent.outcome == "pending" and intent.reason == "switch number 1"
    finish(led, rec)
    done = led.get(row_id)
    assert done is not None and done.outcome == "ok" and done.backend_version == "b4100"
    assert rows(db) == [(1, "ticket-1", "ok")]
    d = done.to_dict()
    for key in ("id", "outcome", "from", "to", "argv", "backend_version"):
        assert key in d
    assert led.verify().ok


def test_ledger_list_newest_first_with_filters(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led = SqliteLedger(db, run, log=Log())
    for i in range(6):
        rec = make_record(i, to="llama" if i % 2 else "vllm", frm="vllm" if i % 2 else "llama")
        led.begin(rec)
        finish(led, rec, "ok" if i != 4 else "rolled_back")
    assert [r.id for r in led.list(limit=3)] == [6, 5, 4]
    assert [r.id for r in led.list(outcome="rolled_back")] == [5]
    assert [r.id for r in led.list(since=T0 + timedelta(minutes=4))] == [6, 5]
    assert {r.id for r in led.list(backend="llama")} == {1, 2, 3, 4, 5, 6}  # to or from
    assert led.last() is not None and led.last().id == 6  # type: ignore[union-attr]
    with pytest.raises(TypeError):
        led.list(colour="red")


def test_ledger_text_that_is_not_utf8_still_lands(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led = SqliteLedger(db, run, log=Log())
    rec = make_record(1, argv_running=["/usr/bin/llama-server", "-m", "/models/caf\udce9.gguf"])
    rec.reason = "r\udce9sum\u00e9 \u665a\u4e0a"  # a lone surrogate beside real non-ASCII text
    assert led.begin(rec) == 1
    got = led.get(1)
    assert got is not None and got.argv_running[-1] == "/models/caf\udce9.gguf"  # kept exactly
    assert "\u665a\u4e0a" in got.reason
    assert led.verify().ok


# --------------------------------------------------------------------------- never losing a row


def test_ledger_disk_full_spools_record_and_lands_exactly_once(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    log, disk = Log(), Disk()
    first = SqliteLedger(db, run, log=log, connect_hook=disk)
    r1 = make_record(1)
    first.begin(r1)
    finish(first, r1)
    first.close()
    disk.fill(db)

    led = SqliteLedger(db, run, log=log, connect_hook=disk)
    r2 = make_record(2)
    pid = led.begin(r2)  # the switch goes on: begin does not raise
    assert pid < 0 and r2.id == pid
    h = led.health()
    assert h["state"] == "degraded" and h["pending"] == 1 and "full" in h["error"]
    assert len(spool_files(run)) == 1
    pending_line = log.events("ledger_pending")[-1]
    assert (
        pending_line["record"]["ticket"] == "ticket-2"
        and pending_line["record"]["reason"] == "switch number 2"
    )
    finish(led, r2)  # still full: the finished record replaces the pending one in the spool
    assert len(spool_files(run)) == 1 and led.health()["pending"] == 1
    assert log.events("ledger_pending")[-1]["record"]["outcome"] == "ok"
    shown = led.get(pid)
    assert shown is not None and shown.outcome == "ok"
    assert [r.ticket for r in led.list()] == ["ticket-2", "ticket-1"]  # status sees it meanwhile

    disk.pages = None  # space is back
    assert led.flush_pending() == 1
    assert rows(db) == [(1, "ticket-1", "ok"), (2, "ticket-2", "ok")]
    assert spool_files(run) == []
    assert led.health() == {"state": "ok", "pending": 0, "error": None, "alarm": None}
    assert led.flush_pending() == 0
    assert rows(db) == [(1, "ticket-1", "ok"), (2, "ticket-2", "ok")]
    again = led.get(pid)  # the provisional id still finds the row it became
    assert again is not None and again.id == 2
    assert led.verify().ok


def test_ledger_begin_while_full_and_finish_after_space_is_back_share_one_row(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    led, disk = full_after_one_row(db, run)
    rec = make_record(1)
    assert led.begin(rec) < 0
    disk.pages = None
    finish(led, rec)  # replays the intent, then completes that same row
    assert rec.id == 2
    assert rows(db) == [(1, "ticket-0", "ok"), (2, "ticket-1", "ok")]
    assert spool_files(run) == [] and led.health()["state"] == "ok"
    assert led.verify().ok


def test_ledger_finish_while_full_after_begin_landed_updates_the_same_row(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    disk = Disk()
    led = SqliteLedger(db, run, log=Log(), connect_hook=disk)
    rec = make_record(1)
    assert led.begin(rec) == 1
    led.close()
    disk.fill(db)
    rec.extra["vram_trace"] = ["x" * 100] * 200  # the finished record is bigger: it needs pages
    finish(led, rec)
    assert led.health()["pending"] == 1 and rows(db) == [(1, "ticket-1", "pending")]
    got = led.get(1)  # the pending finish is newer than the row's intent
    assert got is not None and got.outcome == "ok"
    disk.pages = None
    assert led.flush_pending() == 1
    assert rows(db) == [(1, "ticket-1", "ok")]
    assert led.verify().ok


_CRASHER = textwrap.dedent(
    """
    import os, signal, sqlite3, sys
    from datetime import datetime, timedelta, timezone
    from gpushift.ledger import SqliteLedger
    from gpushift.values import SwitchRecord

    db, run, pages = sys.argv[1], sys.argv[2], int(sys.argv[3])
    def hook(conn):
        conn.execute(f"PRAGMA max_page_count = {pages}")
    led = SqliteLedger(db, run, log=lambda event, **kw: None, connect_hook=hook)
    t0 = datetime(2025, 3, 1, 9, 0, tzinfo=timezone.utc)
    def rec(i):
        r = SwitchRecord(trigger="schedule", requested_by="gpushift", reason=f"night {i}",
                         from_backend="vllm", to_backend="llama", started_at=t0 + timedelta(minutes=i),
                         ticket=f"crash-{i}")
        r.extra["launch"] = {"unit": {"environment": {f"V{k}": "y" * 40 for k in range(60)}}}
        return r
    a = rec(1)
    assert led.begin(a) < 0
    a.outcome = "ok"; a.finished_at = a.started_at + timedelta(seconds=20)
    led.finish(a)
    b = rec(2)
    assert led.begin(b) < 0            # in flight when the daemon dies
    assert led.health()["pending"] == 2
    print("spooled", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_ledger_sigkill_while_degraded_replays_spool_at_restart(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    with_finished_row(db, run).close()
    with sqlite3.connect(db) as c:
        pages = int(c.execute("PRAGMA page_count").fetchone()[0])
    proc = subprocess.run(
        [sys.executable, "-c", _CRASHER, str(db), str(run), str(pages)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr
    assert "spooled" in proc.stdout
    assert len(spool_files(run)) == 2
    assert rows(db) == [(1, "ticket-0", "ok")]

    log = Log()
    restarted = SqliteLedger(db, run, log=log)  # the restarted daemon: replays at open
    assert spool_files(run) == []
    assert rows(db) == [(1, "ticket-0", "ok"), (2, "crash-1", "ok"), (3, "crash-2", "pending")]
    assert restarted.mark_interrupted(T0 + timedelta(hours=2)) == [3]
    assert rows(db)[-1] == (3, "crash-2", "interrupted")
    assert restarted.verify().ok
    restarted.close()

    SqliteLedger(db, run, log=Log()).close()  # and once more: nothing lands twice
    assert [r[1] for r in rows(db)] == ["ticket-0", "crash-1", "crash-2"]


def test_ledger_read_only_database_spools_then_recovers(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    hook = ReadOnly()
    led = SqliteLedger(db, run, log=Log(), connect_hook=hook)
    led.close()
    hook.on = True
    rec = make_record(1)
    assert led.begin(rec) < 0
    assert led.health()["state"] == "degraded" and "readonly" in led.health()["error"].replace("-", "")
    hook.on = False
    finish(led, rec)
    assert rows(db) == [(1, "ticket-1", "ok")] and led.health()["state"] == "ok"


def test_ledger_locked_past_timeout_spools_then_lands(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led = SqliteLedger(db, run, log=Log(), lock_timeout_s=0.2)
    other = sqlite3.connect(db, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # somebody holds the write lock
        rec = make_record(1)
        assert led.begin(rec) < 0
        assert "locked" in led.health()["error"]
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert led.flush_pending() == 1
    finish(led, rec)
    assert rows(db) == [(1, "ticket-1", "ok")]


# --------------------------------------------------------------------------- interrupted switches


def test_ledger_mark_interrupted_closes_unfinished_rows(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led = with_finished_row(db, run, 1)
    led.begin(make_record(2))
    led.close()
    restarted = SqliteLedger(db, run, log=Log())
    now = T0 + timedelta(hours=1)
    assert restarted.mark_interrupted(now) == [2]
    rec = restarted.get(2)
    assert rec is not None and rec.outcome == "interrupted" and rec.finished_at == now
    assert "daemon stopped" in (rec.message or "")
    assert restarted.get(1).outcome == "ok"  # type: ignore[union-attr]
    assert restarted.mark_interrupted(now) == []
    assert restarted.verify().ok


def test_ledger_mark_interrupted_while_the_database_is_read_only(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    hook = ReadOnly()
    led = SqliteLedger(db, run, log=Log(), connect_hook=hook)
    assert led.begin(make_record(1)) == 1  # in the database, unfinished
    led.close()
    hook.on = True
    pid = led.begin(make_record(2))  # in the spool, unfinished
    assert pid < 0
    del led  # the daemon dies with both switches open

    restarted = SqliteLedger(db, run, log=Log(), connect_hook=hook)  # the database still refuses writes
    assert restarted.mark_interrupted(T0 + timedelta(hours=1)) == [pid, 1]
    assert restarted.health()["pending"] == 2
    assert {r.id: r.outcome for r in restarted.list()} == {1: "interrupted", pid: "interrupted"}
    assert rows(db) == [(1, "ticket-1", "pending")]

    hook.on = False
    assert restarted.flush_pending() == 2
    assert rows(db) == [(1, "ticket-1", "interrupted"), (2, "ticket-2", "interrupted")]
    assert restarted.verify().ok


# --------------------------------------------------------------------------- readers and the writer


def test_ledger_reader_and_writer_do_not_block_each_other(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led = SqliteLedger(db, run, log=Log(), lock_timeout_s=0.5)
    r1 = make_record(1)
    led.begin(r1)
    finish(led, r1)
    reader = SqliteLedger.open_readonly(db, run)
    raw = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    try:
        raw.execute("BEGIN")
        raw.execute("SELECT count(*) FROM switches").fetchone()  # a read transaction stays open
        r2 = make_record(2)
        assert led.begin(r2) == 2  # not provisional: the writer was not blocked
        # ...and while the writer holds the write lock, readers still read.
        hold = sqlite3.connect(db, isolation_level=None)
        try:
            hold.execute("BEGIN IMMEDIATE")
            hold.execute("UPDATE switches SET reason = reason WHERE id = 1")
            assert [r.id for r in reader.list()] == [2, 1]
        finally:
            hold.execute("ROLLBACK")
            hold.close()
    finally:
        raw.close()
    with sqlite3.connect(db) as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_ledger_status_reads_do_not_wait_for_a_blocked_write(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led = SqliteLedger(db, run, log=Log(), lock_timeout_s=3.0)
    first = make_record(1)
    led.begin(first)
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the write below waits for this lock
    result: dict[str, int] = {}
    writer = threading.Thread(target=lambda: result.setdefault("id", led.begin(make_record(2))))
    try:
        writer.start()
        time.sleep(0.3)  # the writer now holds the ledger's write lock, waiting on SQLite
        assert writer.is_alive()
        t = time.monotonic()
        assert led.health()["pending"] == 0
        assert [r.id for r in led.list()] == [1]
        assert time.monotonic() - t < 1.5  # answered while the write still waits (up to 3 s)
    finally:
        other.execute("ROLLBACK")
        other.close()
        writer.join(timeout=10)
    assert result["id"] == 2

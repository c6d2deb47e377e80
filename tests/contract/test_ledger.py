"""Contract tests of the SQLite ledger on temp files: rows, the pending spool, the hash chain, WAL,
migrations and file modes.

A full disk is simulated with ``PRAGMA max_page_count`` (set through the ledger's connect hook: the
pragma lives per connection, and the ledger opens a fresh connection after a failed write).
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from gpushift.ledger import SqliteLedger
from gpushift.ledger.chain import CHAIN_COLUMNS, GENESIS_HASH, row_hash
from gpushift.ledger.schema import SCHEMA_VERSION, migrate
from gpushift.ledger.spool import SPOOL_SUBDIR
from gpushift.model import SwitchRecord

T0 = datetime(2025, 3, 1, 8, 0, tzinfo=timezone.utc)


class Log:
    """Records every structured line the ledger emits."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def _add(self, level: str, event: str, **fields: Any) -> None:
        self.lines.append((level, event, fields))

    def info(self, event: str, **fields: Any) -> None:
        self._add("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._add("warning", event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._add("error", event, **fields)

    def events(self, name: str) -> list[dict[str, Any]]:
        return [f for _lvl, e, f in self.lines if e == name]


class Disk:
    """A connect hook that caps the database at ``pages`` (None: no cap) — a full disk."""

    def __init__(self) -> None:
        self.pages: int | None = None

    def __call__(self, conn: sqlite3.Connection) -> None:
        if self.pages is not None:
            conn.execute(f"PRAGMA max_page_count = {self.pages}")

    def fill(self, db: Path) -> None:
        """Cap at the current size: the next write that needs a page fails."""
        with sqlite3.connect(db) as c:
            self.pages = int(c.execute("PRAGMA page_count").fetchone()[0])


def make_record(i: int, to: str = "llama", frm: str | None = "vllm", **kw: Any) -> SwitchRecord:
    rec = SwitchRecord(
        trigger="manual",
        requested_by="alice",
        reason=f"switch number {i}",
        from_backend=frm,
        to_backend=to,
        started_at=T0 + timedelta(minutes=i),
        ticket=f"ticket-{i}",
        uid=1000,
        gpushift_version="0.1.0",
    )
    # Rows of a realistic size (the launch info of a real switch is a few KB): each needs pages.
    rec.extra["launch"] = {"unit": {"environment": {f"VAR_{k}": "x" * 40 for k in range(60)}}}
    for k, v in kw.items():
        setattr(rec, k, v)
    return rec


def finish(led: SqliteLedger, rec: SwitchRecord, outcome: str = "ok") -> None:
    rec.outcome = outcome
    rec.finished_at = rec.started_at + timedelta(seconds=30)
    rec.backend_version = "b4100"
    led.finish(rec)


def rows(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as c:
        return c.execute("SELECT id, ticket, outcome FROM switches ORDER BY id").fetchall()


def spool_files(run: Path) -> list[str]:
    d = run / SPOOL_SUBDIR
    return sorted(os.listdir(d)) if d.exists() else []


@pytest.fixture
def paths(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    yield tmp_path / "state" / "ledger.db", tmp_path / "run"


def sqlite3_tool(db: Path, sql: str) -> None:
    """Edit the database as a person would, with the sqlite3 command-line tool."""
    tool = shutil.which("sqlite3")
    if tool is None:
        raise AssertionError("the sqlite3 command-line tool is needed (apt-get install sqlite3)")
    subprocess.run([tool, str(db), sql], check=True, capture_output=True, timeout=30)


# --------------------------------------------------------------------------- rows


def test_ledger_begin_writes_intent_row_before_finish(paths: tuple[Path, Path]) -> None:
    db, run = paths
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


def test_ledger_list_newest_first_with_filters(paths: tuple[Path, Path]) -> None:
    db, run = paths
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


# --------------------------------------------------------------------------- never losing a row


def test_ledger_disk_full_spools_record_and_lands_exactly_once(paths: tuple[Path, Path]) -> None:
    db, run = paths
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
    paths: tuple[Path, Path],
) -> None:
    db, run = paths
    disk = Disk()
    led = SqliteLedger(db, run, log=Log(), connect_hook=disk)
    r0 = make_record(0)
    led.begin(r0)
    finish(led, r0)
    led.close()
    disk.fill(db)
    rec = make_record(1)
    assert led.begin(rec) < 0
    disk.pages = None
    finish(led, rec)  # replays the intent, then completes that same row
    assert rec.id == 2
    assert rows(db) == [(1, "ticket-0", "ok"), (2, "ticket-1", "ok")]
    assert spool_files(run) == [] and led.health()["state"] == "ok"
    assert led.verify().ok


def test_ledger_finish_while_full_after_begin_landed_updates_the_same_row(paths: tuple[Path, Path]) -> None:
    db, run = paths
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
    from gpushift.model import SwitchRecord

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


def test_ledger_sigkill_while_degraded_replays_spool_at_restart(paths: tuple[Path, Path]) -> None:
    db, run = paths
    led = SqliteLedger(db, run, log=Log())
    r0 = make_record(0)
    led.begin(r0)
    finish(led, r0)
    led.close()
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


def test_ledger_replay_of_a_spool_file_that_survived_its_commit_adds_no_row(paths: tuple[Path, Path]) -> None:
    db, run = paths
    disk = Disk()
    led = SqliteLedger(db, run, log=Log(), connect_hook=disk)
    r0 = make_record(0)
    led.begin(r0)
    finish(led, r0)
    led.close()
    disk.fill(db)
    rec = make_record(1)
    led.begin(rec)
    finish(led, rec)
    (name,) = spool_files(run)
    saved = (run / SPOOL_SUBDIR / name).read_bytes()
    disk.pages = None
    assert led.flush_pending() == 1
    led.close()
    # A crash after the COMMIT but before the spool file was removed: the file is still there.
    (run / SPOOL_SUBDIR / name).write_bytes(saved)
    SqliteLedger(db, run, log=Log()).close()
    assert rows(db) == [(1, "ticket-0", "ok"), (2, "ticket-1", "ok")]
    assert spool_files(run) == []


def test_ledger_read_only_database_spools_then_recovers(paths: tuple[Path, Path]) -> None:
    db, run = paths
    state = {"ro": False}

    def hook(conn: sqlite3.Connection) -> None:
        if state["ro"]:
            conn.execute("PRAGMA query_only = ON")

    led = SqliteLedger(db, run, log=Log(), connect_hook=hook)
    led.close()
    state["ro"] = True
    rec = make_record(1)
    assert led.begin(rec) < 0
    assert led.health()["state"] == "degraded" and "readonly" in led.health()["error"].replace("-", "")
    state["ro"] = False
    finish(led, rec)
    assert rows(db) == [(1, "ticket-1", "ok")] and led.health()["state"] == "ok"


def test_ledger_locked_past_timeout_spools_then_lands(paths: tuple[Path, Path]) -> None:
    db, run = paths
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


def test_ledger_mark_interrupted_closes_unfinished_rows(paths: tuple[Path, Path]) -> None:
    db, run = paths
    led = SqliteLedger(db, run, log=Log())
    done = make_record(1)
    led.begin(done)
    finish(led, done)
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


# --------------------------------------------------------------------------- tamper evidence


def _five_rows(db: Path, run: Path, log: Log | None = None) -> SqliteLedger:
    led = SqliteLedger(db, run, log=log or Log())
    for i in range(1, 6):
        rec = make_record(i)
        led.begin(rec)
        finish(led, rec)
    assert led.verify().ok
    return led


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
def test_ledger_verify_names_the_row_edited_with_sqlite3_tool(paths: tuple[Path, Path], sql: str) -> None:
    db, run = paths
    led = _five_rows(db, run)
    sqlite3_tool(db, sql)
    res = led.verify()
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


def test_ledger_verify_catches_an_edit_with_every_hash_recomputed(paths: tuple[Path, Path]) -> None:
    db, run = paths
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


def test_ledger_next_write_after_forgery_keeps_the_alarm(paths: tuple[Path, Path]) -> None:
    db, run = paths
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


def test_ledger_verify_catches_removed_newest_row(paths: tuple[Path, Path]) -> None:
    db, run = paths
    led = _five_rows(db, run)
    sqlite3_tool(db, "DELETE FROM switches WHERE id = 5")
    res = led.verify()
    assert not res.ok and "head file names row 5" in (res.problem or "")


def test_ledger_verify_catches_removed_middle_row(paths: tuple[Path, Path]) -> None:
    db, run = paths
    led = _five_rows(db, run)
    sqlite3_tool(db, "DELETE FROM switches WHERE id = 3")
    res = led.verify()
    assert not res.ok and res.first_bad_id == 4


def test_ledger_head_ahead_of_database_after_cut_off_write_is_accepted(paths: tuple[Path, Path]) -> None:
    db, run = paths
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


def test_ledger_rewriting_an_older_row_relinks_the_chain(paths: tuple[Path, Path]) -> None:
    db, run = paths
    led = SqliteLedger(db, run, log=Log())
    a, b = make_record(1), make_record(2)
    led.begin(a)
    led.begin(b)  # a is no longer the newest row when it finishes
    finish(led, a)
    finish(led, b, "failed")
    assert rows(db) == [(1, "ticket-1", "ok"), (2, "ticket-2", "failed")]
    assert led.verify().ok


def test_ledger_rewrite_does_not_relink_over_an_edit(paths: tuple[Path, Path]) -> None:
    db, run = paths
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


# --------------------------------------------------------------------------- WAL, schema, files


def test_ledger_reader_and_writer_do_not_block_each_other(paths: tuple[Path, Path]) -> None:
    db, run = paths
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


def test_ledger_migrates_a_version_1_database(paths: tuple[Path, Path]) -> None:
    db, run = paths
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


def test_ledger_read_only_view_of_a_version_1_database_lists_rows(paths: tuple[Path, Path]) -> None:
    db, run = paths
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


def test_ledger_newer_schema_is_not_touched_and_records_are_kept(paths: tuple[Path, Path]) -> None:
    db, run = paths
    db.parent.mkdir(parents=True)
    with sqlite3.connect(db) as c:
        c.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        c.execute("INSERT INTO schema_version VALUES (99)")
    led = SqliteLedger(db, run, log=Log())
    rec = make_record(1)
    assert led.begin(rec) < 0  # not written into a schema it does not know; kept in the spool
    assert "newer" in led.health()["error"] and len(spool_files(run)) == 1


def test_ledger_files_are_created_0640_with_the_group(paths: tuple[Path, Path]) -> None:
    db, run = paths
    others = [g for g in grp.getgrall() if g.gr_gid != os.getgid()]
    if not others:
        raise AssertionError("this test needs a group other than the current one in /etc/group")
    group = others[0]
    old_umask = os.umask(0)  # the modes must not depend on the umask
    try:
        disk = Disk()
        led = SqliteLedger(db, run, log=Log(), group=group.gr_name, connect_hook=disk)
        rec = make_record(1)
        led.begin(rec)
        led.close()
        disk.fill(db)
        led.begin(make_record(2))  # spooled
        wal_led = SqliteLedger(db, run, log=Log(), group=group.gr_name)
        finish(wal_led, rec)
        files = [db, Path(wal_led.head_path), Path(str(db) + "-wal")]
        for f in files:
            st = f.stat()
            assert st.st_mode & 0o777 == 0o640, (f, oct(st.st_mode))
        for f in (db, Path(wal_led.head_path)):
            assert f.stat().st_gid == group.gr_gid, f
    finally:
        os.umask(old_umask)


def test_ledger_spool_files_are_0640(paths: tuple[Path, Path]) -> None:
    db, run = paths
    disk = Disk()
    led = SqliteLedger(db, run, log=Log(), connect_hook=disk)
    led.begin(make_record(0))
    led.close()
    disk.fill(db)
    old_umask = os.umask(0)
    try:
        led.begin(make_record(1))
    finally:
        os.umask(old_umask)
    (name,) = spool_files(run)
    assert (run / SPOOL_SUBDIR / name).stat().st_mode & 0o777 == 0o640


def test_ledger_missing_group_is_not_an_error(paths: tuple[Path, Path]) -> None:
    db, run = paths
    led = SqliteLedger(db, run, log=Log(), group="no-such-group-gpushift-test")
    assert led.begin(make_record(1)) == 1
    assert db.stat().st_mode & 0o777 == 0o640


def test_ledger_status_reads_do_not_wait_for_a_blocked_write(paths: tuple[Path, Path]) -> None:
    db, run = paths
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


def test_ledger_record_the_database_refuses_is_set_aside_not_stalling_the_rest(
    paths: tuple[Path, Path],
) -> None:
    db, run = paths
    log = Log()
    led = SqliteLedger(db, run, log=log)
    led.begin(make_record(0))
    # A constraint that refuses one record for what it is (retrying will never help).
    sqlite3_tool(
        db,
        "CREATE TRIGGER refuse BEFORE INSERT ON switches WHEN NEW.reason = 'poison' "
        "BEGIN SELECT RAISE(ABORT, 'refused by a constraint'); END",
    )
    poison = make_record(1, reason="poison")
    assert led.begin(poison) < 0  # not raised to the switcher: logged and spooled
    assert log.events("ledger_pending")[-1]["record"]["reason"] == "poison"
    good = make_record(2)
    assert led.begin(good) == 2  # the refused record does not block the next one
    (bad,) = spool_files(run)
    assert bad.endswith(".json.bad")  # kept for a person, out of the replay's way
    assert log.events("ledger_record_quarantined")[0]["record"]["reason"] == "poison"
    assert led.health()["pending"] == 0
    assert led.verify().ok


def test_ledger_damaged_spool_files_are_set_aside(paths: tuple[Path, Path]) -> None:
    db, run = paths
    spool = run / SPOOL_SUBDIR
    spool.mkdir(parents=True)
    (spool / "aaaa.json").write_text("{not json")
    (spool / "bbbb.json").write_text(json.dumps({"uuid": "bbbb", "seq": 1, "row_id": "3", "record": {}}))
    log = Log()
    led = SqliteLedger(db, run, log=log)
    assert sorted(spool_files(run)) == ["aaaa.json.bad", "bbbb.json.bad"]
    assert len(log.events("ledger_spool_bad_file")) == 2
    assert led.begin(make_record(1)) == 1 and led.health()["state"] == "ok"


def test_ledger_text_that_is_not_utf8_still_lands(paths: tuple[Path, Path]) -> None:
    db, run = paths
    led = SqliteLedger(db, run, log=Log())
    rec = make_record(1, argv_running=["/usr/bin/llama-server", "-m", "/models/caf\udce9.gguf"])
    rec.reason = "r\udce9sum\u00e9 \u665a\u4e0a"  # a lone surrogate beside real non-ASCII text
    assert led.begin(rec) == 1
    got = led.get(1)
    assert got is not None and got.argv_running[-1] == "/models/caf\udce9.gguf"  # kept exactly
    assert "\u665a\u4e0a" in got.reason
    assert led.verify().ok


def test_ledger_mark_interrupted_while_the_database_is_read_only(paths: tuple[Path, Path]) -> None:
    db, run = paths
    state = {"ro": False}

    def hook(conn: sqlite3.Connection) -> None:
        if state["ro"]:
            conn.execute("PRAGMA query_only = ON")

    led = SqliteLedger(db, run, log=Log(), connect_hook=hook)
    assert led.begin(make_record(1)) == 1  # in the database, unfinished
    led.close()
    state["ro"] = True
    pid = led.begin(make_record(2))  # in the spool, unfinished
    assert pid < 0
    del led  # the daemon dies with both switches open

    restarted = SqliteLedger(db, run, log=Log(), connect_hook=hook)  # the database still refuses writes
    assert restarted.mark_interrupted(T0 + timedelta(hours=1)) == [pid, 1]
    assert restarted.health()["pending"] == 2
    assert {r.id: r.outcome for r in restarted.list()} == {1: "interrupted", pid: "interrupted"}
    assert rows(db) == [(1, "ticket-1", "pending")]

    state["ro"] = False
    assert restarted.flush_pending() == 2
    assert rows(db) == [(1, "ticket-1", "interrupted"), (2, "ticket-2", "interrupted")]
    assert restarted.verify().ok

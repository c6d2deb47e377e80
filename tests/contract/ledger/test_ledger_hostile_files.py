"""The ledger's files beside the database when they are not what gpushift wrote (issue 20): a FIFO or
a symlink to /dev/zero as the head file or a pending spool file is never opened as such — a reader
is told, the writer moves it aside and says so (the head: the tamper alarm, which the health shows;
the spool: ``.bad`` beside it, in :attr:`Spool.bad_files`), and the ledger goes on taking rows."""

from __future__ import annotations

import os
import time
from pathlib import Path

from ledger_support import Log, make_record, rows, spool_files

from gpushift.ledger import SqliteLedger
from gpushift.ledger.spool import SPOOL_SUBDIR


def test_ledger_fifo_head_is_set_aside_with_the_alarm_and_written_anew(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    db.parent.mkdir(parents=True)
    head = db.parent / "ledger.head"
    os.mkfifo(head)
    reader = SqliteLedger.open_readonly(db, run)
    t0 = time.monotonic()
    res = reader.verify()
    assert time.monotonic() - t0 < 5
    assert res.head_file and "not a regular file (FIFO)" in res.head_file["error"]
    assert head.is_fifo(), "a reader moves nothing"
    reader.close()

    log = Log()
    led = SqliteLedger(db, run, log=log)
    led.begin(make_record(0))
    (moved,) = db.parent.glob("ledger.head.bad-*")
    assert moved.is_fifo() and head.is_file()
    (line,) = log.events("ledger_head_set_aside")
    assert line["moved_to"] == str(moved) and "FIFO" in line["error"]
    alarm = led.health()["alarm"]
    assert alarm and "could not be read safely (not a regular file (FIFO))" in alarm and str(moved) in alarm
    led.begin(make_record(1))
    assert [r[1] for r in rows(db)] == ["ticket-0", "ticket-1"]
    assert not led.verify().ok  # the alarm stands until a person clears it
    led.close()


def test_ledger_head_linked_to_dev_zero_during_writes_is_set_aside(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    log = Log()
    led = SqliteLedger(db, run, log=log)
    led.begin(make_record(0))
    head = db.parent / "ledger.head"
    head.unlink()
    head.symlink_to("/dev/zero")
    led.begin(make_record(1))  # the write's check reads the head
    (moved,) = db.parent.glob("ledger.head.bad-*")
    assert os.path.islink(moved) and head.is_file() and not head.is_symlink()
    assert "a symbolic link out of" in (led.health()["alarm"] or "")
    assert len(rows(db)) == 2
    led.close()


def test_ledger_spool_fifo_and_dev_zero_are_set_aside_the_rest_replayed(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    spool = run / SPOOL_SUBDIR
    spool.mkdir(parents=True)
    os.mkfifo(spool / "aaaa.json")
    (spool / "bbbb.json").symlink_to("/dev/zero")
    reader = SqliteLedger.open_readonly(db, run)
    t0 = time.monotonic()
    assert reader.health()["pending"] == 0
    assert time.monotonic() - t0 < 5
    assert sorted(spool_files(run)) == ["aaaa.json", "bbbb.json"], "a reader moves nothing"
    reader.close()

    log = Log()
    led = SqliteLedger(db, run, log=log)
    assert sorted(spool_files(run)) == ["aaaa.json.bad", "bbbb.json.bad"]
    assert (spool / "aaaa.json.bad").is_fifo() and os.path.islink(spool / "bbbb.json.bad")
    bad = {line["path"]: line["error"] for line in log.events("ledger_spool_bad_file")}
    assert bad == {
        str(spool / "aaaa.json"): "not a regular file (FIFO)",
        str(spool / "bbbb.json"): f"a symbolic link out of {spool} (to /dev/zero)",
    }
    assert len(led._spool.bad_files) == 2
    led.begin(make_record(0))
    assert [r[1] for r in rows(db)] == ["ticket-0"]
    led.close()

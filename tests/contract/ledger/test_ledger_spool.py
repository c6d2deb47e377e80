"""Contract tests of the ledger's pending spool: a replay lands a record once, a record the database
refuses and a damaged spool file are set aside without stalling the rest, and the spool is bounded:
a record beyond the bound is never kept and never lost quietly (its one log line carries the whole
record), and a spool lost with /run is in the log too.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ledger_support import (
    Disk,
    Log,
    finish,
    full_after_one_row,
    make_record,
    rows,
    spool_files,
    sqlite3_tool,
)

from gpushift.ledger import SqliteLedger
from gpushift.ledger.spool import SPOOL_SUBDIR


def test_ledger_replay_of_a_spool_file_that_survived_its_commit_adds_no_row(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
    rec = make_record(1)
    led, disk = full_after_one_row(db, run)
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


def test_ledger_record_the_database_refuses_is_set_aside_not_stalling_the_rest(
    ledger_paths: tuple[Path, Path],
) -> None:
    db, run = ledger_paths
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


def test_ledger_damaged_spool_files_are_set_aside(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    spool = run / SPOOL_SUBDIR
    spool.mkdir(parents=True)
    (spool / "aaaa.json").write_text("{not json")
    (spool / "bbbb.json").write_text(json.dumps({"uuid": "bbbb", "seq": 1, "row_id": "3", "record": {}}))
    log = Log()
    led = SqliteLedger(db, run, log=log)
    assert sorted(spool_files(run)) == ["aaaa.json.bad", "bbbb.json.bad"]
    assert len(log.events("ledger_spool_bad_file")) == 2
    assert led.begin(make_record(1)) == 1 and led.health()["state"] == "ok"


# --------------------------------------------------------------------------- the spool's bound


def test_ledger_full_spool_logs_the_whole_record_it_cannot_keep(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    disk = Disk()
    log = Log()
    led = SqliteLedger(db, run, log=log, connect_hook=disk, spool_max_records=2)
    led.begin(make_record(0))
    led.close()
    disk.fill(db)
    kept = [make_record(1), make_record(2)]
    for rec in kept:
        assert led.begin(rec) < 0
    lost = make_record(3, reason="the third while full")
    assert led.begin(lost) < 0  # the switch is never refused for it
    (line,) = log.events("ledger_record_lost")
    assert line["record"] == lost.to_dict()  # the whole record, in one line
    assert len(spool_files(run)) == 2 and led.health()["lost"] == 1
    finish(led, kept[0])  # a later state of a kept record still fits: it replaces its entry
    assert len(log.events("ledger_record_lost")) == 1
    disk.pages = None
    assert led.flush_pending() == 2
    assert [t for _i, t, _o in rows(db)] == ["ticket-0", "ticket-1", "ticket-2"]


def test_ledger_spool_bound_in_bytes(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    disk = Disk()
    log = Log()
    size = len(json.dumps(make_record(1).to_dict()))
    led = SqliteLedger(db, run, log=log, connect_hook=disk, spool_max_bytes=size * 3 // 2)
    led.begin(make_record(0))
    led.close()
    disk.fill(db)
    led.begin(make_record(1))
    led.begin(make_record(2))
    assert [x["record"]["ticket"] for x in log.events("ledger_record_lost")] == ["ticket-2"]
    assert len(spool_files(run)) == 1


def test_ledger_spool_lost_with_run_at_a_reboot_is_in_the_log(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led, _disk = full_after_one_row(db, run)
    log = led._log
    rec = make_record(1, reason="written while full, then /run was wiped")
    led.begin(rec)
    finish(led, rec)
    led.close()
    shutil.rmtree(run / SPOOL_SUBDIR)  # a reboot empties /run
    SqliteLedger(db, run, log=Log()).close()
    assert rows(db) == [(1, "ticket-0", "ok")]
    # What remains is the journal: one line per state of the record, each the whole record.
    assert log.events("ledger_pending")[-1]["record"] == rec.to_dict()

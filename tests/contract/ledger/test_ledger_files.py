"""Contract tests of the ledger's files: the database, its WAL, the head file and the spool files are
0640 whatever the umask, with the gpushift group where it exists.
"""

from __future__ import annotations

import grp
import os
from pathlib import Path

from ledger_support import Disk, Log, finish, make_record, spool_files

from gpushift.ledger import SqliteLedger
from gpushift.ledger.spool import SPOOL_SUBDIR


def test_ledger_files_are_created_0640_with_the_group(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
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


def test_ledger_spool_files_are_0640(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
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


def test_ledger_missing_group_is_not_an_error(ledger_paths: tuple[Path, Path]) -> None:
    db, run = ledger_paths
    led = SqliteLedger(db, run, log=Log(), group="no-such-group-gpushift-test")
    assert led.begin(make_record(1)) == 1
    assert db.stat().st_mode & 0o777 == 0o640

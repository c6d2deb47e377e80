"""What the ledger's contract tests share: a recording log, a full disk, records, row and spool views.

Imported by its own name (``ledger_support``) from the ``test_ledger_*`` modules beside it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from gpushift.ledger import SqliteLedger
from gpushift.ledger.spool import SPOOL_SUBDIR
from gpushift.values import SwitchRecord

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


class ReadOnly:
    """A connect hook that makes the database refuse writes (``PRAGMA query_only``) while ``on``."""

    def __init__(self) -> None:
        self.on = False

    def __call__(self, conn: sqlite3.Connection) -> None:
        if self.on:
            conn.execute("PRAGMA query_only = ON")


def with_finished_row(
    db: Path, run: Path, i: int = 0, connect_hook: Callable[[sqlite3.Connection], None] | None = None
) -> SqliteLedger:
    """A ledger holding one finished row: ``make_record(i)``, outcome ok."""
    led = SqliteLedger(db, run, log=Log(), connect_hook=connect_hook)
    rec = make_record(i)
    led.begin(rec)
    finish(led, rec)
    return led


def full_after_one_row(db: Path, run: Path) -> tuple[SqliteLedger, Disk]:
    """A ledger with one finished row (``ticket-0``), closed, whose disk is now full."""
    disk = Disk()
    led = with_finished_row(db, run, 0, disk)
    led.close()
    disk.fill(db)
    return led, disk


def sqlite3_tool(db: Path, sql: str) -> None:
    """Edit the database as a person would, with the sqlite3 command-line tool."""
    tool = shutil.which("sqlite3")
    if tool is None:
        raise AssertionError("the sqlite3 command-line tool is needed (apt-get install sqlite3)")
    subprocess.run([tool, str(db), sql], check=True, capture_output=True, timeout=30)


#: What ``ledger.db`` holds after a copy went wrong.
GARBAGE = b"not a ledger: a copy went wrong halfway\n" * 300


def put_garbage(db: Path) -> None:
    """Replace the database by garbage, the main file alone (a WAL beside it would still hold the
    pages of a small ledger: SQLite would read through it)."""
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    db.write_bytes(GARBAGE)


def head_of(led: SqliteLedger) -> dict[str, Any]:
    """The head file's content."""
    return dict(json.loads(Path(led.head_path).read_text()))


def chain_rows(db: Path) -> list[dict[str, Any]]:
    """Every row: id, outcome, ticket, prev_hash and the record, oldest first."""
    with sqlite3.connect(db) as c:
        out = c.execute("SELECT id, outcome, ticket, prev_hash, record FROM switches ORDER BY id").fetchall()
    return [
        {"id": i, "outcome": o, "ticket": t, "prev_hash": p, "record": json.loads(r)} for i, o, t, p, r in out
    ]


class TinyFs:
    """A small tmpfs of its own: a real full disk, a real read-only directory."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def remount(self, read_only: bool) -> None:
        opt = "remount,ro" if read_only else "remount,rw"
        subprocess.run(["mount", "-o", opt, str(self.path)], check=True, capture_output=True, timeout=30)

    def fill(self) -> Path:
        """Write a file until the filesystem is full; remove it to give the space back."""
        filler = self.path / "filler"
        with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        return filler


@contextlib.contextmanager
def tiny_fs(path: Path, size: str = "1m") -> Iterator[TinyFs]:
    """Mount a tmpfs of ``size`` at ``path`` (needs root); always unmounted again."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if r.returncode != 0:
        raise AssertionError(f"cannot mount a tmpfs at {path} (the test needs root and mount): {r.stderr}")
    try:
        yield TinyFs(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True, timeout=30)

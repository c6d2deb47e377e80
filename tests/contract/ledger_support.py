"""What the ledger's contract tests share: a recording log, a full disk, records, row and spool views.

Imported by its own name (``ledger_support``) from the ``test_ledger_*`` modules beside it.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from gpushift.ledger import SqliteLedger
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

"""``gpushift ledger --json`` streams its rows (issue 20 point 6): the reader hands them out a batch
at a time, in ``list``'s order, and the command's memory does not grow with the rows it prints
(measured as the peak RSS of the command itself, a million-row limit against a one-row one, on
8,000 rows of a realistic size).  The table view, built whole, takes at most ``TEXT_LIMIT_MAX``."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from ledger_support import T0, Log, ReadOnly, make_record

from gpushift.cli.ledger import TEXT_LIMIT_MAX, ledger
from gpushift.ledger import SqliteLedger, reader
from gpushift.ledger.chain import GENESIS_HASH, ROW_COLUMNS, row_hash
from gpushift.ledger.rows import row_values


def fill(db: Path, run: Path, rows: int) -> None:
    """``rows`` rows of ``make_record`` (a few KB each: its launch info) with a valid chain, in one
    transaction (a write per row through SqliteLedger would take minutes)."""
    SqliteLedger(db, run, log=Log()).close()  # creates and migrates
    sql = f"INSERT INTO switches ({', '.join(ROW_COLUMNS)}) VALUES ({', '.join('?' * len(ROW_COLUMNS))})"
    prev = GENESIS_HASH
    with sqlite3.connect(db) as conn:
        for i in range(1, rows + 1):
            rec = make_record(i, to="llama" if i % 2 else "vllm")
            rec.outcome, rec.finished_at = "ok", rec.started_at + timedelta(seconds=30)
            values = row_values(rec.to_dict(), i, f"key-{i:08d}", prev)
            values["hash"] = prev = row_hash(values)
            conn.execute(sql, [values[c] for c in ROW_COLUMNS])
    (db.parent / "ledger.head").write_text(json.dumps({"id": rows, "hash": prev}))


def counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the records the reader builds from rows."""
    built = [0]
    real: Callable[..., Any] = reader.record_from_dict

    def record_from_dict(*args: Any) -> Any:
        built[0] += 1
        return real(*args)

    monkeypatch.setattr(reader, "record_from_dict", record_from_dict)
    return built


def test_iter_list_reads_a_batch_at_a_time_not_the_whole_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, run = tmp_path / "ledger.db", tmp_path / "run"
    fill(db, run, 1200)
    led = SqliteLedger.open_readonly(db, run)
    built = counting(monkeypatch)

    rows = led.iter_list(limit=1_000_000)
    assert built[0] == 0
    first = next(rows)

    assert first.id == 1200
    assert 0 < built[0] <= reader.BATCH
    assert [r.id for r in rows] == list(range(1199, 0, -1))
    assert built[0] == 1200


def test_iter_list_with_a_pending_record_is_lazy_too_and_in_lists_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, run = tmp_path / "ledger.db", tmp_path / "run"
    fill(db, run, 1200)
    ro = ReadOnly()
    led = SqliteLedger(db, run, log=Log(), connect_hook=ro)
    ro.on = True
    led.close()
    late = make_record(5000)
    late.started_at = T0 + timedelta(minutes=600, seconds=30)  # between rows 600 and 601
    assert led.begin(late) < 0  # pending in the spool
    reading = SqliteLedger.open_readonly(db, run)
    built = counting(monkeypatch)

    rows = reading.iter_list(limit=1_000_000)
    first = next(rows)

    assert first.id == 1200
    assert 0 < built[0] <= reader.BATCH + 1  # the rows of one batch, and the pending record
    ids = [first.id] + [r.id for r in rows]
    assert ids == [*range(1200, 600, -1), late.id, *range(600, 0, -1)]
    assert ids == [r.id for r in reading.list(limit=1_000_000)]


def peak_rss_mib(argv: list[str], env: dict[str, str], out: Path) -> float:
    """Run ``argv`` with its stdout in ``out``; return its peak resident memory (its own, by wait4)."""
    with open(out, "wb") as f:
        p = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.PIPE)
        try:
            _pid, status, usage = os.wait4(p.pid, 0)
        finally:
            if p.returncode is None and p.poll() is None:
                p.kill()
                p.wait()
        p.returncode = os.waitstatus_to_exitcode(status)
        assert p.stderr is not None
        err = p.stderr.read().decode()
        p.stderr.close()
    assert p.returncode == 0, err
    return usage.ru_maxrss / 1024  # KiB on Linux


def test_ledger_json_prints_8000_rows_in_the_memory_of_one(tmp_path: Path) -> None:
    state, run = tmp_path / "state", tmp_path / "run"
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text(
        f'[daemon]\nstate_dir = "{state}"\nruntime_dir = "{run}"\n'
        '[backends.llama]\nunit = "gpushift-llama.service"\nhealth_url = "http://127.0.0.1:8080/health"\n'
    )
    rows = 8_000
    fill(state / "ledger.db", run, rows)
    gpushift = shutil.which("gpushift", path=str(Path(sys.executable).parent))
    assert gpushift is not None, "the gpushift command of this environment"
    env = dict(os.environ, GPUSHIFT_CONFIG=str(cfg))

    one = peak_rss_mib([gpushift, "ledger", "--json", "-n", "1"], env, tmp_path / "one.json")
    every = peak_rss_mib([gpushift, "ledger", "--json", "-n", "1000000"], env, tmp_path / "all.json")

    items = json.loads((tmp_path / "all.json").read_text())
    assert len(items) == rows and items[0]["id"] == rows and items[-1]["id"] == 1
    assert json.loads((tmp_path / "one.json").read_text()) == items[:1]
    # 8,000 records held at once took 300 MiB (20,000: 750 MiB); a batch of them takes a few.
    print(f"peak RSS {every:.0f} MiB for {rows} rows, {one:.0f} MiB for one")
    assert every - one < 40, f"peak RSS {every:.0f} MiB for {rows} rows, {one:.0f} MiB for one"


def test_the_table_takes_at_most_its_maximum_and_json_more(tmp_path: Path) -> None:
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text(
        f'[daemon]\nstate_dir = "{tmp_path}/state"\nruntime_dir = "{tmp_path}/run"\n'
        '[backends.llama]\nunit = "gpushift-llama.service"\nhealth_url = "http://127.0.0.1:8080/health"\n'
    )

    def cli(*args: str) -> Any:
        return CliRunner().invoke(ledger, list(args), obj={"config_path": str(cfg)}, catch_exceptions=False)

    too_many = cli("-n", str(TEXT_LIMIT_MAX + 1))
    assert too_many.exit_code == 2 and "Error: Invalid value" in too_many.output
    assert f"at most {TEXT_LIMIT_MAX}" in too_many.output and "--json" in too_many.output
    assert cli("-n", str(TEXT_LIMIT_MAX)).exit_code == 0
    streamed = cli("--json", "-n", str(TEXT_LIMIT_MAX + 1))
    assert streamed.exit_code == 0 and json.loads(streamed.output) == []
    assert f"at most {TEXT_LIMIT_MAX:,}" in cli("--help").output

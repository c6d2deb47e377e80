"""`gpushift ledger verify` on a bad ledger, as a person runs it (a real process): one line on
stderr, exit 11, naming what is wrong and that the daemon did not record it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ledger_support import Log, finish, make_record, sqlite3_tool

from gpushift.ledger import SqliteLedger


def setup(base: Path) -> tuple[Path, Path, Path]:
    """A config in ``base`` and a ledger with three finished rows; returns (config, db, run)."""
    state, run = base / "state", base / "run"
    cfg = base / "gpushift.toml"
    cfg.write_text(
        f'[daemon]\nstate_dir = "{state}"\nruntime_dir = "{run}"\n'
        '[backends.llama]\nunit = "llama.service"\nhealth_url = "http://127.0.0.1:1/health"\n'
    )
    led = SqliteLedger(state / "ledger.db", run, log=Log())
    for i in range(3):
        rec = make_record(i)
        led.begin(rec)
        finish(led, rec)
    led.close()
    return cfg, state / "ledger.db", run


def gpushift(cfg: Path, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GPUSHIFT_CONFIG=str(cfg))
    return subprocess.run(
        [*prefix, sys.executable, "-c", "from gpushift.cli import main; main()", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_one_line_failure(r: subprocess.CompletedProcess[str], *words: str) -> None:
    assert r.returncode != 0, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for w in words:
        assert w in lines[0], lines[0]


def test_ledger_cli_verify_newest_row_deleted_is_a_break_nobody_recorded(tmp_path: Path) -> None:
    cfg, db, run = setup(tmp_path)
    led = SqliteLedger(db, run, log=Log())
    led.begin(make_record(3))  # row 4, an insert that completed
    led.close()
    sqlite3_tool(db, "DELETE FROM switches WHERE id = 4")
    assert_one_line_failure(
        gpushift(cfg, "ledger", "verify"), "not recorded by the daemon", "rows missing after row 3"
    )


def test_ledger_cli_verify_an_edited_row_names_the_hash_mismatch(tmp_path: Path) -> None:
    cfg, db, _run = setup(tmp_path)
    sqlite3_tool(db, "UPDATE switches SET reason = 'edited' WHERE id = 2")
    assert_one_line_failure(
        gpushift(cfg, "ledger", "verify"), "not recorded by the daemon", "hash mismatch at row 2"
    )

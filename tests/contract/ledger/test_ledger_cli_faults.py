"""`gpushift ledger` on a bad ledger, as a person runs it (a real process): every command on a file
that is not a database, cannot be read or was deleted exits non-zero with one line on stderr; verify
names every break, and says whether the daemon recorded it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ledger_support import GARBAGE, Log, finish, make_record, put_garbage, sqlite3_tool

from gpushift.ledger import SqliteLedger

#: Runs a command as user nobody, without root's groups (the tests run as root).
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

COMMANDS = [
    ["ledger"],
    ["ledger", "--json"],
    ["ledger", "show", "1"],
    ["ledger", "diff"],
    ["ledger", "export", "--format", "markdown"],
    ["ledger", "export", "--format", "jsonl"],
    ["ledger", "verify"],
    ["ledger", "verify", "--json"],
]


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


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[1:]) or "list")
def test_ledger_cli_on_a_file_that_is_not_a_database(tmp_path: Path, args: list[str]) -> None:
    cfg, db, _run = setup(tmp_path)
    put_garbage(db)
    assert_one_line_failure(gpushift(cfg, *args), "is not a database", str(db))
    assert db.read_bytes() == GARBAGE  # a reader never moves or repairs anything


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[1:]) or "list")
@pytest.mark.parametrize("what", ["file", "directory"])
def test_ledger_cli_on_a_database_it_may_not_read(shared_dir: str, args: list[str], what: str) -> None:
    cfg, db, _run = setup(Path(shared_dir))
    # root's, and nobody is not in its group: either the file or its directory is closed to it
    os.chmod(db.parent, 0o755 if what == "file" else 0o750)
    os.chmod(db, 0o600)
    assert_one_line_failure(gpushift(cfg, *args, prefix=tuple(AS_NOBODY)), "permission denied", str(db))


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[1:]) or "list")
def test_ledger_cli_on_a_deleted_database(tmp_path: Path, args: list[str]) -> None:
    cfg, db, _run = setup(tmp_path)
    for p in db.parent.glob("ledger.db*"):
        p.unlink()
    assert_one_line_failure(gpushift(cfg, *args), str(db), "missing")


def test_ledger_cli_verify_a_break_the_daemon_recorded(tmp_path: Path) -> None:
    cfg, db, run = setup(tmp_path)
    put_garbage(db)
    led = SqliteLedger(db, run, log=Log())  # the daemon's next start
    rec = make_record(4)
    led.begin(rec)
    finish(led, rec)
    led.close()
    r = gpushift(cfg, "ledger", "verify")
    assert_one_line_failure(
        r, "chain break recorded by the daemon at row 1", "not a database", "ledger.db.corrupt-"
    )
    listed = gpushift(cfg, "ledger")
    assert listed.returncode == 0 and "(new chain)" in listed.stdout and "chain_break" in listed.stdout
    only = gpushift(cfg, "ledger", "--outcome", "chain_break", "--json")
    assert only.returncode == 0 and '"chain_break"' in only.stdout and "ticket-4" not in only.stdout


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

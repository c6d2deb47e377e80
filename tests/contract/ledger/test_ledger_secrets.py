"""Credentials and escape sequences in the ledger, on a real SQLite file read through `gpushift
ledger` (click's CliRunner):

* a new row stores a digest in place of each credential (argv, environment, a holder's command
  line, a URL's password), never the value — nor does the pending spool;
* a row written before that (raw values; the writer's redaction switched off to make one) is NEVER
  rewritten: its hash chain still verifies, and every output format redacts it on the way out;
* ``ledger diff`` still shows that a key changed, and shows no change between an old raw row and a
  new digested row of the same key;
* escape sequences in a row (a reason, a version, a holder) reach no output raw; JSON keeps them as
  JSON escapes; colour only on a terminal and never with NO_COLOR.
"""

from __future__ import annotations

import json
import re
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from gpushift.cli.ledger import ledger
from gpushift.ledger import SqliteLedger, rows, spool
from gpushift.safetext import redact
from gpushift.values import SwitchRecord

T0 = datetime(2025, 3, 1, 8, 0, tzinfo=timezone.utc)
KEY_OLD, KEY_NEW, TOKEN = "sk-old-s3cret", "sk-new-s3cret", "hf_tok3n"
SECRETS = (KEY_OLD, KEY_NEW, TOKEN, "pr0bepw")
ESC = "\x1b]52;c;ZXZpbA==\x07\x1b[2J"
SGR = re.compile(r"\x1b\[[0-9;]*m")


def argv(key: str) -> list[str]:
    return ["/usr/bin/vllm", "serve", "/models/q", "--api-key", key, "--port", "8000"]


def record(i: int, key: str, reason: str = "day", version: str = "0.8.1") -> SwitchRecord:
    rec = SwitchRecord(
        trigger="manual",
        requested_by="alice",
        reason=reason,
        from_backend=None,
        to_backend="vllm",
        started_at=T0 + timedelta(hours=i),
        ticket=f"t{i}",
        unit="gpushift-vllm.service",
        argv_configured=argv(key),
        argv_running=argv(key),
        backend_version=version,
        gpushift_version="0.1.0",
    )
    rec.vram = {
        "before": [
            {
                "index": 0,
                "used_mib": 9000.0,
                "total_mib": 16384.0,
                "holders": [{"pid": 7, "command": "vllm" + ESC, "cmdline": argv(key), "user": "llm"}],
            }
        ]
    }
    rec.extra["launch"] = {
        "unit": {"environment": {"HF_TOKEN": TOKEN, "VLLM_PORT": "8000"}},
        "health": "http://probe:pr0bepw@127.0.0.1:8000/health",
    }
    rec.outcome = "ok"
    rec.finished_at = rec.started_at + timedelta(seconds=30)
    return rec


def write(led: SqliteLedger, rec: SwitchRecord) -> None:
    led.begin(rec)
    led.finish(rec)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    state, run = tmp_path / "state", tmp_path / "run"
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text(
        f'[daemon]\nbus = "session"\nstate_dir = "{state}"\nruntime_dir = "{run}"\n[gpu]\nprovider = "simulated"\n'
        '[backends.vllm]\nunit = "gpushift-vllm.service"\nhealth_url = "http://127.0.0.1:8000/health"\n'
    )
    db = state / "ledger.db"
    led = SqliteLedger(db, run, log=lambda event, **kw: None)
    with monkeypatch.context() as m:  # two rows as an older gpushift wrote them
        m.setattr(
            rows, "redacted", dict, raising=False
        )  # the writer before redaction (raising=False: red check)
        write(led, record(0, KEY_OLD, reason="first" + ESC, version="0.8.1" + ESC))
        write(led, record(1, KEY_OLD))
    write(led, record(2, KEY_OLD))  # the same key, now stored as its digest
    write(led, record(3, KEY_NEW))  # a new key
    led.close()
    return {"config": str(cfg), "db": db, "run": run}


def cli(
    env: dict[str, Any], *args: str, color: bool = False, environ: dict[str, str] | None = None
) -> Result:
    return CliRunner().invoke(
        ledger,
        list(args),
        obj={"config_path": env["config"]},
        color=color,
        env=environ,
        catch_exceptions=False,
    )


def stored(env: dict[str, Any]) -> list[str]:
    with sqlite3.connect(env["db"]) as c:
        return [r[0] for r in c.execute("SELECT record FROM switches ORDER BY id")]


def raw_controls(text: str) -> list[str]:
    return [c for c in SGR.sub("", text) if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F]


def test_ledger_new_rows_store_digests_old_rows_stay_as_written(env: dict[str, Any]) -> None:
    old1, old2, new1, new2 = stored(env)
    assert KEY_OLD in old1 and TOKEN in old1  # never rewritten
    for text in (new1, new2):
        assert not any(s in text for s in SECRETS)
    assert redact.digest(KEY_OLD) in new1 and redact.digest(KEY_NEW) in new2
    assert redact.digest(TOKEN) in new1 and "http://***@127.0.0.1" in new1
    res = cli(env, "verify")
    assert res.exit_code == 0, res.output  # the chain over old and new rows is intact


@pytest.mark.parametrize(
    "args",
    [
        ("--json",),
        (),
        ("show", "1"),
        ("show", "1", "--json"),
        ("diff",),
        ("diff", "1", "4", "--json"),
        ("export", "--format", "jsonl"),
        ("export", "--format", "markdown"),
    ],
)
def test_ledger_no_output_shows_a_secret_or_a_raw_escape(env: dict[str, Any], args: tuple[str, ...]) -> None:
    res = cli(env, *args)
    assert res.exit_code == 0, res.output
    assert not any(s in res.output for s in SECRETS), res.output
    assert raw_controls(res.output) == [], res.output


def test_ledger_json_keeps_escape_sequences_as_json_escapes(env: dict[str, Any]) -> None:
    row = json.loads(cli(env, "show", "1", "--json").output)
    assert row["reason"] == "first" + ESC and row["backend_version"] == "0.8.1" + ESC
    assert row["argv"][4] == redact.digest(KEY_OLD)  # the old row, digested on the way out
    for line in cli(env, "export", "--format", "jsonl").output.splitlines():
        json.loads(line)


def test_ledger_text_shows_escape_sequences_as_text(env: dict[str, Any]) -> None:
    out = cli(env, "show", "1").output
    assert "first\\x1b]52;c;ZXZpbA==\\x07\\x1b[2J" in out and "0.8.1\\x1b]52" in out
    assert "pid 7 vllm\\x1b]52" in out  # a holder's process name
    assert "first\\x1b]52" in cli(env).output


def test_ledger_diff_shows_a_changed_key_by_digest_and_no_change_for_the_same_key(
    env: dict[str, Any],
) -> None:
    changes = json.loads(cli(env, "diff", "3", "4", "--json").output)["changes"]
    assert {k: changes[0][k] for k in ("area", "change", "name")} == {
        "area": "flag",
        "change": "changed",
        "name": "--api-key",
    }
    assert changes[0]["old"] == redact.digest(KEY_OLD) and changes[0]["new"] == redact.digest(KEY_NEW)
    assert "--api-key" in cli(env, "diff", "3", "4").output
    # an old raw row against a new digested row of the same key: nothing changed
    assert json.loads(cli(env, "diff", "2", "3", "--json").output)["changes"] == []


def test_ledger_list_colours_outcomes_only_on_a_terminal_and_never_with_no_color(env: dict[str, Any]) -> None:
    plain = cli(env).output
    assert not SGR.search(plain)
    coloured = cli(env, color=True).output
    assert "\x1b[32mok\x1b[0m" in coloured and SGR.sub("", coloured) == plain
    assert not SGR.search(cli(env, color=True, environ={"NO_COLOR": "1"}).output)


def test_ledger_pending_spool_holds_no_secret(tmp_path: Path) -> None:
    def broken(conn: sqlite3.Connection) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    logged: list[dict[str, Any]] = []
    led = SqliteLedger(
        tmp_path / "ledger.db",
        tmp_path / "run",
        log=lambda event, **kw: logged.append(kw),
        connect_hook=broken,
    )
    rec = record(0, KEY_NEW)
    write(led, rec)
    assert rec.id is not None and rec.id < 0  # provisional: it waits in the spool
    files = list((tmp_path / "run" / spool.SPOOL_SUBDIR).iterdir())
    assert files
    for f in files:
        text = f.read_text()
        assert redact.digest(KEY_NEW) in text and not any(s in text for s in SECRETS)
    assert not any(s in json.dumps(logged, default=str) for s in SECRETS)

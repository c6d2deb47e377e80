"""``gpushift fleet status | ledger | verify`` as a person runs them, against a real PostgreSQL that
two hosts' mirrors wrote to (the commands read only the database)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fleet_support import PASSWORD, Host

from gpushift.config.mirror import MirrorConfig
from tests.support.pgcluster import PgCluster

GPUSHIFT = str(Path(sys.executable).parent / "gpushift")
BACKEND = '[backends.a]\nunit = "a.service"\nhealth_url = "http://127.0.0.1:8001/health"\n'


def config(tmp_path: Path, m: MirrorConfig, stale_after_s: float = 120) -> Path:
    p = tmp_path / "gpushift.toml"
    p.write_text(
        f'[mirror]\nurl = "{m.url}"\npassword_file = "{m.password_file}"\nstale_after_s = {stale_after_s}\n{BACKEND}'
    )
    return p


def fleet(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["GPUSHIFT_CONFIG"] = str(cfg)
    return subprocess.run([GPUSHIFT, "fleet", *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def two_hosts(pg: PgCluster, mirror_config: MirrorConfig, tmp_path: Path) -> tuple[Host, Host]:
    a = Host(tmp_path / "a", mirror_config, "gpu-a")
    b = Host(tmp_path / "b", mirror_config, "gpu-b")
    for i in range(3):
        a.switch(i)
    for i in range(10, 12):
        b.switch(i, outcome="failed")
    a.cycle()
    b.cycle()
    return a, b


def test_status_and_ledger_show_both_hosts(
    two_hosts: tuple[Host, Host], mirror_config: MirrorConfig, tmp_path: Path
) -> None:
    cfg = config(tmp_path, mirror_config)
    r = fleet(cfg, "status", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [h["host"] for h in doc["hosts"]] == ["gpu-a", "gpu-b"]
    assert all(not h["stale"] and h["serving"] == "day" for h in doc["hosts"])
    # Both fake hosts name one machine-id: the command reports it.
    assert doc["machine_id_shared"] == [{"machine_id": "ab" * 16, "hosts": ["gpu-a", "gpu-b"]}]
    text = fleet(cfg, "status")
    assert text.returncode == 0 and "gpu-a" in text.stdout and "machine-id" in text.stdout
    rows = json.loads(fleet(cfg, "ledger", "--json").stdout)
    assert [(r["host"], r["id"]) for r in rows] == [
        ("gpu-b", 2),
        ("gpu-b", 1),
        ("gpu-a", 3),
        ("gpu-a", 2),
        ("gpu-a", 1),
    ]
    assert rows[0]["reason"] == "switch 11"  # the record as it is
    only_b = json.loads(fleet(cfg, "ledger", "--host", "gpu-b", "--json", "--limit", "1").stdout)
    assert [(r["host"], r["id"]) for r in only_b] == [("gpu-b", 2)]
    failed = json.loads(fleet(cfg, "ledger", "--outcome", "failed", "--json").stdout)
    assert {r["host"] for r in failed} == {"gpu-b"}
    since = json.loads(fleet(cfg, "ledger", "--since", "2026-03-01T08:05Z", "--json").stdout)
    assert {r["reason"] for r in since} == {"switch 10", "switch 11"}
    table = fleet(cfg, "ledger")
    assert table.returncode == 0 and "gpu-a" in table.stdout and "failed" in table.stdout


def test_verify_passes_then_names_an_altered_a_deleted_and_a_reordered_row(
    pg: PgCluster, two_hosts: tuple[Host, Host], mirror_config: MirrorConfig, tmp_path: Path
) -> None:
    cfg = config(tmp_path, mirror_config)
    ok = fleet(cfg, "verify")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "fleet verify ok: 2 host(s), 2 chain(s), 5 row(s)" in ok.stdout
    pg.sql("UPDATE gpushift_ledger SET to_backend = 'evil' WHERE host = 'gpu-a' AND id = 2", db="fleet")
    pg.sql("DELETE FROM gpushift_ledger WHERE host = 'gpu-b' AND id = 1", db="fleet")
    pg.sql("UPDATE gpushift_ledger SET seq = 1 WHERE host = 'gpu-a' AND id = 3", db="fleet")
    bad = fleet(cfg, "verify")
    assert bad.returncode == 1, bad.stdout
    assert "gpu-a chain" in bad.stdout and "row 2 altered: its to_backend column differs" in bad.stdout
    assert "gpu-b chain" in bad.stdout and "row 1 missing" in bad.stdout
    assert "row 3 out of order: it reached the central table before row 2" in bad.stdout
    doc = json.loads(fleet(cfg, "verify", "--json").stdout)
    assert doc["ok"] is False and sum(len(c["problems"]) for c in doc["chains"]) == 3
    # The last rows deleted: the host's state says what was sent.
    pg.sql("DELETE FROM gpushift_ledger WHERE host = 'gpu-b' AND id = 2", db="fleet")
    assert (
        "rows 1-2 missing: the host's mirror sent up to row 2"
        in fleet(cfg, "verify", "--host", "gpu-b").stdout
    )


def test_a_host_whose_state_is_old_is_stale(
    pg: PgCluster, two_hosts: tuple[Host, Host], mirror_config: MirrorConfig, tmp_path: Path
) -> None:
    cfg = config(tmp_path, mirror_config, stale_after_s=5)
    pg.sql(
        "UPDATE gpushift_host_state SET updated_at = now() - interval '10 seconds' WHERE host = 'gpu-b'",
        db="fleet",
    )
    doc = json.loads(fleet(cfg, "status", "--json").stdout)
    assert {h["host"]: h["stale"] for h in doc["hosts"]} == {"gpu-a": False, "gpu-b": True}
    assert "stale" in fleet(cfg, "status").stdout


def test_a_database_that_cannot_be_reached_is_one_line(
    pg: PgCluster, mirror_config: MirrorConfig, tmp_path: Path
) -> None:
    cfg = config(tmp_path, mirror_config)
    empty = fleet(cfg, "status")
    assert empty.returncode == 12 and "no gpushift tables yet" in empty.stderr
    pg.stop_server()
    for args in (("status",), ("ledger",), ("verify",)):
        r = fleet(cfg, *args)
        assert r.returncode == 12, (args, r.stdout, r.stderr)
        assert r.stderr.startswith("gpushift fleet: cannot reach the central database gs@127.0.0.1:")
        assert "Traceback" not in r.stderr and PASSWORD not in r.stderr + r.stdout
        assert len(r.stderr.strip().splitlines()) == 1
    other = fleet(cfg, "status", "--url", "postgresql://gs@127.0.0.1:1/nothing")
    assert other.returncode == 12 and "gs@127.0.0.1:1/nothing" in other.stderr


def test_no_mirror_configured_says_so(tmp_path: Path) -> None:
    p = tmp_path / "gpushift.toml"
    p.write_text(BACKEND)
    r = fleet(p, "status")
    assert r.returncode == 12 and "set [mirror] url" in r.stderr


def rows_of(doc: Any) -> int:
    return sum(c["rows"] for c in doc["chains"])

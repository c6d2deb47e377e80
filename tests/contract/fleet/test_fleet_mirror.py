"""The mirror against a real PostgreSQL and a real SQLite ledger: in order, idempotent, resumable,
the host's known changes carried, every other difference reported and left as it is.

The mirror's cycle is driven by hand here (``Mirror._cycle``: what its thread runs), so each step is
deterministic; the thread itself is shown in the last test and in tests/integration/test_fleet_e2e.py.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from fleet_support import PASSWORD, T0, Host, Log

from gpushift.config.mirror import MirrorConfig
from gpushift.fleet.position import FILE_NAME
from gpushift.ledger import SqliteLedger
from tests.support.pgcluster import PgCluster


def central(pg: PgCluster, host: str = "gpu-1") -> list[tuple[Any, ...]]:
    return pg.sql("SELECT id, outcome, hash, prev_hash, chain, seq FROM gpushift_ledger WHERE host = %s "
                  "ORDER BY chain, id", (host,), db="fleet")  # fmt: skip


def local(h: Host) -> list[tuple[Any, ...]]:
    return [(r["id"], r["outcome"], r["hash"], r["prev_hash"]) for r in h.mirror.local.rows_from(1, 10_000)]


def same_rows(pg: PgCluster, h: Host) -> bool:
    return [c[:4] for c in central(pg, h.name)] == local(h)


def test_rows_go_in_order_and_once_and_a_restart_resumes(
    pg: PgCluster, mirror_config: MirrorConfig, tmp_path: Path
) -> None:
    h = Host(tmp_path, mirror_config)
    for i in range(20):
        h.switch(i)
    h.cycle()
    rows = central(pg)
    assert [r[0] for r in rows] == list(range(1, 21))
    assert [r[5] for r in rows] == sorted(r[5] for r in rows)  # received in id order
    assert same_rows(pg, h)
    pos = json.loads((h.state / FILE_NAME).read_text())
    assert pos["sent"] == 20 and pos["chain"] == rows[0][4]
    # A restart resumes where it stopped; a position lost sends everything again: still one row each.
    for i in range(20, 25):
        h.switch(i)
    h.mirror = h.new_mirror()
    h.cycle()
    (h.state / FILE_NAME).unlink()
    h.mirror = h.new_mirror()
    h.cycle()
    assert [r[0] for r in central(pg)] == list(range(1, 26))
    assert same_rows(pg, h)
    assert h.mirror.status()["lag_rows"] == 0 and not h.mirror.problems
    assert pg.sql("SELECT count(*) FROM gpushift_chains", db="fleet") == [(1,)]


def test_a_finished_intent_row_and_a_relink_are_carried(
    pg: PgCluster, mirror_config: MirrorConfig, tmp_path: Path
) -> None:
    h = Host(tmp_path, mirror_config)
    h.switch(0)
    h.switch(1, outcome=None)  # the intent row, sent while pending
    h.cycle()
    assert [r[1] for r in central(pg)] == ["ok", "pending"]
    h.led.mark_interrupted(T0 + timedelta(hours=1))  # the next daemon closes it
    h.cycle()
    assert [r[1] for r in central(pg)] == ["ok", "interrupted"] and same_rows(pg, h)
    # A pending row in the middle of the chain: its rewrite re-links every row after it.
    pending = h.switch(2, outcome=None)
    h.switch(3)
    h.switch(4)
    h.cycle()
    pending.outcome, pending.finished_at = "ok", pending.started_at + timedelta(seconds=5)
    h.led.finish(pending)  # a late finish (a replay after a full disk)
    assert not same_rows(pg, h)
    h.cycle()
    assert same_rows(pg, h), (central(pg), local(h))
    assert not h.mirror.problems and not pg.sql("SELECT * FROM gpushift_reports", db="fleet")
    ok = [r for r in pg.sql("SELECT id, updated_at FROM gpushift_ledger ORDER BY id", db="fleet")]
    assert ok[2][1] is not None  # carried as an update of the same row


def test_a_database_that_is_down_only_makes_the_mirror_lag(
    pg: PgCluster, mirror_config: MirrorConfig, tmp_path: Path
) -> None:
    h = Host(tmp_path, mirror_config)
    h.switch(0)
    h.cycle()
    pg.stop_server()
    for i in range(1, 6):
        h.switch(i)
    started = time.monotonic()
    h.cycle()
    assert time.monotonic() - started < mirror_config.connect_timeout_s * 3 + 5  # a deadline, not a hang
    st = h.mirror.status()
    assert st["state"] == "unavailable" and st["lag_rows"] == 5 and st["error"]
    assert PASSWORD not in json.dumps(st)
    assert h.log.events("mirror_unavailable")
    pg.start()
    h.cycle()
    assert same_rows(pg, h) and h.mirror.status()["lag_rows"] == 0
    assert h.log.events("mirror_reachable")


def test_a_central_row_altered_or_deleted_is_reported_not_overwritten(
    pg: PgCluster, mirror_config: MirrorConfig, tmp_path: Path
) -> None:
    h = Host(tmp_path, mirror_config)
    for i in range(6):
        h.switch(i)
    h.cycle()
    pg.sql(
        "UPDATE gpushift_ledger SET record = jsonb_set(record, '{reason}', '\"edited\"') WHERE id = 2",
        db="fleet",
    )
    pg.sql("UPDATE gpushift_ledger SET outcome = 'failed' WHERE id = 3", db="fleet")
    pg.sql("DELETE FROM gpushift_ledger WHERE id = 4", db="fleet")
    h.cycle()
    kinds = sorted((p["kind"], p["row"]) for p in h.mirror.problems)
    assert kinds == [("mismatch", 2), ("mismatch", 3), ("missing", 4)], h.mirror.problems
    assert "record differs" in h.mirror.problems[0]["what"] or "record differs" in str(h.mirror.problems)
    assert pg.sql("SELECT record->>'reason', outcome FROM gpushift_ledger WHERE id IN (2, 3) ORDER BY id", db="fleet") == [
        ("edited", "ok"), ("switch 2", "failed")]  # fmt: skip
    assert pg.sql("SELECT count(*) FROM gpushift_ledger WHERE id = 4", db="fleet") == [(0,)]
    reports = pg.sql("SELECT kind, id FROM gpushift_reports ORDER BY id", db="fleet")
    assert reports == [("mismatch", 2), ("mismatch", 3), ("missing", 4)]
    h.cycle()  # reported once, not at every audit
    assert len(pg.sql("SELECT * FROM gpushift_reports", db="fleet")) == 3
    assert len(h.log.events("mirror_mismatch")) == 3


def test_a_chain_break_starts_a_new_central_chain_and_a_replaced_ledger_is_reported(
    pg: PgCluster, mirror_config: MirrorConfig, tmp_path: Path
) -> None:
    h = Host(tmp_path, mirror_config)
    for i in range(3):
        h.switch(i)
    h.cycle()
    (h.state / "ledger.db").unlink()  # deleted under the writer: it records the break, a new chain starts
    h.switch(3)
    h.cycle()
    chains = pg.sql(
        "SELECT chain, chain_break IS NOT NULL FROM gpushift_chains ORDER BY first_seen", db="fleet"
    )
    assert [c[1] for c in chains] == [False, True]
    old, new = chains[0][0], chains[1][0]
    assert {(r[0], r[4]) for r in central(pg)} == {(1, old), (2, old), (3, old), (1, new), (2, new)}
    assert not h.mirror.problems
    # The ledger replaced by another file, with no break recorded: reported, mirrored as its own chain.
    h.led.close()
    for suffix in ("", "-wal", "-shm"):
        (h.state / f"ledger.db{suffix}").unlink(missing_ok=True)
    (h.state / "ledger.head").unlink()
    h.led = SqliteLedger(h.state / "ledger.db", spool_dir=tmp_path / "run2", log=Log(), group=None)
    h.switch(9)
    h.cycle()
    assert [p["kind"] for p in h.mirror.problems] == ["replaced"], h.mirror.problems
    assert len(pg.sql("SELECT * FROM gpushift_chains", db="fleet")) == 3


def has_state(pg: PgCluster) -> bool:
    if not pg.sql("SELECT to_regclass('gpushift_host_state') IS NOT NULL", db="fleet")[0][0]:
        return False  # the mirror has not created the schema yet
    return bool(pg.sql("SELECT state FROM gpushift_host_state", db="fleet"))


def test_the_thread_mirrors_and_writes_the_host_state(
    pg: PgCluster, mirror_config: MirrorConfig, tmp_path: Path
) -> None:
    h = Host(tmp_path, mirror_config)
    h.switch(0)
    h.mirror.start()
    try:
        h.mirror.poke(state=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not has_state(pg):
            time.sleep(0.1)
        h.switch(1)
        h.mirror.poke()
        while time.monotonic() < deadline and len(central(pg)) < 2:
            time.sleep(0.1)
    finally:
        h.mirror.stop()
    assert same_rows(pg, h)
    state = pg.sql("SELECT host, state FROM gpushift_host_state", db="fleet")
    assert state[0][0] == "gpu-1" and state[0][1]["serving"] == "day"
    assert state[0][1]["machine_id"] == "ab" * 16 and "mirror" in state[0][1]
    assert pg.sql("SELECT host, machine_id FROM gpushift_hosts", db="fleet") == [("gpu-1", "ab" * 16)]

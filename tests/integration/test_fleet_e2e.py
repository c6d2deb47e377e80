"""Issue 21's acceptance on real daemons: two hosts (two sandboxes, two host names) mirroring into a
real private PostgreSQL (tests/support/pgcluster.py, never the system's 15/main), and `gpushift fleet`.

* after switches on both, `fleet status` shows both hosts as they are and `fleet ledger` both's rows;
* PostgreSQL stopped during 20 switches on one host: every switch completes within the deadline a
  switch has with the database up, the mirror lags (status, /metrics), and once it is back every row
  is in the central table exactly once, in order, and `fleet verify` passes;
* a row altered and a row deleted centrally are named by `fleet verify`, and the daemon reports the
  mismatch without overwriting it;
* a stopped daemon's host is stale after `stale_after_s`;
* the password never appears in status, the journal, the ledger, `ps` output or an error message;
* two hosts with `stagger_s = 600` get different, stable offsets, shown by `schedule`, status and rows.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpushift_env import Backend, GpushiftEnv, free_port

from tests.support.pgcluster import PgCluster, PgMissing, private_cluster
from tests.support.sandbox import Sandbox, SandboxError

PASSWORD = "Fleet-pw-c0ffee-4711-never-shown"
#: How long one `gpushift switch` may take here, with the database up or down (the machine is busy).
SWITCH_DEADLINE_S = 60
#: Nothing is in effect but ``off`` (no switch at the daemon's start); its next change is a year away.
SCHEDULE = "0 20 * * * off\n0 8 1 1 * a\n"


@pytest.fixture
def pg() -> Iterator[PgCluster]:
    try:
        with private_cluster() as cluster:
            yield cluster
    except PgMissing as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture
def second_sandbox() -> Iterator[Sandbox]:
    """Another host: a second private systemd user manager, stopped whatever happens."""
    sb = Sandbox()
    try:
        try:
            sb.start()
        except SandboxError as e:
            pytest.fail(f"could not boot the second user manager: {e}", pytrace=False)
        yield sb
    finally:
        sb.stop()


def host(sb: Sandbox, name: str, url: str, schedule: bool = False, **opts: Any) -> GpushiftEnv:
    """A daemon named ``name`` mirroring to ``url``, its password in a file (``password_file``).

    (A systemd credential is read the same way, from ``$CREDENTIALS_DIRECTORY``: the sandbox's user
    manager sets that variable but does not load ``LoadCredential=`` files into it — systemd 252 in a
    container, measured — so tests/contract/fleet/test_fleet_schema.py shows the credential.)
    """
    base = Path(sb.base_dir) / name
    base.mkdir(parents=True)
    (base / "schedule").write_text(SCHEDULE)
    pw = base / "mirror.password"
    pw.write_text(PASSWORD + "\n")
    pw.chmod(0o600)
    # 20 switches in a row start each unit more often than systemd's default start limit allows
    # (5 in 10 s); the compatibility spelling in [Service] lifts it.
    burst = "StartLimitBurst=1000"
    a = Backend("a", free_port(), [0], version="1.0.0", vram_mib=4000, extra_service=burst)
    b = Backend("b", free_port(), [1], version="2.0.0", vram_mib=4000, extra_service=burst)
    opts.setdefault("reconcile_interval_s", 2)
    if schedule:
        opts["schedule"] = str(base / "schedule")
    env = GpushiftEnv(sb, base, [a, b], **opts)
    env.install()
    stale = opts.get("stale_after_s", 120)
    env.write_config(env.config_text() + f'\n[mirror]\nurl = "{url}"\npassword_file = "{pw}"\nhost_name = "{name}"\n'
                     f"stale_after_s = {stale}\nretry_s = 1\n")  # fmt: skip
    env.start_daemon()
    return env


def switch(env: GpushiftEnv, to: str) -> None:
    started = time.monotonic()
    r = env.cli("switch", to, "--now", timeout_s=SWITCH_DEADLINE_S + 30)
    took = time.monotonic() - started
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{env.daemon_log()[-3000:]}"
    assert took < SWITCH_DEADLINE_S, f"gpushift switch {to} took {took:.1f} s"


def fleet(env: GpushiftEnv, *args: str) -> subprocess.CompletedProcess[str]:
    return env.cli("fleet", *args, timeout_s=120)


def fleet_json(env: GpushiftEnv, *args: str) -> Any:
    r = fleet(env, *args, "--json")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    return json.loads(r.stdout)


def local_rows(env: GpushiftEnv) -> list[tuple[int, str]]:
    with sqlite3.connect(f"file:{env.state_dir / 'ledger.db'}?mode=ro", uri=True) as c:
        return [(int(i), str(h)) for i, h in c.execute("SELECT id, hash FROM switches ORDER BY id")]


def central_rows(pg: PgCluster, name: str) -> list[tuple[Any, ...]]:
    return pg.sql(
        "SELECT id, hash, seq FROM gpushift_ledger WHERE host = %s ORDER BY id", (name,), db="fleet"
    )


def mirror_of(env: GpushiftEnv) -> dict[str, Any]:
    return dict(env.status().get("mirror") or {})


def caught_up(env: GpushiftEnv, pg: PgCluster, name: str) -> bool:
    m = mirror_of(env)
    return (
        m.get("lag_rows") == 0
        and m.get("state") == "ok"
        and [r[:2] for r in central_rows(pg, name)] == local_rows(env)
    )


def test_two_hosts_in_one_record_stagger_stale_and_no_password_anywhere(
    sandbox: Sandbox, second_sandbox: Sandbox, pg: PgCluster
) -> None:
    url = pg.make_db("fleet", "gpushift", PASSWORD)
    stagger: dict[str, Any] = {"daemon_lines": ["stagger_s = 600"], "schedule": True, "stale_after_s": 5}
    one = host(sandbox, "gpu-a", url, **stagger)
    two = host(second_sandbox, "gpu-b", url, **stagger)
    for env, order in ((one, ("a", "b")), (two, ("b", "a"))):
        for to in order:
            switch(env, to)
    for env, name in ((one, "gpu-a"), (two, "gpu-b")):
        env.wait_for(lambda e=env, n=name: caught_up(e, pg, n), 60, f"{name}'s mirror to catch up")

    # fleet status shows both as they are; fleet ledger lists both hosts' rows.
    def both_current() -> bool:
        hosts = {h["host"]: h for h in fleet_json(one, "status")["hosts"]}
        return (
            hosts.keys() == {"gpu-a", "gpu-b"}
            and hosts["gpu-a"]["serving"] == "b"
            and hosts["gpu-b"]["serving"] == "a"
        )

    one.wait_for(both_current, 60, "fleet status to show both hosts serving")
    doc = fleet_json(two, "status")
    for h in doc["hosts"]:
        assert not h["stale"] and h["last_switch"]["outcome"] == "ok" and h["mirror"]["lag_rows"] == 0
    # One machine, two sandboxes: one machine-id, reported as a cloned image would be.
    assert [s["hosts"] for s in doc["machine_id_shared"]] == [["gpu-a", "gpu-b"]]
    rows = fleet_json(one, "ledger", "--limit", "50")
    assert {r["host"] for r in rows} == {"gpu-a", "gpu-b"}
    assert len([r for r in rows if r["host"] == "gpu-a"]) == len(local_rows(one))

    # Staggered: different, stable offsets, in schedule --json, status and every row.
    offsets = {}
    for env, name in ((one, "gpu-a"), (two, "gpu-b")):
        listed = json.loads(env.cli("schedule", "--json", "--next", "2", check=True).stdout)
        st = env.status()
        assert listed["stagger"] == st["stagger"] and st["stagger"]["host_name"] == name
        offsets[name] = st["stagger"]["offset_s"]
        off = offsets[name]
        assert all(n["utc"].endswith(f"{off // 60:02d}:{off % 60:02d}Z") for n in listed["next"]), listed[
            "next"
        ]
        assert st["schedule"]["next"]["at"].endswith(f":{off // 60:02d}:{off % 60:02d}+00:00")
        assert env.ledger()[0]["extra"]["stagger"] == st["stagger"]
    assert offsets == {"gpu-a": 514, "gpu-b": 123}

    # A stopped daemon: its host is stale after stale_after_s (5 s); the other is not.
    second_sandbox.systemctl("stop", "gpushift.service")

    def b_stale() -> bool:
        hosts = {h["host"]: h for h in fleet_json(one, "status")["hosts"]}
        return hosts["gpu-b"]["stale"] and not hosts["gpu-a"]["stale"]

    one.wait_for(b_stale, 60, "gpu-b to be stale and gpu-a not")
    assert "stale" in fleet(one, "status").stdout

    # The password: not in status, the journal, the ledger, ps, nor in an error.
    pg.stop_server()
    errors = [fleet(one, "status"), fleet(one, "verify"), one.cli("check")]
    one.wait_for(
        lambda: mirror_of(one).get("state") == "unavailable", 60, "the mirror to see the database down"
    )
    seen = {
        "status": one.cli("status").stdout + json.dumps(one.status()),
        "journal": json.dumps(one.daemon_journal()) + json.dumps(two.daemon_journal()),
        "ledger": one.cli("ledger", "--json", "--limit", "100").stdout + two.cli("ledger", "--json").stdout,
        "ps": subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True, check=True).stdout,
        "errors": "".join(r.stdout + r.stderr for r in errors),
        "config": one.config_path.read_text() + two.config_path.read_text(),
    }
    assert errors[0].returncode == 12 and "cannot reach the central database" in errors[0].stderr
    for where, text in seen.items():
        assert PASSWORD not in text, f"the password appears in {where}"


def test_database_down_during_20_switches_then_every_row_once_and_verify(
    sandbox: Sandbox, pg: PgCluster
) -> None:
    url = pg.make_db("fleet", "gpushift", PASSWORD)
    env = host(sandbox, "gpu-a", url)
    for to in ("a", "b"):
        switch(env, to)  # the deadline with the database up
    env.wait_for(lambda: caught_up(env, pg, "gpu-a"), 60, "the mirror to catch up")
    pg.stop_server()
    for i in range(20):
        switch(env, "a" if i % 2 == 0 else "b")  # the same deadline with it down
    m = mirror_of(env)
    assert m["state"] == "unavailable" and m["lag_rows"] >= 20 and m["error"], m
    with urllib.request.urlopen(env.metrics_url(), timeout=10) as r:
        metrics = r.read().decode()
    assert "gpushift_mirror_up 0.0" in metrics
    lag = next(
        float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith("gpushift_mirror_lag_rows ")
    )
    assert lag >= 20
    pg.start()
    env.wait_for(lambda: caught_up(env, pg, "gpu-a"), 90, "the mirror to catch up after the database is back")
    central = central_rows(pg, "gpu-a")
    assert [r[0] for r in central] == list(range(1, len(local_rows(env)) + 1))  # every row exactly once
    assert [r[2] for r in central] == sorted(r[2] for r in central)  # received in order
    ok = fleet(env, "verify")
    assert ok.returncode == 0 and "fleet verify ok: 1 host(s), 1 chain(s)" in ok.stdout, ok.stdout + ok.stderr

    # Altered and deleted centrally: verify names both; the daemon reports them, overwrites nothing.
    pg.sql(
        "UPDATE gpushift_ledger SET record = jsonb_set(record, '{reason}', '\"forged\"') WHERE id = 5",
        db="fleet",
    )
    pg.sql("DELETE FROM gpushift_ledger WHERE id = 7", db="fleet")
    bad = fleet(env, "verify")
    assert bad.returncode == 1
    assert "row 5 altered: its record differs" in bad.stdout and "row 7 missing" in bad.stdout, bad.stdout

    def reported() -> bool:
        kinds = {(p["kind"], p["row"]) for p in mirror_of(env).get("last_problems") or []}
        return {("mismatch", 5), ("missing", 7)} <= kinds

    env.wait_for(reported, 60, "the daemon to report the altered and the deleted row")
    assert env.daemon_journal("GPUSHIFT_EVENT=mirror_mismatch")
    assert "REPORTED mismatch" in env.cli("status").stdout
    switch(env, "a")  # the mirror goes on with new rows
    env.wait_for(lambda: mirror_of(env).get("lag_rows") == 0, 60, "the new row to be mirrored")
    assert pg.sql("SELECT record->>'reason' FROM gpushift_ledger WHERE id = 5", db="fleet") == [("forged",)]
    assert pg.sql("SELECT count(*) FROM gpushift_ledger WHERE id = 7", db="fleet") == [(0,)]
    kinds = {r[0] for r in pg.sql("SELECT kind FROM gpushift_reports", db="fleet")}
    assert {"mismatch", "missing"} <= kinds

"""`gpushift check` says whether the mirror's central database is reachable, against a real private
PostgreSQL (tests/support/pgcluster.py): reachable with its schema version, not reachable (the server
stopped; a wrong password) with the reason, as a warning that adds no error; the password never in
the output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from fleet_support import PASSWORD, Host

from gpushift.config.mirror import MirrorConfig
from tests.support.pgcluster import PgCluster

GPUSHIFT = str(Path(sys.executable).parent / "gpushift")


def config(tmp_path: Path, m: MirrorConfig, password_file: str | None = None) -> Path:
    p = tmp_path / "gpushift.toml"
    p.write_text(
        f'[daemon]\nbus = "session"\nstate_dir = "{tmp_path / "state"}"\nruntime_dir = "{tmp_path / "run"}"\n'
        '[gpu]\nprovider = "simulated"\n'
        f'[mirror]\nurl = "{m.url}"\npassword_file = "{password_file or m.password_file}"\n'
        "connect_timeout_s = 2\n"
        '[backends.a]\nunit = "a.service"\nhealth_url = "http://127.0.0.1:8001/health"\n'
    )
    return p


def check(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["GPUSHIFT_CONFIG"] = str(cfg)
    return subprocess.run([GPUSHIFT, "check", *args], env=env, capture_output=True, text=True, timeout=120)


def report(cfg: Path) -> tuple[dict[str, Any], str]:
    """The JSON report and the text report's output (stdout and stderr of both runs)."""
    j = check(cfg, "--json")
    t = check(cfg)
    return json.loads(j.stdout), j.stdout + j.stderr + t.stdout + t.stderr


def test_check_says_the_mirror_is_reachable_with_its_schema_version(
    pg: PgCluster, mirror_config: MirrorConfig, tmp_path: Path
) -> None:
    cfg = config(tmp_path, mirror_config)
    rep, out = report(cfg)
    where = f"gs@127.0.0.1:{pg.port}/fleet"
    assert rep["mirror"]["reachable"] is True and rep["mirror"]["schema_version"] == 0
    assert f"mirror    {where}: reachable, no gpushift schema yet" in out
    # check only reads: it created nothing
    assert pg.sql("SELECT to_regclass('gpushift_schema') IS NULL", db="fleet") == [(True,)]
    host = Host(tmp_path / "h", mirror_config)
    host.switch(1)
    host.cycle()  # the daemon's mirror creates the schema
    rep, out = report(cfg)
    assert rep["mirror"]["reachable"] is True and rep["mirror"]["schema_version"] == 1
    assert rep["mirror"]["findings"] == [] and rep["mirror"]["warnings"] == 0
    assert f"mirror    {where}: reachable, schema version 1 (" in out
    assert "mirror-unreachable" not in out
    assert PASSWORD not in out


def test_check_says_the_mirror_is_not_reachable_as_a_warning(
    pg: PgCluster, mirror_config: MirrorConfig, tmp_path: Path
) -> None:
    cfg = config(tmp_path, mirror_config)
    up, _ = report(cfg)
    pg.stop_server()
    rep, out = report(cfg)
    m = rep["mirror"]
    where = f"gs@127.0.0.1:{pg.port}/fleet"
    assert m["reachable"] is False and m["schema_version"] is None
    assert "refused" in m["error"] or "failed" in m["error"], m["error"]
    assert [(f["severity"], f["code"]) for f in m["findings"]] == [("warning", "mirror-unreachable")]
    # a warning: the errors (and so the exit status) are those of the reachable run, one warning more
    assert rep["errors"] == up["errors"] and rep["warnings"] == up["warnings"] + 1
    assert check(cfg).returncode == check(cfg, "--json").returncode
    assert f"mirror    {where}: NOT REACHABLE: " in out
    assert "warning [mirror-unreachable]" in out
    assert m["elapsed_s"] < 60  # bounded by connect_timeout_s, not hanging
    assert PASSWORD not in out


def test_check_names_a_refused_login_without_the_password(
    pg: PgCluster, mirror_config: MirrorConfig, tmp_path: Path
) -> None:
    wrong = "wrong-pw-5c1d9"
    (tmp_path / "wrong").write_text(wrong)
    rep, out = report(config(tmp_path, mirror_config, str(tmp_path / "wrong")))
    m = rep["mirror"]
    assert m["reachable"] is False and "password authentication failed" in m["error"], m["error"]
    assert wrong not in out and PASSWORD not in out

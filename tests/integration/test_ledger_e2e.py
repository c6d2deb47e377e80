"""Issue 4's acceptance on the real daemon: every field of a launch, diff across a drop-in change,
and no lost row when the state filesystem is full (a real size-limited tmpfs), also across a
SIGKILL of the daemon while degraded.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from gpushift_env import Backend, GpushiftEnv, free_port

from tests.support.diskfull import fill, sandbox_with_small_state


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cmdline(pid: int) -> list[str]:
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [a.decode() for a in raw.split(b"\0")[:-1]]


def test_ledger_records_every_field_and_diffs_a_dropin_change(sandbox):
    base = Path(sandbox.base_dir) / "gs"
    base.mkdir(parents=True)
    model = base / "tiny-Q4_K_M.gguf"
    with open(model, "wb") as f:  # 40 MiB, sparse: only head and tail are read
        f.write(b"GGUF" + b"\1" * 1020)
        f.seek(40 * 1024 * 1024 - 4)
        f.write(b"TAIL")
    a = Backend("a", free_port(), [0, 1], version="1.0.0", vram_mib=14500)
    b = Backend("b", free_port(), [1], version="2.5.0", vram_mib=6800, args=["--model", str(model)])
    env = GpushiftEnv(sandbox, base, [a, b]).up()
    env.cli("switch", "a", check=True)
    env.cli("switch", "b", "--reason", "first night", check=True)
    first = env.ledger()[0]["id"]
    # A person changes the unit with a drop-in: a new flag and a new version.
    unit_text = env.unit_text(b)
    exec_line = next(line for line in unit_text.splitlines() if line.startswith("ExecStart="))
    dropin = sandbox.install_dropin(
        b.unit,
        "10-tuning.conf",
        f"[Service]\nEnvironment=STANDIN_VERSION=2.6.0\nExecStart=\n{exec_line} --request-seconds 0.5\n",
    )
    sandbox.daemon_reload()
    env.cli("switch", "a", check=True)
    env.cli("switch", "b", "--reason", "more patience per request", check=True)
    row = env.ledger_row(env.ledger()[0]["id"])
    # argv exactly as systemd ran it, drop-in included
    assert row["argv_running"] == cmdline(env.main_pid(b.unit))
    assert "--request-seconds" in row["argv_running"] and "2.6.0" in row["argv_running"]
    assert row["backend_version"] == "2.6.0" and row["version_source"] == "url"
    launch = row["extra"]["launch"]
    assert launch["unit"]["environment"]["STANDIN_VERSION"] == "2.6.0"
    assert launch["unit"]["sha256"] == sha256(Path(env.sb.unit_dir) / b.unit)
    assert {"path": str(dropin), "sha256": sha256(dropin)}.items() <= launch["unit"]["drop_ins"][0].items()
    assert "working_directory" in launch["unit"] and "user" in launch["unit"]
    m = launch["models"][0]
    assert (
        m["path"] == str(model)
        and m["size_bytes"] == 40 * 1024 * 1024
        and m["fingerprint"].startswith("fp1:")
    )
    assert launch["host"]["hostname"] and launch["host"]["kernel"] == os.uname().release
    facts = row["gpu_facts"]
    assert facts["simulated"] is True and facts["driver_version"] and facts["cuda_version"]
    g = facts["gpus"][0]
    assert g["name"] and g["uuid"] and g["compute_capability"] == "7.0" and "ecc_uncorrected" in g
    assert row["requested_by"] == "root" and row["uid"] == 0 and row["reason"] == "more patience per request"
    assert set(row["vram"]) >= {"before", "released", "ready"}
    assert set(row["durations_s"]) >= {"preflight", "drain", "stop", "release", "start", "ready", "version"}
    # diff: the flag added in the drop-in and the version the backend reported
    d = env.cli("ledger", "diff", str(first), str(row["id"]), check=True).stdout
    assert "--request-seconds" in d and "2.5.0" in d and "2.6.0" in d, d
    d_all = env.cli("ledger", "diff", check=True).stdout
    assert "--request-seconds" in d_all
    md = env.cli("ledger", "export", "--format", "markdown", check=True).stdout
    assert "more patience per request" in md and "--request-seconds" in md
    assert env.cli("ledger", "verify", check=True).returncode == 0


@pytest.fixture
def full_disk_env():
    """A sandbox whose manager sees a 2 MiB tmpfs as the state dir."""
    with sandbox_with_small_state("gs-diskfull", 2) as env:
        yield env


def test_full_disk_switch_completes_degraded_and_lands_once_after_sigkill(full_disk_env):
    sb, root, state = full_disk_env
    a = Backend("a", free_port(), [0, 1], version="1.0.0")
    b = Backend("b", free_port(), [0, 1], version="2.0.0")
    env = GpushiftEnv(sb, root / "gs", [a, b], reconcile_interval_s=2)
    env.state_dir = state
    env.simdir = state / "simgpu"
    env.up()
    env.cli("switch", "a", check=True)
    filler = state / "filler"
    fill(filler)
    r = env.cli("switch", "b", "--reason", "disk is full")
    assert r.returncode == 0, r.stderr  # the switch still runs
    st = env.status()
    assert st["ledger"]["state"] == "degraded" and st["ledger"]["pending"] >= 1
    assert "degraded" in env.cli("status").stdout
    # ... and so does the unit's status line (sd_notify STATUS=), with the reason
    status_line = sb.show("gpushift.service", "StatusText")["StatusText"]
    assert "ledger: degraded (disk full" in status_line, status_line
    # the full record went to the daemon's log output as one structured line
    lines = [json.loads(x) for x in env.daemon_log().splitlines() if x.startswith("{")]
    pend = [x for x in lines if x.get("event") == "ledger_pending"]
    assert pend and "disk is full" in json.dumps(pend[-1])
    # ... and to the spool on another filesystem
    assert list((env.runtime_dir / "ledger-pending").glob("*.json"))
    # the daemon dies while degraded; systemd restarts it
    env.kill_daemon(30)
    filler.unlink()  # space is back
    env.wait_for(lambda: env.status()["ledger"]["state"] == "ok", 30, "the pending row to land")
    rows = env.ledger()
    mine = [
        x
        for x in rows
        if x.get("reason") == "disk is full" or env.ledger_row(x["id"])["reason"] == "disk is full"
    ]
    assert len(mine) == 1, rows
    assert mine[0]["outcome"] == "ok" and mine[0]["to"] == "b"
    assert not list((env.runtime_dir / "ledger-pending").glob("*.json"))
    assert env.cli("ledger", "verify").returncode == 0


def test_an_override_set_on_a_full_disk_survives_a_restart_and_lands_when_space_is_back(full_disk_env):
    """Found by the soak: the override could not be saved (disk full), a SIGKILL later the daemon
    read the OLDER override.json and switched back to what a person had switched away from."""
    sb, root, state = full_disk_env
    sched = root / "schedule"
    sched.write_text("TZ=UTC\n0 0 * * * a\n")  # a, all day
    a = Backend("a", free_port(), [0, 1], version="1.0.0")
    b = Backend("b", free_port(), [0, 1], version="2.0.0")
    env = GpushiftEnv(sb, root / "gs", [a, b], schedule=str(sched), reconcile_interval_s=2)
    env.state_dir = state
    env.simdir = state / "simgpu"
    env.up()
    env.wait_for(lambda: env.status()["active"] == "a", 30, "the schedule's a to serve")
    env.cli("switch", "b", check=True)  # override b, saved in the state directory
    filler = state / "filler"
    fill(filler)
    try:
        env.cli("switch", "a", "--reason", "back to a on a full disk", check=True)
        st = env.status()
        assert st["override"]["backend"] == "a"
        assert "No space left on device" in st["daemon"]["override_not_saved"]
        assert "override: NOT SAVED" in env.cli("status").stdout
        env.kill_daemon(30)
        env.wait_for(lambda: env.status()["daemon"].get("switch") is None, 30, "the daemon to be idle")
        time.sleep(5)  # two reconcile intervals: time for a wrong override to start a switch
        st = env.status()
        assert st["override"] and st["override"]["backend"] == "a", st["override"]  # not the older b
        assert env.active_state(a.unit) == "active" and env.active_state(b.unit) == "inactive"
    finally:
        filler.unlink(missing_ok=True)  # space is back
    env.wait_for(lambda: env.status()["daemon"]["override_not_saved"] is None, 30, "the override to be saved")
    assert json.loads((state / "override.json").read_text())["backend"] == "a"
    assert not (env.runtime_dir / "override.json").exists()

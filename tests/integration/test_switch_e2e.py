"""Issue 2's acceptance, end to end: the shipped gpushift.service under a real systemd user manager,
the real CLI over a real session bus, stand-in backends that are real HTTP servers holding
simulated GPU device files, found by the same /proc fd scan as on a real GPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from gpushift_env import GPUSHIFT, Backend, GpushiftEnv, end, free_port

from tests.support import busctl as bc


def make_env(sandbox, name: str, backends: list[Backend], **opts) -> GpushiftEnv:
    base = Path(sandbox.base_dir) / name
    return GpushiftEnv(sandbox, base, backends, **opts)


@pytest.fixture
def ab(sandbox):
    """Backends a (GPUs 0,1) and b (GPU 1) with A serving, daemon up."""

    def build(
        a_args=(), b_args=(), b_exec=None, b_timeout=20.0, b_kind="generic", a_timeout_stop=3, **opts
    ) -> GpushiftEnv:
        a = Backend(
            "a",
            free_port(),
            [0, 1],
            version="1.1.0",
            vram_mib=14500,
            args=list(a_args),
            timeout_stop_s=a_timeout_stop,
        )
        b = Backend(
            "b",
            free_port(),
            [1],
            version="2.5.0",
            vram_mib=6800,
            args=list(b_args),
            exec_start=b_exec,
            start_timeout_s=b_timeout,
            kind=b_kind,
        )
        env = make_env(sandbox, "gs", [a, b], **opts).up()
        env.cli("switch", "a", "--reason", "setup", check=True)
        assert env.active_state("gs-a.service") == "active"
        return env

    return build


def test_switch_a_to_b_records_launch(ab):
    env = ab()
    r = env.cli("switch", "b", "--reason", "night shift", check=True)
    # one line per phase with elapsed seconds
    assert "release" in r.stdout and "ready" in r.stdout, r.stdout
    assert "[" in r.stdout.splitlines()[0] and "s]" in r.stdout.splitlines()[0]
    assert env.active_state("gs-a.service") == "inactive"
    assert env.active_state("gs-b.service") == "active"
    st = env.status()
    assert st["active"] == "b"
    assert st["simulated"] is True
    assert st["daemon"]["running"] is True
    assert {"daemon", "active", "backends", "gpus", "simulated", "last_switch"} <= set(st)
    g1 = [g for g in st["gpus"] if g["index"] == 1][0]
    assert "SIMULATED" in g1["name"]
    assert [h["unit"] for h in g1["holders"]] == ["gs-b.service"]
    rows = env.ledger()
    row = rows[0]
    assert row["outcome"] == "ok" and row["from"] == "a" and row["to"] == "b"
    assert row["backend_version"] == "2.5.0"
    full = env.ledger_row(row["id"])
    # as configured: ${VAR} unexpanded; as run: expanded by systemd
    assert "${STANDIN_VERSION}" in full["argv_configured"]
    assert "2.5.0" in full["argv_running"] and "${STANDIN_VERSION}" not in full["argv_running"]
    assert full["requested_by"] == "root" and full["reason"] == "night shift"
    assert full["gpu_facts"]["simulated"] is True
    assert set(full["durations_s"]) >= {"preflight", "stop", "release", "start", "ready"}


def test_switch_to_active_backend_says_so(ab):
    env = ab()
    n = len(env.ledger())
    r = env.cli("switch", "a", check=True)
    assert "already active" in r.stdout
    assert len(env.ledger()) == n


def test_target_exits_at_once_is_noticed_and_rolled_back(ab):
    # B's "binary" exits at once; start_timeout_s is long, so only watching the unit can notice.
    env = ab(b_args=["--exit-at-once"], b_timeout=120)
    a_pid = env.main_pid("gs-a.service")
    t0 = time.monotonic()
    r = env.cli("switch", "b")
    took = time.monotonic() - t0
    assert r.returncode != 0, r.stdout
    assert "rolled_back" in r.stderr
    row = env.ledger()[0]
    assert row["outcome"] == "rolled_back"
    full = env.ledger_row(row["id"])
    assert full["failed_phase"] in ("ready", "start")
    assert full["systemd_result"] == "exit-code"
    assert full["durations_s"].get("ready", 0) < 5
    assert took < 60, f"the failed start was not noticed quickly ({took:.1f}s)"
    assert env.active_state("gs-a.service") == "active"
    assert env.main_pid("gs-a.service") != a_pid  # it was really stopped and started again
    assert env.status()["active"] == "a"


def test_target_never_ready_times_out_and_rolls_back(ab):
    env = ab(b_args=["--never-ready"], b_timeout=3)
    r = env.cli("switch", "b")
    assert r.returncode != 0
    row = env.ledger_row(env.ledger()[0]["id"])
    assert row["outcome"] == "rolled_back" and row["failed_phase"] == "ready"
    assert "within 3s" in row["message"]
    assert env.active_state("gs-a.service") == "active"
    assert env.active_state("gs-b.service") in ("inactive", "failed")


def test_foreign_holder_on_target_gpu_refuses_before_stopping(ab):
    env = ab()
    a_pid = env.main_pid("gs-a.service")
    holder = env.hold_device(1)
    try:
        env.wait_for(
            lambda: any(h["pid"] == holder.pid for g in env.status()["gpus"] for h in g.get("holders", [])),
            10,
            "the foreign holder to show",
        )
        r = env.cli("switch", "b")
        assert r.returncode != 0
        assert f"pid {holder.pid}" in r.stderr and "python" in r.stderr, r.stderr
        assert env.main_pid("gs-a.service") == a_pid  # never stopped
        assert env.active_state("gs-b.service") == "inactive"
        row = env.ledger()[0]
        assert row["outcome"] == "refused"
    finally:
        end(holder)


def test_foreign_holder_on_unused_gpu_does_not_block(ab):
    env = ab()
    holder = env.hold_device(0)  # b uses GPU 1 only
    try:
        env.wait_for(
            lambda: any(h["pid"] == holder.pid for g in env.status()["gpus"] for h in g.get("holders", [])),
            10,
            "the foreign holder to show",
        )
        r = env.cli("switch", "b", check=True)
        assert r.returncode == 0
        assert env.active_state("gs-b.service") == "active"
    finally:
        end(holder)


def test_orphan_outside_cgroup_keeps_gate_closed_and_nothing_starts(ab, sandbox):
    # On SIGTERM the stand-in leaves its orphan (systemd-run --scope) and waits up to 25 s for it to
    # hold the device before it exits; TimeoutStopSec=30 leaves that wait room on a busy machine.
    env = ab(a_args=["--orphan-on-sigterm", "{simdir}/nvidia1"], a_timeout_stop=30)
    r = env.cli("switch", "b", timeout_s=90)
    try:
        a_log = (env.base / "a.log").read_text(errors="replace") if (env.base / "a.log").exists() else ""
        assert r.returncode != 0, (
            f"{r.stdout}\n--- a's log:\n{a_log[-3000:]}\n--- daemon:\n{env.daemon_log()[-3000:]}"
        )
        assert "still held by pid" in r.stderr, r.stderr
        assert env.active_state("gs-a.service") in ("inactive", "failed")
        assert env.active_state("gs-b.service") in ("inactive", "failed")
        row = env.ledger_row(env.ledger()[0]["id"])
        assert row["outcome"] == "failed" and row["failed_phase"] == "release"
        assert "rollback to a impossible" in row["message"]
        st = env.status()
        assert st["active"] == "off"
        held = [h for g in st["gpus"] if g["index"] == 1 for h in g["holders"]]
        assert held and held[0]["unit"] != "gs-a.service"
        assert f"pid {held[0]['pid']}" in row["message"]
    finally:
        # the orphan runs in a transient scope of this sandbox's manager: stop it by its unit
        for line in sandbox.systemctl(
            "list-units", "--type=scope", "--no-legend", "--plain", check=False
        ).stdout.splitlines():
            if line.strip():
                sandbox.systemctl("stop", line.split()[0], check=False)


def test_backend_ignoring_sigterm_is_killed_and_switch_completes(ab):
    env = ab(a_args=["--ignore-sigterm"])
    r = env.cli("switch", "b", check=True)
    assert r.returncode == 0
    # systemd SIGKILLed it after TimeoutStopSec: the unit is "failed" with Result=timeout
    assert env.active_state("gs-a.service") == "failed"
    assert env.sb.show("gs-a.service", "Result")["Result"] == "timeout"
    assert env.active_state("gs-b.service") == "active"


def test_concurrent_switch_is_refused_with_switch_in_progress(ab):
    # a stop then takes TimeoutStopSec=15: room for a slow CLI start on a loaded machine
    env = ab(a_args=["--ignore-sigterm"], a_timeout_stop=15)
    n = len(env.ledger())
    first = env.cli_popen("switch", "b")
    env.wait_for(lambda: env.status()["daemon"].get("switch") is not None, 10, "the first switch")
    second = env.cli("switch", "off")
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert second.returncode == 4, second.stderr
    assert "already running" in second.stderr and "to b" in second.stderr
    assert len(env.ledger()) == n + 1
    assert env.active_state("gs-b.service") == "active"


def test_unknown_backend_and_bad_config_change_nothing(ab):
    env = ab()
    a_pid = env.main_pid("gs-a.service")
    r = env.cli("switch", "nosuch")
    assert r.returncode == 3 and "unknown backend 'nosuch'" in r.stderr
    good = env.config_path.read_text()
    env.write_config(good.replace("[gpu]", "[gpu]\nresidual_mb = 3"))
    r = env.cli("switch", "b")
    assert r.returncode == 2
    assert "gpu.residual_mb: unknown key" in r.stderr and str(env.config_path) in r.stderr
    env.write_config(good)
    assert env.main_pid("gs-a.service") == a_pid
    assert env.active_state("gs-b.service") == "inactive"


def test_daemon_refuses_a_switch_while_its_config_on_disk_is_broken(ab):
    """The CLI does not validate the config (it reads only the bus): the daemon checks the file on
    disk before it takes a switch, from any client (busctl here), and refuses it naming file and
    key; nothing changes.  A valid edit not yet reloaded does not refuse."""
    bc.require()
    env = ab()
    a_pid = env.main_pid("gs-a.service")
    good = env.config_path.read_text()
    env.write_config(good.replace("[gpu]", "[gpu]\nresidual_mb = 3"))
    r = bc.call(["--user"], "SwitchTo", "sa{sv}", "b", "0", check=False, env=env.sb.env)
    assert r.returncode != 0, r.stdout
    assert "gpu.residual_mb: unknown key" in r.stderr and str(env.config_path) in r.stderr, r.stderr
    r = env.cli("switch", "b", "--no-wait")
    assert r.returncode == 2 and "gpu.residual_mb: unknown key" in r.stderr, r.stderr
    assert env.main_pid("gs-a.service") == a_pid
    assert env.active_state("gs-b.service") == "inactive"
    env.write_config(good + "\n# edited, not reloaded\n")
    env.cli("switch", "b", check=True)
    assert env.active_state("gs-b.service") == "active"


def test_switch_off_frees_gpus(ab):
    env = ab()
    env.cli("switch", "off", check=True)
    st = env.status()
    assert st["active"] == "off"
    assert all(g["state"] == "released" for g in st["gpus"])


def test_daemon_killed_mid_switch_marks_row_interrupted(ab):
    env = ab(b_args=["--start-delay", "30"], b_timeout=60)
    first = env.cli_popen("switch", "b")
    env.wait_for(
        lambda: (env.status()["daemon"].get("switch") or {}).get("phase") == "ready",
        20,
        "the switch to reach readiness",
    )
    pid = int(env.sb.show("gpushift.service", "MainPID")["MainPID"])
    os.kill(pid, signal.SIGKILL)
    out, err = first.communicate(timeout=30)
    assert first.returncode != 0
    assert "went away" in err or "not running" in err, err
    env.wait_for(
        lambda: (
            env.sb.show("gpushift.service", "MainPID")["MainPID"] not in ("0", str(pid))
            and env.active_state("gpushift.service") == "active"
        ),
        30,
        "systemd to restart the daemon",
    )
    (row,) = [r for r in env.ledger() if r["outcome"] == "interrupted"]
    assert row["to"] == "b" and row["failed_phase"] == "ready"
    # The restarted daemon does not take b as done: it recovers to it, verifying its health (b
    # loads for 30 s), and says so.
    st = env.status()
    assert st["daemon"]["running"] is True and st["daemon"]["state"] == "recovering", st["daemon"]
    assert st["daemon"]["switch"]["to"] == "b" and st["daemon"]["switch"]["trigger"] == "recovery"
    # b's unit runs but b still loads (--start-delay 30): not serving until its health is OK
    assert st["active"] is None and "b: health" in st["active_reason"], st


def test_daemon_restart_leaves_backend_running(ab):
    env = ab()
    env.cli("switch", "b", check=True)
    b_pid = env.main_pid("gs-b.service")
    d_pid = env.sb.show("gpushift.service", "MainPID")["MainPID"]
    env.sb.systemctl("restart", "gpushift.service", timeout_s=60)
    assert env.sb.show("gpushift.service", "MainPID")["MainPID"] != d_pid
    assert env.main_pid("gs-b.service") == b_pid
    assert env.status()["active"] == "b"


def test_status_when_daemon_down_reads_itself(ab):
    env = ab()
    env.sb.systemctl("stop", "gpushift.service")
    r = env.cli("status", "--json")
    assert r.returncode == 6
    st = json.loads(r.stdout)
    assert st["daemon"]["running"] is False
    assert st["active"] == "a"
    assert st["last_switch"]["to"] == "a"
    human = env.cli("status").stdout
    assert "DOWN" in human and "SIMULATED" in human


def test_switch_cli_reports_daemon_down(ab):
    env = ab()
    env.sb.systemctl("stop", "gpushift.service")
    r = env.cli("switch", "b")
    assert r.returncode == 6 and "not running" in r.stderr
    assert env.active_state("gs-a.service") == "active"


def test_daemon_refuses_second_instance_name(ab):
    env = ab()
    r = subprocess.run(
        [GPUSHIFT, "daemon"],
        env={**env.sb.env, "GPUSHIFT_CONFIG": str(env.config_path)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode != 0
    assert "bus_name_taken" in r.stdout


def _slow_completion(port: int, seconds: float, out: dict) -> None:
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps({"prompt": "hello", "sleep": seconds}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            out["status"] = r.status
            out["done_at"] = time.monotonic()
    except Exception as e:  # noqa: BLE001 - the test asserts on what happened
        out["error"] = repr(e)
        out["done_at"] = time.monotonic()


def test_drain_waits_for_request_in_flight_and_ledger_shows_it(ab):
    import threading

    env = ab()
    port = env.backends["a"].port
    out: dict = {}
    t = threading.Thread(target=_slow_completion, args=(port, 4.0, out))
    t.start()
    env.wait_for(lambda: "standin:requests_running 1" in _metrics(port), 10, "the request to be in flight")
    r = env.cli("switch", "b", check=True)
    t.join(30)
    assert out.get("status") == 200, out  # it completed: the stop waited for it
    assert "drain" in r.stdout and "1 request(s) in flight" in r.stdout
    row = env.ledger_row(env.ledger()[0]["id"])
    drain = row["extra"]["drain"][0]
    assert drain["backend"] == "a" and drain["in_flight_at_start"] == 1 and drain["in_flight_at_stop"] == 0
    assert not drain["timed_out"] and drain["waited_s"] >= 1.0


def test_switch_now_skips_the_drain(ab):
    import threading

    env = ab()
    port = env.backends["a"].port
    out: dict = {}
    t = threading.Thread(target=_slow_completion, args=(port, 20.0, out))
    t.start()
    env.wait_for(lambda: "standin:requests_running 1" in _metrics(port), 10, "the request to be in flight")
    t0 = time.monotonic()
    env.cli("switch", "b", "--now", check=True)
    assert time.monotonic() - t0 < 15
    t.join(30)
    assert "error" in out, out  # the stop cut it off
    row = env.ledger_row(env.ledger()[0]["id"])
    assert row["extra"]["drain"][0]["skipped"] is True


def _metrics(port: int) -> str:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return r.read().decode()
    except OSError:
        return ""


def test_doctor_error_refuses_before_anything_is_stopped(ab):
    # kind llama-server: its rules know -m/--model names a GGUF file that must exist
    env = ab(b_args=["--model", "/nonexistent/models/tiny-Q4_K_M.gguf"], b_kind="llama-server")
    a_pid = env.main_pid("gs-a.service")
    r = env.cli("switch", "b")
    assert r.returncode == 7, r.stderr
    assert "refused" in r.stderr and "/nonexistent/models/tiny-Q4_K_M.gguf" in r.stderr
    assert env.main_pid("gs-a.service") == a_pid
    row = env.ledger_row(env.ledger()[0]["id"])
    assert row["outcome"] == "refused"
    assert any(f["code"] == "model-path-missing" for f in row["extra"]["doctor"])


def test_status_without_any_bus_still_reads_gpus_and_ledger(ab):
    env = ab()
    env.sb.systemctl("stop", "gpushift.service")
    # a config whose bus cannot be reached at all: status must still say what it can
    cfg = env.config_path.read_text().replace('bus = "session"', 'bus = "system"')
    alt = env.base / "nobus.toml"
    alt.write_text(cfg)
    r = subprocess.run(
        [GPUSHIFT, "--config", str(alt), "status", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env.sb.env, "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={env.base}/no-such-bus"},
    )
    assert r.returncode == 6, r.stderr
    st = json.loads(r.stdout)
    assert st["daemon"]["running"] is False
    assert st["active"] is None  # unknown, not "off": systemd could not be asked
    assert all("systemd not reachable" in b["error"] for b in st["backends"].values())
    assert st["gpus"] and st["gpus"][0]["name"].startswith("SIMULATED")
    assert st["last_switch"]["to"] == "a"

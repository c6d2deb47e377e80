"""Never strand the host, end to end: the shipped gpushift.service in a real systemd user manager.

Each test is one way a bad day attacks the host — the daemon killed in the middle of a switch, a
backend that exits by itself (status 0 too) or is relaunched behind gpushift's back, a cancel that
arrives during a stop job, a GPU that falls off the bus — and asserts what a person relies on:
what serves afterwards, what the ledger says, what ``gpushift status`` says.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from gpushift_env import Backend, GpushiftEnv, free_port


def control(env: GpushiftEnv, backend: str, **body: Any) -> None:
    """The stand-in's remote control: ``exit=N`` (dies by itself), ``health="fail"`` (wedges)."""
    port = env.backends[backend].port
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/control", data=json.dumps(body).encode(), method="POST"
    )
    req.add_header("Content-Type", "application/json")
    with contextlib.suppress(OSError):  # an exit may cut the answer short
        urllib.request.urlopen(req, timeout=5).read()


def rows(env: GpushiftEnv, **match: Any) -> list[dict[str, Any]]:
    return [r for r in env.ledger() if all(r.get(k) == v for k, v in match.items())]


def kill_daemon(env: GpushiftEnv) -> int:
    return env.kill_daemon()


def phase(env: GpushiftEnv) -> str | None:
    return (env.status()["daemon"].get("switch") or {}).get("phase")


@pytest.fixture
def dn(sandbox):
    """Backends day (GPUs 0,1) and night (GPU 1), no schedule, day serving."""

    def build(
        day_args=(), night_args=(), night_timeout=30.0, day_config=(), setup=True, **opts
    ) -> GpushiftEnv:
        day = Backend(
            "day",
            free_port(),
            [0, 1],
            version="1.0.0",
            vram_mib=14500,
            args=list(day_args),
            extra_config=list(day_config),
        )
        night = Backend(
            "night",
            free_port(),
            [1],
            version="2.0.0",
            vram_mib=6800,
            args=list(night_args),
            start_timeout_s=night_timeout,
        )
        opts.setdefault("reconcile_interval_s", 2)
        env = GpushiftEnv(sandbox, Path(sandbox.base_dir) / "dn", [day, night], **opts).up()
        if setup:
            env.cli("switch", "day", "--reason", "setup", check=True)
        return env

    return build


# ------------------------------------------------------------------ the daemon's own death


def test_daemon_killed_after_the_stop_of_a_manual_switch_recovers_to_its_target(dn):
    # The gate waits for the simulated release: the daemon dies with day stopped, night not started.
    env = dn(simulated_release_delay_s=4, release_timeout_s=20)
    sw = env.cli_popen("switch", "night")
    env.wait_for(lambda: phase(env) == "release", 20, "the switch to reach the VRAM gate")
    kill_daemon(env)
    sw.communicate(timeout=30)
    env.wait_for(lambda: env.active_state("gs-night.service") == "active", 60, "the recovery to start night")
    env.wait_for(lambda: rows(env, trigger="recovery", outcome="ok"), 60, "the recovery's launch row")
    (old,) = rows(env, outcome="interrupted")
    assert old["to"] == "night" and old["failed_phase"] == "release"
    (rec,) = rows(env, trigger="recovery")
    full = env.ledger_row(rec["id"])
    assert full["to"] == "night" and full["argv_running"], full
    assert env.active_state("gs-day.service") == "inactive"
    st = env.status()
    assert st["active"] == "night" and st["daemon"]["state"] == "idle"


def test_daemon_killed_while_the_target_starts_verifies_it_and_records_its_launch(dn):
    env = dn(night_args=["--start-delay", "6"])
    sw = env.cli_popen("switch", "night")
    env.wait_for(lambda: phase(env) == "ready", 20, "the switch to wait for night's health")
    kill_daemon(env)
    sw.communicate(timeout=30)
    # systemd finished the start without the daemon: the recovery must not take it as done.
    env.wait_for(lambda: env.status()["daemon"]["state"] == "recovering", 20, "status to say recovering")
    env.wait_for(lambda: rows(env, trigger="recovery", outcome="ok"), 60, "the recovery's launch row")
    (rec,) = rows(env, trigger="recovery")
    full = env.ledger_row(rec["id"])
    assert full["to"] == "night" and full["backend_version"] == "2.0.0" and full["argv_running"]
    assert full["durations_s"].get("ready", 0) > 0  # it waited for the health URL
    (old,) = rows(env, outcome="interrupted")
    assert old["failed_phase"] == "ready"


# ------------------------------------------------------------------ the serving backend between switches


def test_backend_exiting_zero_by_itself_is_a_crash_and_is_relaunched(dn):
    # vLLM can exit 0 when its engine dies (vllm#48966): not a person's systemctl stop.
    env = dn()
    first_pid = env.main_pid("gs-day.service")
    control(env, "day", exit=0)
    env.wait_for(lambda: rows(env, outcome="crashed"), 30, "a crashed row")
    (crash,) = rows(env, outcome="crashed")
    assert crash["trigger"] == "watch" and crash["from"] == "day"
    full = env.ledger_row(crash["id"])
    assert "exit status 0" in full["extra"]["incident"]["exit"]
    env.wait_for(
        lambda: (
            env.active_state("gs-day.service") == "active" and env.main_pid("gs-day.service") != first_pid
        ),
        60,
        "day relaunched",
    )
    env.wait_for(lambda: rows(env, trigger="recovery", to="day", outcome="ok"), 60, "the relaunch row")
    assert env.status()["override"] is None or env.status()["override"]["source"] != "external"


def test_backend_exiting_with_an_error_and_on_crash_stay_is_left_stopped(dn):
    env = dn(day_config=['on_crash = "stay"'])
    control(env, "day", exit=3)
    env.wait_for(lambda: rows(env, outcome="crashed"), 30, "a crashed row")
    env.wait_for(lambda: "on_crash" in (env.status().get("blocked") or ""), 20, "status to say why it stays")
    assert env.active_state("gs-day.service") in ("failed", "inactive")
    assert not rows(env, trigger="recovery")


def test_wedged_backend_is_noticed_recorded_and_relaunched_through_the_gate(dn):
    # Unit active, /health failing: nobody noticed before (only ActiveState=failed counted).
    env = dn(day_config=["unhealthy_after_s = 5"], daemon_lines=["sample_interval_s = 0.5"])
    old_pid = env.main_pid("gs-day.service")
    control(env, "day", health="fail")
    env.wait_for(lambda: rows(env, outcome="unhealthy"), 30, "an unhealthy row")
    (row,) = rows(env, outcome="unhealthy")
    assert row["trigger"] == "watch" and row["from"] == "day"
    env.wait_for(lambda: rows(env, trigger="recovery", to="day", outcome="ok"), 60, "the relaunch row")
    (relaunch,) = rows(env, trigger="recovery", to="day")
    full = env.ledger_row(relaunch["id"])
    assert full["extra"].get("relaunch") is True and {"stop", "start", "ready"} <= set(full["durations_s"])
    assert env.main_pid("gs-day.service") != old_pid
    env.wait_for(lambda: env.status()["active"] == "day", 20, "status to show day serving again")


def test_persons_systemctl_stop_is_an_external_change_not_a_crash(dn):
    env = dn()
    env.sb.systemctl("stop", "gs-day.service")
    env.wait_for(lambda: rows(env, trigger="external"), 30, "an external row")
    assert not rows(env, outcome="crashed")
    assert env.active_state("gs-day.service") == "inactive"  # a person's stop is not undone


def test_relaunch_behind_gpushifts_back_gets_a_row_with_its_launch(dn):
    env = dn()
    old_pid = env.main_pid("gs-day.service")
    env.sb.systemctl("restart", "gs-day.service")
    env.wait_for(lambda: rows(env, trigger="external"), 30, "an external relaunch row")
    (row,) = rows(env, trigger="external")
    full = env.ledger_row(row["id"])
    assert full["to"] == "day" and full["extra"].get("relaunch") is True
    assert full["argv_running"] and full["backend_version"] == "1.0.0"
    assert f"{old_pid} -> {env.main_pid('gs-day.service')}" in full["reason"]


def test_switch_restart_relaunches_the_running_backend_through_the_gate(dn):
    env = dn()
    old_pid = env.main_pid("gs-day.service")
    r = env.cli("switch", "day", "--restart", "--json", check=True)
    res = json.loads(r.stdout)
    assert res["ok"] and not res.get("already"), res
    assert env.main_pid("gs-day.service") != old_pid
    full = env.ledger_row(res["ledger_id"])
    assert full["extra"].get("relaunch") is True
    assert {"stop", "release", "start", "ready"} <= set(full["durations_s"]), full["durations_s"]


# ------------------------------------------------------------------ cancel


def test_cancel_during_the_stop_job_is_honoured(dn):
    # day ignores SIGTERM: its stop job lasts until systemd's SIGKILL (3 s); memory comes back at
    # once, so the gate opens at its first read and there is no poll for a cancel to slip into.
    env = dn(day_args=["--ignore-sigterm"], simulated_release_delay_s=0)
    sw = env.cli_popen("switch", "night", "--json")
    env.wait_for(lambda: phase(env) == "stop", 20, "the stop job")
    assert env.cli("cancel").returncode == 0
    out, _err = sw.communicate(timeout=60)
    res = json.loads(out)
    assert res["ok"] is False and res.get("cancelled_by"), res
    assert res["outcome"] == "rolled_back"
    # Honoured as soon as the stop job ended: night was never started (a cancel that is lost in the
    # stop would only be noticed, if at all, while night loads).
    assert res["failed_phase"] == "release", res
    assert not (env.base / "night.log").exists() or "starting" not in (env.base / "night.log").read_text()
    env.wait_for(lambda: env.active_state("gs-day.service") == "active", 30, "day back")


def test_cancelled_scheduled_switch_is_not_retried_before_the_next_boundary(dn, tmp_path):
    schedule = tmp_path / "schedule"
    schedule.write_text("TZ=UTC\n0 0 1 1 * night\n")  # night is in effect since New Year
    env = dn(
        night_args=["--start-delay", "8"],
        schedule=str(schedule),
        setup=False,
        daemon_lines=["retry_after_s = 2"],
        reconcile_interval_s=1,
    )
    env.wait_for(lambda: phase(env) == "ready", 30, "the scheduled switch to night")
    assert env.cli("cancel").returncode == 0
    env.wait_for(lambda: (env.status()["schedule"] or {}).get("blocked"), 30, "the keeper to say it waits")
    blocked = env.status()["schedule"]["blocked"]
    assert "cancelled by" in blocked and "resume" in blocked
    n = len(env.ledger())
    time.sleep(5)  # well past retry_after_s: nothing is retried
    assert env.status()["daemon"]["state"] == "idle" and len(env.ledger()) == n


# ------------------------------------------------------------------ the gate


def test_gpu_fallen_off_the_bus_keeps_the_gate_closed(dn):
    env = dn()
    for i in (0, 1):
        (env.simdir / f"nvidia{i}.gone").touch()
    r = env.cli("switch", "night")
    assert r.returncode == 8, (r.stdout, r.stderr)
    assert "not visible" in r.stderr
    assert env.active_state("gs-day.service") == "active"  # refused before anything was stopped

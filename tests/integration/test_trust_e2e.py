"""A switch people can trust, end to end: proof of inference after ready, and a failed start's
evidence (the unit's last log lines, from the sandbox's real journald) in its ledger row."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.request
from pathlib import Path

import pytest
from gpushift_env import Backend, GpushiftEnv, free_port

WARMUP = ['warmup = { path = "/v1/completions", body = { prompt = "hello", max_tokens = 4, stream = true } }']


@pytest.fixture
def pair(sandbox):
    def build(b_args=(), b_exec=None, b_config=WARMUP, **opts) -> GpushiftEnv:
        a = Backend("a", free_port(), [0, 1], version="1.0.0", vram_mib=14500, extra_config=list(WARMUP))
        b = Backend(
            "b",
            free_port(),
            [1],
            version="2.0.0",
            vram_mib=6800,
            args=list(b_args),
            exec_start=b_exec,
            extra_config=list(b_config),
        )
        env = GpushiftEnv(sandbox, Path(sandbox.base_dir) / "trust", [a, b], **opts).up()
        env.cli("switch", "a", "--reason", "setup", check=True)
        return env

    return build


def test_switch_records_the_warmups_time_to_first_token(pair):
    env = pair()
    r = env.cli("switch", "b", "--json", check=True)
    row = env.ledger_row(json.loads(r.stdout)["ledger_id"])
    w = row["extra"]["warmup"]
    assert w["ok"] and w["path"] == "/v1/completions" and w["chunks"] >= 1
    assert 0 < w["ttft_s"] <= w["total_s"], w
    assert "warm-up:" in env.cli("status").stdout


def test_health_ok_but_completion_failing_fails_the_switch_and_rolls_back(pair):
    env = pair(b_args=["--fail-completions"])
    r = env.cli("switch", "b", "--json")
    assert r.returncode == 7, (r.stdout, r.stderr)
    res = json.loads(r.stdout)
    assert res["outcome"] == "rolled_back" and res["failed_phase"] == "warmup", res
    assert env.active_state("gs-a.service") == "active" and env.active_state("gs-b.service") != "active"


def test_unit_that_exits_at_start_leaves_its_last_log_lines_in_the_failed_row(pair):
    env = pair(b_args=["--exit-at-once"])
    r = env.cli("switch", "b", "--json")
    assert r.returncode == 7
    row_id = json.loads(r.stdout)["ledger_id"]
    ev = env.ledger_row(row_id)["extra"]["evidence"]
    assert ev["unit"] == "gs-b.service" and ev["log"]["source"] == "journal", ev
    assert any("exiting at once" in line for line in ev["log"]["lines"]), ev["log"]
    assert "exit status 1" in ev["exit"], ev
    shown = env.cli("ledger", "show", str(row_id), check=True).stdout
    assert "Evidence: gs-b.service" in shown and "exiting at once" in shown


def busy(env: GpushiftEnv, backend: str, seconds: float, n: int = 2) -> list[threading.Thread]:
    """``n`` requests of ``seconds`` each in flight on ``backend`` (stand-in completions)."""

    def one() -> None:
        req = urllib.request.Request(
            f"http://127.0.0.1:{env.backends[backend].port}/v1/completions",
            data=json.dumps({"prompt": "x", "sleep": seconds}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with contextlib.suppress(OSError):
            urllib.request.urlopen(req, timeout=seconds + 30).read()

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


@pytest.fixture
def deferring(sandbox, tmp_path):
    def build(limit_s: float, idle_s: float = 2.0) -> GpushiftEnv:
        schedule = tmp_path / "schedule"
        schedule.write_text("TZ=UTC\n0 0 1 1 * b\n")  # b is in effect since New Year
        a = Backend(
            "a",
            free_port(),
            [0, 1],
            version="1.0.0",
            vram_mib=14500,
            drain_timeout_s=2,
            extra_config=[f"defer_while_busy_s = {limit_s}", f"idle_s = {idle_s}"],
        )
        b = Backend("b", free_port(), [1], version="2.0.0", vram_mib=6800)
        env = GpushiftEnv(
            sandbox,
            Path(sandbox.base_dir) / "defer",
            [a, b],
            schedule=str(schedule),
            daemon_lines=["sample_interval_s = 0.5"],
            reconcile_interval_s=1,
        ).up()
        env.wait_for(
            lambda: (
                env.active_state("gs-b.service") == "active" and env.status()["daemon"]["state"] == "idle"
            ),
            30,
            "the schedule to bring up b",
        )
        env.cli("switch", "a", "--reason", "a person keeps a until the next boundary", check=True)
        return env

    return build


def test_boundary_with_a_busy_backend_is_deferred_then_taken_when_idle(deferring):
    env = deferring(limit_s=60)
    requests = busy(env, "a", seconds=6)
    env.wait_for(lambda: (env.status()["backends"]["a"].get("in_flight") or {}).get("requests"), 10, "a busy")
    env.cli("resume", check=True)  # the schedule wants b now: the boundary meets a busy a
    env.wait_for(lambda: env.status().get("deferred"), 10, "status to say the switch is deferred")
    st = env.status()
    assert "deferred until" in env.cli("status").stdout and st["deferred"]["to"] == "b"
    assert st["daemon"]["state"] == "idle" and env.active_state("gs-a.service") == "active"  # no ticket
    for t in requests:
        t.join(30)
    env.wait_for(
        lambda: any(r["to"] == "b" and r["outcome"] == "ok" and r["id"] > 2 for r in env.ledger()),
        30,
        "the switch once a was idle",
    )
    row = max((r for r in env.ledger() if r["to"] == "b" and r["outcome"] == "ok"), key=lambda r: r["id"])
    d = env.ledger_row(row["id"])["extra"]["deferral"]
    assert d["ended"] == "idle" and d["waited_s"] >= 3, d


def test_deferral_ends_at_its_limit_while_still_busy(deferring):
    env = deferring(limit_s=4)
    busy(env, "a", seconds=60)
    env.wait_for(lambda: (env.status()["backends"]["a"].get("in_flight") or {}).get("requests"), 10, "a busy")
    env.cli("resume", check=True)
    env.wait_for(
        lambda: any(r["to"] == "b" and r["outcome"] == "ok" and r["id"] > 2 for r in env.ledger()),
        40,
        "the switch at the limit",
    )
    row = max((r for r in env.ledger() if r["to"] == "b" and r["outcome"] == "ok"), key=lambda r: r["id"])
    assert env.ledger_row(row["id"])["extra"]["deferral"]["ended"] == "limit"


def test_manual_switch_is_not_deferred(deferring):
    env = deferring(limit_s=60)
    busy(env, "a", seconds=60)
    env.wait_for(lambda: (env.status()["backends"]["a"].get("in_flight") or {}).get("requests"), 10, "a busy")
    r = env.cli("switch", "b", "--now", "--json", check=True)
    assert (
        json.loads(r.stdout)["ok"]
        and "deferral" not in env.ledger_row(json.loads(r.stdout)["ledger_id"])["extra"]
    )

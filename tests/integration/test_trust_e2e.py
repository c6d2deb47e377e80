"""A switch people can trust, end to end: proof of inference after ready, and a failed start's
evidence (the unit's last log lines, from the sandbox's real journald) in its ledger row."""

from __future__ import annotations

import json
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

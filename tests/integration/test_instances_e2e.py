"""Issue 23's first acceptance, end to end: a backend of two instances on two simulated GPUs, switched
as one by the shipped gpushift.service under a real systemd user manager, over the real CLI.

"day" is one stand-in on GPUs 0 and 1; "night" is two stand-in units, ``gs-night0.service`` on GPU 0
and ``gs-night1.service`` on GPU 1, each with its own port, named in ``instances`` (with
``min_ready`` where a test sets it).  The instances do not conflict with each other, only with day.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from gpushift_env import Backend, GpushiftEnv, free_port, instances_config

from tests.support import busctl as bc

DAY, N0, N1 = "gs-day.service", "gs-night0.service", "gs-night1.service"


class InstancesEnv(GpushiftEnv):
    """The rig, with night0 and night1 written into the config as one backend "night"."""

    min_ready: int | None = None
    night_lines: tuple[str, ...] = ()  # more keys of [backends.night]

    def config_text(self) -> str:
        n0, n1 = self.backends["night0"], self.backends["night1"]
        lines = [f'version_url = "http://127.0.0.1:{n0.port}/version"']
        if self.min_ready is not None:
            lines.append(f"min_ready = {self.min_ready}")
        lines += list(self.night_lines)
        return instances_config(
            super().config_text(), [n0, n1], start_timeout_s=20, drain_timeout_s=5, vram_mib=6800, lines=lines
        )

    def unit_conflicts(self, b: Backend) -> list[str]:
        return [DAY] if b.name != "day" else [N0, N1]  # the instances conflict with day only


@pytest.fixture
def night(sandbox: Any) -> Any:
    """``night(n1_args=[...], min_ready=N, night_lines=[...], **daemon_opts)``: the rig up, day serving."""

    def build(
        n1_args: tuple[str, ...] = (),
        min_ready: int | None = None,
        night_lines: tuple[str, ...] = (),
        **opts: Any,
    ) -> InstancesEnv:
        backends = [
            Backend("day", free_port(), [0, 1], version="1.1.0", vram_mib=14500),
            Backend("night0", free_port(), [0], version="2.0.0", vram_mib=6800),
            Backend("night1", free_port(), [1], version="2.0.0", vram_mib=6800, args=list(n1_args)),
        ]
        env = InstancesEnv(sandbox, Path(sandbox.base_dir) / "gs", backends, **opts)
        env.min_ready = min_ready
        env.night_lines = night_lines
        env.up()
        env.cli("switch", "day", "--reason", "setup", check=True)
        assert env.active_state(DAY) == "active"
        return env

    return build


def _last_row(env: InstancesEnv) -> dict[str, Any]:
    return env.ledger_row(env.ledger()[0]["id"])


def test_instances_switch_starts_both_after_the_gate_saw_both_gpus_and_records_both(night: Any) -> None:
    env = night()
    env.cli("switch", "night", "--reason", "evening", check=True)
    assert env.active_state(N0) == "active" and env.active_state(N1) == "active"
    assert env.active_state(DAY) == "inactive"
    row = _last_row(env)
    assert row["outcome"] == "ok", row
    # the gate watched both GPUs (day held both) and saw both free before the starts
    released = row["vram"]["released"]
    assert [r["index"] for r in released] == [0, 1], released
    assert all(r["used_mib"] is not None and r["used_mib"] < 256 for r in released), released
    entries = row["extra"]["instances"]
    ports = {N0: env.backends["night0"].port, N1: env.backends["night1"].port}
    assert [(e["unit"], e["gpus"], e["port"], e["outcome"]) for e in entries] == [
        (N0, [0], ports[N0], "ready"),
        (N1, [1], ports[N1], "ready"),
    ]
    for e in entries:  # each launch as it runs: its own process, its own port, its own timings
        assert e["main_pid"] == env.main_pid(e["unit"])
        assert str(ports[e["unit"]]) in e["argv"], e["argv"]
        assert {"start", "ready"} <= set(e["durations_s"]), e
    # each instance holds its own GPU
    st = env.status()
    holders = {g["index"]: [h["unit"] for h in g["holders"]] for g in st["gpus"]}
    assert holders == {0: [N0], 1: [N1]}, holders
    assert st["active"] == "night"
    # and back: both instances stopped, day's gate watched both GPUs again
    env.cli("switch", "day", "--reason", "morning", check=True)
    assert env.active_state(N0) == "inactive" and env.active_state(N1) == "inactive"
    back = _last_row(env)
    assert back["outcome"] == "ok" and [r["index"] for r in back["vram"]["released"]] == [0, 1]


def test_instances_one_failing_to_start_with_min_ready_2_rolls_back(night: Any) -> None:
    env = night(n1_args=("--exit-at-once",), min_ready=2)
    r = env.cli("switch", "night", "--reason", "evening")
    assert r.returncode != 0, r.stdout
    row = _last_row(env)
    assert row["outcome"] == "rolled_back", row
    assert "1 of 2 instances ready, 2 needed" in row["message"], row["message"]
    assert env.active_state(DAY) == "active"
    assert env.active_state(N0) == "inactive" and env.active_state(N1) != "active"
    failed = [e for e in row["extra"]["instances"] if e["outcome"] == "failed"]
    assert [e["unit"] for e in failed] == [N1], row["extra"]["instances"]
    assert failed[0]["evidence"]["unit"] == N1


def test_instances_one_failing_with_min_ready_1_serves_and_the_failure_is_named(night: Any) -> None:
    env = night(n1_args=("--exit-at-once",), min_ready=1)
    env.cli("switch", "night", "--reason", "evening", check=True)
    assert env.active_state(N0) == "active" and env.active_state(N1) != "active"
    row = _last_row(env)
    assert row["outcome"] == "ok", row
    entries = row["extra"]["instances"]
    assert [(e["unit"], e["outcome"]) for e in entries] == [(N0, "ready"), (N1, "failed")]
    assert N1 in entries[1]["error"], entries[1]
    st = env.status()
    assert st["active"] == "night"
    named = {e["unit"]: e["outcome"] for e in st["last_switch"]["instances"]}
    assert named == {N0: "ready", N1: "failed"}
    text = env.cli("status", check=True).stdout
    assert f"instance: {N1} (GPU 1, port {env.backends['night1'].port}) FAILED" in text, text
    # the D-Bus property Instances: each instance's unit state and health, as the sampler last saw them
    bc.require()
    want = f'a{{sa(sss)}} 1 "night" 2 "{N0}" "active" "ok" "{N1}" "failed" ""'
    env.wait_for(
        lambda: bc.get_property(["--user"], "Instances", env=env.sb.env) == want, 30, "the Instances property"
    )


def test_instances_a_crash_between_switches_is_a_row_and_only_that_instance_is_relaunched(night: Any) -> None:
    env = night(min_ready=1)
    env.cli("switch", "night", "--reason", "evening", check=True)
    pid = env.main_pid(N1)
    assert pid > 0
    os.kill(pid, signal.SIGKILL)  # instance 1 dies by itself between switches

    def crash_row() -> dict[str, Any] | None:
        rows = [r for r in env.ledger() if r["outcome"] == "crashed"]
        return rows[0] if rows else None

    env.wait_for(lambda: crash_row() is not None, 60, "the crash row of instance 1")
    row = env.ledger_row(crash_row()["id"])  # type: ignore[index]
    assert row["unit"] == N1 and row["to"] == "night", row
    assert row["extra"]["incident"]["unit"] == N1 and row["extra"]["incident"]["serving"] is True
    assert env.active_state(N0) == "active"
    n0_pid = env.main_pid(N0)
    # and instance 1 alone is started again (after the gate saw its GPU free); instance 0 serves on
    env.wait_for(lambda: env.active_state(N1) == "active", 60, "instance 1 relaunched")
    env.wait_for(lambda: env.ledger()[0]["trigger"] == "recovery", 60, "the relaunch's row")
    again = env.ledger_row(env.ledger()[0]["id"])
    assert again["outcome"] == "ok" and again["extra"]["relaunched"] == [N1], again
    assert env.main_pid(N0) == n0_pid
    st = env.status()
    assert st["active"] == "night", st["active"]


def _health(env: InstancesEnv, backend: str, mode: str) -> None:
    """The stand-in's /health from now on: ``ok``, ``fail`` or ``hang`` (never answers)."""
    port = env.backends[backend].port
    body = json.dumps({"mode": mode}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/_standin/health", data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    urllib.request.urlopen(req, timeout=5).read()


def test_instances_a_hung_instance_is_a_row_and_only_it_is_restarted(night: Any) -> None:
    env = night(
        min_ready=1, night_lines=("unhealthy_after_s = 5",), sample_interval_s=0.5, reconcile_interval_s=1
    )
    env.cli("switch", "night", "--reason", "evening", check=True)
    n0_pid, n1_pid = env.main_pid(N0), env.main_pid(N1)
    _health(env, "night1", "hang")  # instance 1's unit stays active, its /health never answers

    def row_of(outcome: str, trigger: str) -> dict[str, Any] | None:
        rows = [r for r in env.ledger() if r["outcome"] == outcome and r["trigger"] == trigger]
        return rows[0] if rows else None

    env.wait_for(lambda: row_of("unhealthy", "watch") is not None, 60, "the unhealthy row of instance 1")
    row = env.ledger_row(row_of("unhealthy", "watch")["id"])  # type: ignore[index]
    assert row["unit"] == N1 and row["to"] == "night", row
    assert row["extra"]["incident"]["unit"] == N1 and row["extra"]["incident"]["serving"] is True
    env.wait_for(lambda: row_of("ok", "recovery") is not None, 60, "the restart's row")
    again = env.ledger_row(row_of("ok", "recovery")["id"])  # type: ignore[index]
    assert again["extra"]["restarted"] == [N1] and again["extra"]["relaunched"] == [N1], again
    assert env.main_pid(N0) == n0_pid  # the healthy instance served on, untouched
    assert env.main_pid(N1) not in (0, n1_pid)  # the hung one is a new process
    assert env.active_state(N1) == "active"
    env.wait_for(lambda: env.status()["active"] == "night", 20, "status to show night serving")
    assert len([r for r in env.ledger() if r["outcome"] == "unhealthy"]) == 1  # no second restart


def test_instances_gpushift_check_refuses_two_instances_on_one_gpu(night: Any) -> None:
    env = night()
    r = env.cli("check", "--json")
    codes = [f["code"] for f in json.loads(r.stdout)["findings"]]
    assert not [c for c in codes if c.startswith("instance-")], codes
    shared = env.config_text().replace("gpus = [1] }", "gpus = [0] }", 1)  # instance 1 on GPU 0 too
    env.write_config(shared)
    r = env.cli("check", "--json")
    assert r.returncode == 1, r.stdout
    found = [f for f in json.loads(r.stdout)["findings"] if f["code"] == "instance-gpu-shared"]
    assert found and found[0]["backend"] == "night" and "GPU 0" in found[0]["message"], found

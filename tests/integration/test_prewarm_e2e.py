"""Pre-warm, end to end: the shipped gpushift.service under a real systemd user manager reads the
next backend's model file into the page cache before its boundary, in a reader process of its own,
records what it read in the row of the switch to that backend, and ends the reader (by PID) when
the boundary is called off.  The schedule is real (TZ=UTC, boundaries around the current time);
only the GPU is simulated."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psutil
from gpushift_env import Backend, GpushiftEnv, free_port

MIB = 1024 * 1024


def schedule_text(now: datetime) -> str:
    """``day`` since an hour ago, ``night`` from two hours on (daily lines, UTC)."""
    before, after = now - timedelta(hours=1), now + timedelta(hours=2)
    return f"TZ=UTC\n{before.minute} {before.hour} * * * day\n{after.minute} {after.hour} * * * night\n"


def build(sandbox: Any, model: Path, rate_mib_s: int) -> tuple[GpushiftEnv, datetime]:
    """The daemon, and the instant of the boundary to night."""
    base = Path(sandbox.base_dir) / "pw"
    base.mkdir(parents=True, exist_ok=True)
    sched = base / "schedule"
    now = datetime.now(timezone.utc)
    sched.write_text(schedule_text(now))
    boundary = (now + timedelta(hours=2)).replace(second=0, microsecond=0)
    day = Backend("day", free_port(), [0, 1], extra_config=["prewarm_lead_s = 0"])
    night = Backend(
        "night",
        free_port(),
        [1],
        extra_config=["prewarm_lead_s = 86400", f"prewarm_paths = {json.dumps([str(model)])}"],
    )
    env = GpushiftEnv(
        sandbox,
        base,
        [day, night],
        schedule=str(sched),
        daemon_lines=[f"prewarm_rate_mib_s = {rate_mib_s}"],
    ).up()
    return env, boundary


def settled(env: GpushiftEnv) -> None:
    """The start's scheduled switch to day is done."""

    def idle_on_day() -> bool:
        st = env.status()
        return bool(st["daemon"]["state"] == "idle" and st["active"] == "day")

    env.wait_for(idle_on_day, 60, "the scheduled switch to day")


def events(env: GpushiftEnv, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in env.daemon_log().splitlines() if f'"event": "{name}"' in line]


def test_the_next_backends_model_is_pre_warmed_and_its_switch_row_records_it(sandbox) -> None:
    model = Path(sandbox.base_dir) / "night.Q4_K_M.gguf"
    model.write_bytes(os.urandom(24 * MIB))
    env, boundary = build(sandbox, model, rate_mib_s=512)
    # The boundary to night is two hours away and its lead a day: the reader starts at once.
    env.wait_for(lambda: events(env, "prewarm_started"), 30, "the pre-warm reader to start")
    started = events(env, "prewarm_started")[-1]
    assert started["backend"] == "night" and int(started["bytes"]) == 24 * MIB, started
    pid = int(started["pid"])
    settled(env)
    env.wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", 60,
                 "the reader to finish")  # fmt: skip

    # A person switches to night before its boundary: the pre-warm is kept and recorded.
    env.cli("switch", "night", "--reason", "early", check=True)
    row = env.ledger_row(env.ledger()[0]["id"])
    assert row["to"] == "night" and row["outcome"] == "ok", row
    pw = row["extra"]["prewarm"]
    assert pw["backend"] == "night" and pw["bytes"] == 24 * MIB and pw["files"] == 1, pw
    assert pw["abandoned"] is False and pw["paths"] == [str(model)]
    assert datetime.fromisoformat(pw["for_boundary"]) == boundary, (pw["for_boundary"], boundary)
    assert not events(env, "prewarm_abandoned")


def test_a_hold_calls_the_boundary_off_and_the_reader_is_ended(sandbox) -> None:
    model = Path(sandbox.base_dir) / "night.gguf"
    model.write_bytes(b"\0" * (64 * MIB))
    env, _ = build(sandbox, model, rate_mib_s=1)  # 64 s at 1 MiB/s: still reading when the hold comes
    env.wait_for(lambda: events(env, "prewarm_started"), 30, "the pre-warm reader to start")
    pid = int(events(env, "prewarm_started")[-1]["pid"])
    assert psutil.pid_exists(pid)
    settled(env)

    env.cli("switch", "day", "--hold", "--reason", "keep day", check=True)
    env.wait_for(lambda: events(env, "prewarm_abandoned"), 30, "the pre-warm to be abandoned")
    env.wait_for(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", 15,
                 "the reader process to end")  # fmt: skip

"""`make demo` runs to completion, runs again after `make demo-stop` in the same directory, and a demo
that fails midway stops everything it started: the same module the Makefile calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def demo(env: dict[str, str], cmd: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.support.demo", cmd],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def sandbox_state(demo_dir: Path) -> dict[str, Any]:
    state_file = demo_dir / "sandbox.json"
    return json.loads(state_file.read_text()) if state_file.exists() else {}


def assert_ended(state: dict[str, Any]) -> None:
    assert state.get("stopped") is True, state
    for key in ("manager_pid", "dbus_pid"):
        pid = state.get(key)
        status = Path(f"/proc/{pid}/status")
        # ended: gone, or a zombie waiting for a PID 1 that does not reap (containers)
        assert pid is None or not status.exists() or "Z (zombie)" in status.read_text(), (key, pid)


def assert_completed(r: subprocess.CompletedProcess[str]) -> None:
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    out = r.stdout
    assert "ok: demo-day is serving" in out and "ok: demo-night is serving" in out
    assert "release" in out and "ready" in out  # live progress, one line per phase
    assert "GPUs (SIMULATED" in out and "active:   demo-night" in out
    assert "demo-day → demo-night" in out  # the ledger
    assert "make demo-stop" in out


def test_demo_runs_to_completion_stops_and_runs_again_in_the_same_directory():
    demo_dir = Path("/run") / f"gs-demo-test-{os.getpid()}"
    env = dict(os.environ, GPUSHIFT_DEMO_DIR=str(demo_dir))
    try:
        first = demo(env, "run")
        assert_completed(first)
        s = demo(env, "stop", 120)
        assert s.returncode == 0 and "demo stopped" in s.stdout, s.stdout + s.stderr
        assert_ended(sandbox_state(demo_dir))
        # The first run's ledger and override stay in the directory: the second run resets them on
        # purpose, says so, and switches exactly as the first did.
        assert (demo_dir / "state").exists()
        second = demo(env, "run")
        assert "resetting the earlier demo's files" in second.stdout, second.stdout[-3000:]
        assert_completed(second)
    finally:
        s = demo(env, "stop", 120)
        state = sandbox_state(demo_dir)
        subprocess.run(["rm", "-rf", str(demo_dir)], check=False)
    assert s.returncode == 0, s.stderr
    assert "demo stopped" in s.stdout
    assert_ended(state)


def test_a_demo_that_fails_midway_stops_everything_it_started():
    demo_dir = Path("/run") / f"gs-demo-fail-{os.getpid()}"
    env = dict(os.environ, GPUSHIFT_DEMO_DIR=str(demo_dir), GPUSHIFT_DEMO_BREAK="night")
    try:
        r = demo(env, "run")
        state = sandbox_state(demo_dir)
    finally:
        demo(env, "stop", 120)  # a no-op when the demo stopped itself, as it must
        subprocess.run(["rm", "-rf", str(demo_dir)], check=False)
    assert r.returncode != 0, r.stdout[-3000:]
    assert "demo step failed: gpushift switch demo-night" in r.stderr, r.stderr[-3000:]
    assert "everything the demo started is stopped" in r.stderr, r.stderr[-3000:]
    assert_ended(state)

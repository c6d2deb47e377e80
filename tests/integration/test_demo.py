"""`make demo` runs to completion (issue 2, acceptance 10): the same module the Makefile calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_demo_runs_to_completion_and_stops():
    demo_dir = Path("/run") / f"gs-demo-test-{os.getpid()}"
    env = dict(os.environ, GPUSHIFT_DEMO_DIR=str(demo_dir))
    try:
        r = subprocess.run(
            [sys.executable, "-m", "tests.support.demo", "run"],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        out = r.stdout
        assert "ok: demo-day is serving" in out and "ok: demo-night is serving" in out
        assert "release" in out and "ready" in out  # live progress, one line per phase
        assert "GPUs (SIMULATED" in out and "active:   demo-night" in out
        assert "demo-day → demo-night" in out  # the ledger
        assert "make demo-stop" in out
    finally:
        s = subprocess.run(
            [sys.executable, "-m", "tests.support.demo", "stop"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        state_file = demo_dir / "sandbox.json"
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        subprocess.run(["rm", "-rf", str(demo_dir)], check=False)
    assert s.returncode == 0, s.stderr
    assert "demo stopped" in s.stdout
    assert state.get("stopped") is True, state
    for key in ("manager_pid", "dbus_pid"):
        pid = state.get(key)
        status = Path(f"/proc/{pid}/status")
        # ended: gone, or a zombie waiting for a PID 1 that does not reap (containers)
        assert pid is None or not status.exists() or "Z (zombie)" in status.read_text(), (key, pid)

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
        r = subprocess.run([sys.executable, "-m", "gpushift.demo", "run"], env=env, capture_output=True,
                           text=True, timeout=240)
        assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        out = r.stdout
        assert "ok: demo-day is serving" in out and "ok: demo-night is serving" in out
        assert "release" in out and "ready" in out  # live progress, one line per phase
        assert "GPUs (SIMULATED" in out and "active:   demo-night" in out
        assert "demo-day → demo-night" in out  # the ledger
        assert "make demo-stop" in out
    finally:
        s = subprocess.run([sys.executable, "-m", "gpushift.demo", "stop"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert s.returncode == 0, s.stderr
    assert "demo stopped" in s.stdout
    assert json.loads((demo_dir / "sandbox.json").read_text())["stopped"] is True
    for pid in ("manager_pid", "dbus_pid"):
        p = json.loads((demo_dir / "sandbox.json").read_text())[pid]
        assert p is None or not Path(f"/proc/{p}").exists() or "Z (zombie)" in Path(f"/proc/{p}/status").read_text(), (pid, p, Path(f"/proc/{p}/status").read_text()[:300])
    subprocess.run(["rm", "-rf", str(demo_dir)], check=False)

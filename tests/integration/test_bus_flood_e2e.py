"""A flood of ``GetStatus`` calls cannot get the daemon restarted or starve other callers (issue 20,
point 4).

Any local user may call ``GetStatus`` on the system bus.  The shipped gpushift.service runs under a
private systemd user manager whose bus has the system bus's limits (``SYSTEM_BUS_LIMITS``: 128
pending replies per connection, 256 connections per user), with ``WatchdogSec=5`` by a drop-in so
that a starved watchdog shows within seconds.  A flooder (:mod:`tests.support.busflood`) keeps 128
calls outstanding on each of 200 connections — as many as one user may queue — for the whole test.
Meanwhile the daemon keeps its PID and its restart count (no watchdog restart), ``gpushift status``
answers from the daemon (not the CLI's own view of a daemon that does not answer), and a
``gpushift switch`` completes.  The worst ``gpushift status`` wall time seen is printed (no timed
assertion: docs/benchmarks.md has the figures, ``bench/status_flood.py``).

Before the watchdog thread and the cheap GetStatus path, the GLib loop answered the flood one
pydbus call after another and its watchdog timer ran only between whole batches: systemd restarted
the daemon.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpushift_env import Backend, GpushiftEnv, end, free_port

from tests.support.sandbox import SYSTEM_BUS_LIMITS, Sandbox, SandboxError, missing_tools

REPO = Path(__file__).resolve().parents[2]

CONNECTIONS = 200  # of the 256 one user may hold: the manager, the daemon and the CLI need some
WINDOW = SYSTEM_BUS_LIMITS["max_replies_per_connection"]
FLOOD_S = 300  # longer than the test; ended by PID when the test is done
WATCHDOG_S = 5
#: How long the flood is kept up while status is asked, before the switch (a few watchdog periods).
OBSERVE_S = 30


@pytest.fixture
def system_like_sandbox() -> Iterator[Sandbox]:
    """A private systemd user manager whose bus has the system bus's limits; stopped after the test."""
    missing = missing_tools()
    if missing:
        pytest.fail("this test needs a systemd user manager and D-Bus: missing " + ", ".join(missing))
    sb = Sandbox(bus_limits=SYSTEM_BUS_LIMITS)
    try:
        try:
            sb.start()
        except SandboxError as e:
            pytest.fail(f"could not boot the private systemd user manager: {e}", pytrace=False)
        yield sb
    finally:
        sb.stop()


class Progress:
    """The flooder's JSON lines, read on a thread of their own."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                self.lines.append(json.loads(line))
            except ValueError:
                self.lines.append({"text": line.strip()})

    def last(self) -> dict[str, Any]:
        return self.lines[-1] if self.lines else {}

    def answered(self) -> int:
        return int(self.last().get("answered", 0))


def test_a_getstatus_flood_neither_restarts_the_daemon_nor_starves_status_or_a_switch(
    system_like_sandbox: Sandbox,
) -> None:
    sb = system_like_sandbox
    a = Backend("a", free_port(), [0, 1], version="1.0.0", vram_mib=1000)
    b = Backend("b", free_port(), [0, 1], version="2.0.0", vram_mib=1000)
    env = GpushiftEnv(sb, Path(sb.base_dir or "/tmp") / "flood", [a, b], metrics_listen="")
    env.install()
    sb.install_dropin("gpushift.service", "60-watchdog.conf", f"[Service]\nWatchdogSec={WATCHDOG_S}\n")
    sb.daemon_reload()
    env.start_daemon()
    env.cli("switch", "a", "--reason", "setup", check=True)
    props = sb.show("gpushift.service", "MainPID", "NRestarts", "WatchdogUSec")
    assert props["WatchdogUSec"] in (f"{WATCHDOG_S}s", str(WATCHDOG_S * 1_000_000)), props
    pid, restarts = int(props["MainPID"]), props["NRestarts"]

    flooder = subprocess.Popen(
        [sys.executable, "-m", "tests.support.busflood", "--connections", str(CONNECTIONS),
         "--window", str(WINDOW), "--duration", str(FLOOD_S)],  # fmt: skip
        cwd=REPO,
        env=sb.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    progress = Progress(flooder)
    worst = 0.0
    try:

        def same_daemon() -> None:
            now = sb.show("gpushift.service", "MainPID", "NRestarts", "ActiveState")
            assert now["MainPID"] == str(pid) and now["NRestarts"] == restarts, (
                f"the daemon was restarted during the flood ({props} -> {now}); flood {progress.last()}"
                f"\n{env.daemon_log()[-3000:]}"
            )
            assert now["ActiveState"] == "active", now
            assert flooder.poll() is None, f"the flooder ended: {progress.lines[-3:]}"

        def status_answers() -> None:
            nonlocal worst
            t = time.monotonic()
            r = env.cli("status", "--json", timeout_s=120)
            worst = max(worst, time.monotonic() - t)
            assert r.returncode == 0, f"status exited {r.returncode} during the flood: {r.stderr}"
            daemon = json.loads(r.stdout)["daemon"]
            assert daemon.get("pid") == pid and daemon.get("running"), daemon

        # The flood reaches the daemon: thousands of calls answered.
        env.wait_for(lambda: progress.answered() > 20 * WINDOW, 120, "the flood's first answers")
        deadline = time.monotonic() + OBSERVE_S
        while time.monotonic() < deadline:
            same_daemon()
            status_answers()
            time.sleep(0.5)
        t = time.monotonic()
        r = env.cli("switch", "b", "--reason", "during the flood", timeout_s=180)
        switch_s = time.monotonic() - t
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{env.daemon_log()[-3000:]}"
        same_daemon()
        status_answers()
        assert env.status()["active"] == "b"
        during = progress.last()
        assert during.get("open") == CONNECTIONS, during
    finally:
        end(flooder)
    assert sb.show("gpushift.service", "MainPID")["MainPID"] == str(pid)
    assert sb.show("gpushift.service", "NRestarts")["NRestarts"] == restarts
    print(f"flood: {during}; worst status {worst:.2f} s; switch {switch_s:.2f} s")

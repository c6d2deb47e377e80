"""A flood of ``GetStatus`` calls cannot get the daemon restarted, and other callers still get through
(issue 20, point 4).

Any local user may call ``GetStatus`` on the system bus.  The shipped gpushift.service runs under a
private systemd user manager whose bus has the system bus's limits (``SYSTEM_BUS_LIMITS``: 128
pending replies per connection, 256 connections per user), with ``WatchdogSec=5`` by a drop-in so
that a missed watchdog shows within seconds.  The flooder (:mod:`tests.support.busflood`, a process
of its own) keeps 128 calls outstanding on each of its connections for the whole flood.

* **One user's maximum** (200 connections × 128, the rest of the 256 left to the manager, the daemon
  and the clients): the bus itself is then the bottleneck — dbus-daemon's bookkeeping of pending
  replies grows with their number, and every call through it waits seconds to tens of seconds, for
  GDBus's own ``Peer.Ping`` as for ``GetStatus`` (docs/benchmarks.md, ``status_flood``).  The daemon
  keeps its PID and its restart count while a ``gpushift switch`` is asked in the middle of the flood
  (asking the bus who the caller is used to block the loop for as long as the bus took, and systemd
  restarted the daemon), and it answers a status from another connection.  The switch's own client
  may give up first (the CLI waits 30 s for the answer to ``SwitchTo``; the bus took longer here):
  once the flood is over, a switch completes.
* **A flood the bus can carry** (16 connections × 128): ``gpushift status`` answers from the daemon
  every time it is asked, and ``gpushift switch`` completes, both within their own deadlines; the
  worst ``gpushift status`` wall time is printed (no timed assertion: the figures are in
  docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
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
WINDOW = SYSTEM_BUS_LIMITS["max_replies_per_connection"]
WATCHDOG_S = 5


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


class Flood:
    """The flooder's process and its JSON lines (read on a thread of their own); ended by PID."""

    def __init__(self, sb: Sandbox, connections: int, seconds: float) -> None:
        self.lines: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.busflood",
                "--connections",
                str(connections),
                "--window",
                str(WINDOW),
                "--duration",
                str(seconds),
            ],  # fmt: skip
            cwd=REPO,
            env=sb.env,
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.lines.append(json.loads(line))

    def answered(self) -> int:
        return int(self.lines[-1].get("answered", 0)) if self.lines else 0

    def running(self) -> bool:
        return self.proc.poll() is None

    def end(self) -> None:
        end(self.proc)


def two_backends(sb: Sandbox, name: str) -> GpushiftEnv:
    a = Backend("a", free_port(), [0, 1], version="1.0.0", vram_mib=1000)
    b = Backend("b", free_port(), [0, 1], version="2.0.0", vram_mib=1000)
    env = GpushiftEnv(sb, Path(sb.base_dir or "/tmp") / name, [a, b], metrics_listen="")
    env.install()
    sb.install_dropin("gpushift.service", "60-watchdog.conf", f"[Service]\nWatchdogSec={WATCHDOG_S}\n")
    sb.daemon_reload()
    env.start_daemon()
    env.cli("switch", "a", "--reason", "setup", check=True)
    watchdog = sb.show("gpushift.service", "WatchdogUSec")["WatchdogUSec"]
    assert watchdog in (f"{WATCHDOG_S}s", str(WATCHDOG_S * 1_000_000)), watchdog
    return env


class SameDaemon:
    """Checks that the daemon is the process it was (no restart, watchdog or other)."""

    def __init__(self, env: GpushiftEnv, flood: Flood) -> None:
        self.env, self.flood = env, flood
        props = env.sb.show("gpushift.service", "MainPID", "NRestarts")
        self.pid, self.restarts = int(props["MainPID"]), props["NRestarts"]

    def check(self) -> None:
        now = self.env.sb.show("gpushift.service", "MainPID", "NRestarts", "ActiveState")
        assert now["MainPID"] == str(self.pid) and now["NRestarts"] == self.restarts, (
            f"the daemon was restarted during the flood (PID {self.pid}, restarts {self.restarts} -> "
            f"{now}); flood {self.flood.lines[-1:]}\n{self.env.daemon_log()[-3000:]}"
        )
        assert now["ActiveState"] == "active", now


class StatusClient:
    """``GetStatus`` on a connection opened before the flood, asked again and again on a thread;
    every answer must come from the daemon (its PID) within a generous deadline."""

    def __init__(self, sb: Sandbox, timeout_s: float) -> None:
        from jeepney import DBusAddress, new_method_call
        from jeepney.io.blocking import open_dbus_connection

        self.conn = open_dbus_connection(bus=sb.bus_address, auth_timeout=30)
        addr = DBusAddress("/org/gpushift/Switcher1", "org.gpushift.Switcher1", "org.gpushift.Switcher1")
        self.call = new_method_call(addr, "GetStatus")
        self.timeout_s = timeout_s
        self.answers: list[tuple[float, int]] = []  # (seconds, the PID in the answer)
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from jeepney.wrappers import unwrap_msg

        while not self._stop.is_set():
            t = time.monotonic()
            try:
                (text,) = unwrap_msg(self.conn.send_and_get_reply(self.call, timeout=self.timeout_s))
                self.answers.append((time.monotonic() - t, int(json.loads(text)["daemon"]["pid"])))
            except Exception as e:
                self.failures.append(repr(e)[:300])
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout_s + 10)
        self.conn.close()


def test_one_users_maximum_flood_with_a_switch_asked_meanwhile_does_not_get_the_daemon_restarted(
    system_like_sandbox: Sandbox,
) -> None:
    sb = system_like_sandbox
    env = two_backends(sb, "max")
    status = StatusClient(sb, timeout_s=120)
    flood = Flood(sb, 200, 45)
    same = SameDaemon(env, flood)
    switcher: subprocess.Popen[str] | None = None
    asked: tuple[int | None, str] | None = None
    try:
        env.wait_for(lambda: flood.answered() > 2 * WINDOW or not flood.running(), 120, "the flood's answers")
        assert flood.running(), flood.lines[-3:]
        started = time.monotonic()
        while flood.running():
            same.check()
            if switcher is None and time.monotonic() - started > 5:
                # its client may give up on the slow bus (the CLI waits 30 s for SwitchTo's answer);
                # the daemon takes the switch when the bus delivers it
                switcher = env.cli_popen("switch", "b", "--reason", "during the flood")
            time.sleep(1)
        during = flood.lines[-1]
        same.check()
    finally:
        flood.end()
        status.stop()
        if switcher is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                asked = (switcher.returncode, switcher.communicate(timeout=120)[1][-300:])
            end(switcher)
    assert during.get("done") and during.get("open") == 200 and during["answered"] > 10 * WINDOW, during
    assert status.answers, f"no status answered during the flood: {status.failures[-3:]}"
    assert {pid for _, pid in status.answers} == {same.pid}, status.answers
    assert not status.failures, status.failures[-3:]
    # Once the flood is over, the same daemon switches.
    env.wait_for(lambda: env.status()["daemon"].get("state") == "idle", 120, "the daemon to be idle")
    r = env.cli("switch", "b", "--reason", "after the flood", timeout_s=180)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert env.status()["active"] == "b"
    same.check()
    worst = max(s for s, _ in status.answers)
    print(
        f"flood: {during}; status answers {len(status.answers)}, worst {worst:.1f} s; switch asked meanwhile: {asked}"
    )


def test_during_a_flood_the_bus_can_carry_gpushift_status_answers_and_gpushift_switch_completes(
    system_like_sandbox: Sandbox,
) -> None:
    sb = system_like_sandbox
    env = two_backends(sb, "carry")
    flood = Flood(sb, 16, 300)
    same = SameDaemon(env, flood)
    worst = 0.0
    try:
        env.wait_for(
            lambda: flood.answered() > 20 * WINDOW or not flood.running(), 120, "the flood's answers"
        )
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            same.check()
            t = time.monotonic()
            r = env.cli("status", "--json", timeout_s=120)
            worst = max(worst, time.monotonic() - t)
            assert r.returncode == 0, f"status exited {r.returncode} during the flood: {r.stderr}"
            assert json.loads(r.stdout)["daemon"]["pid"] == same.pid
            time.sleep(0.5)
        t = time.monotonic()
        r = env.cli("switch", "b", "--reason", "during the flood", timeout_s=180)
        switch_s = time.monotonic() - t
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{env.daemon_log()[-3000:]}"
        assert env.active_state("gs-b.service") == "active"
        # status's picture of who serves comes from the sampler, whose reads of systemd wait on the
        # busy bus too: it follows within a few periods
        env.wait_for(lambda: env.status().get("active") == "b", 60, "status to show b serving")
        same.check()
        assert flood.running(), flood.lines[-3:]
        during = flood.lines[-1]
    finally:
        flood.end()
    same.check()
    print(f"flood: {during}; worst status {worst:.2f} s; switch {switch_s:.2f} s")

"""Hostile files where the daemon keeps its state, on the real daemon: the shipped gpushift.service
under a real systemd user manager (issue 20, point 5).

``run.json`` as a FIFO (a plain ``open()`` blocked the daemon's start until systemd gave up, every
start), as a symlink to ``/dev/zero`` (its memory grew by about 1 GB/s), as a 100 MB file; the
ledger's head file and a pending spool file as FIFOs; ``override.json`` as a symlink out of the
state directory (obeyed before).  Each time: ``systemctl start`` returns in time and the daemon keeps
its PID and a small memory, ``gpushift status`` answers, the file is moved aside (and said so in the
journal, and in ``status`` where the daemon shows such facts), and a switch works.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpushift_env import Backend, GpushiftEnv, free_port

#: The daemon's resident memory never goes past this while it starts (it needs well under 200 MiB);
#: past KILL_RSS the test ends it at once: a regression must not take the machine's memory.
MAX_RSS_MIB = 400
KILL_RSS_MIB = 1024
#: How long ``systemctl start`` may take (the unit's TimeoutStartSec= is 60 s).
START_DEADLINE_S = 55


class MemoryGuard:
    """Samples the daemon's resident memory every 0.1 s for the whole test; kills the daemon when
    it passes :data:`KILL_RSS_MIB` (``peak`` says how far it got)."""

    def __init__(self, env: GpushiftEnv) -> None:
        self.env = env
        self.peak = 0.0
        self.killed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.1):
            try:
                pid = int(self.env.sb.show("gpushift.service", "MainPID").get("MainPID", "0"))
            except Exception:  # noqa: BLE001 - the manager is going away at the test's end
                continue
            self.peak = max(self.peak, rss_mib(pid) if pid else 0.0)
            if self.peak > KILL_RSS_MIB and not self.killed:
                self.killed = True
                self.env.sb.systemctl("kill", "--signal=SIGKILL", "gpushift.service", check=False)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.fixture
def env(sandbox: Any) -> Iterator[GpushiftEnv]:
    """Backends a and b, no schedule; the state and runtime directories made, the daemon not
    started; its memory guarded throughout (and checked at the end)."""
    base = Path(sandbox.base_dir) / "gs"
    a = Backend("a", free_port(), [0, 1], version="1.0.0", vram_mib=6000)
    b = Backend("b", free_port(), [0, 1], version="2.0.0", vram_mib=6000)
    e = GpushiftEnv(sandbox, base, [a, b], reconcile_interval_s=2)
    e.install()
    e.state_dir.mkdir(parents=True, exist_ok=True)
    e.runtime_dir.mkdir(parents=True, exist_ok=True)
    guard = MemoryGuard(e)
    try:
        yield e
    finally:
        guard.stop()
    assert guard.peak <= MAX_RSS_MIB, f"the daemon's memory reached {guard.peak:.0f} MiB"


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def start_guarded(env: GpushiftEnv) -> int:
    """``systemctl start gpushift.service``; returns the MainPID.  Fails when the start fails or
    does not return within :data:`START_DEADLINE_S` (the memory is the guard's)."""
    t0 = time.monotonic()
    try:
        r = env.sb.systemctl("start", "gpushift.service", check=False, timeout_s=START_DEADLINE_S)
        rc, err = r.returncode, r.stderr
    except subprocess.TimeoutExpired:
        rc, err = None, "(timed out)"
    if rc != 0:
        raise AssertionError(
            f"systemctl start: exit {rc} after {time.monotonic() - t0:.1f}s: {err}\n"
            f"--- daemon log:\n{env.daemon_log()[-3000:]}"
        )
    return env.main_pid("gpushift.service")


def still_the_same_daemon(env: GpushiftEnv, pid: int) -> None:
    assert env.main_pid("gpushift.service") == pid, env.daemon_log()[-3000:]
    assert env.sb.show("gpushift.service", "NRestarts")["NRestarts"] == "0"
    assert rss_mib(pid) < MAX_RSS_MIB


def switch_works(env: GpushiftEnv, backend: str = "a") -> None:
    env.cli("switch", backend, "--reason", "after the hostile file", check=True)
    st = env.status()
    assert st["active"] == backend, st


def set_aside(folder: Path, name: str) -> list[Path]:
    return sorted(folder.glob(f"{name}.bad-*"))


def events(env: GpushiftEnv, event: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in env.daemon_log().splitlines() if f'"event": "{event}"' in line]


# ------------------------------------------------------------------ run.json


def fifo(path: Path) -> None:
    os.mkfifo(path, 0o600)


def dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def hundred_mb(path: Path) -> None:
    # A run the daemon could parse, 100 MB of it: read whole, before, and believed.
    with open(path, "w", encoding="ascii") as f:
        f.write('{"ticket": "t-hostile", "to": "b", "pad": "')
        chunk = "x" * (1024 * 1024)
        for _ in range(100):
            f.write(chunk)
        f.write('"}')


@pytest.mark.parametrize("make", [fifo, dev_zero, hundred_mb], ids=["fifo", "dev-zero", "100mb"])
def test_a_hostile_run_file_is_set_aside_and_the_daemon_starts(env: GpushiftEnv, make: Any) -> None:
    run = env.state_dir / "run.json"
    make(run)
    pid = start_guarded(env)
    st = env.status()
    assert st["daemon"]["running"] and st["daemon"]["pid"] == pid, st["daemon"]
    assert not os.path.lexists(run)
    (moved,) = set_aside(env.state_dir, "run.json")
    (line,) = events(env, "run_store_set_aside")
    assert line["path"] == str(run) and line["moved_to"] == str(moved), line
    assert line["level"] == "error"
    # status says so, in --json and in the text
    assert str(moved) in (st["daemon"].get("run_ignored") or ""), st["daemon"]
    assert "run store: SET ASIDE at start" in env.cli("status").stdout
    switch_works(env)
    still_the_same_daemon(env, pid)
    assert not os.path.lexists(run), "the switch's run is removed once its row is complete"


# ------------------------------------------------------------------ the ledger


def test_a_fifo_as_the_ledger_head_is_set_aside_and_raises_the_alarm(env: GpushiftEnv) -> None:
    head = env.state_dir / "ledger.head"
    fifo(head)
    pid = start_guarded(env)
    assert env.status()["daemon"]["pid"] == pid
    switch_works(env)  # the ledger's writer opens: the head is checked
    (moved,) = set_aside(env.state_dir, "ledger.head")
    assert os.path.isfile(head) and not os.path.islink(head), "a regular head file again"
    (line,) = events(env, "ledger_head_set_aside")
    assert line["moved_to"] == str(moved) and "FIFO" in line["error"], line
    alarm = env.status()["ledger"]["alarm"]
    assert alarm and "not a regular file (FIFO)" in alarm and str(moved) in alarm, alarm
    assert "TAMPER ALARM" in env.cli("status").stdout
    (row,) = env.ledger()
    assert (row["to"], row["outcome"]) == ("a", "ok")
    switch_works(env, "b")  # the alarm stands; the ledger still takes rows
    still_the_same_daemon(env, pid)


def test_a_fifo_in_the_ledger_spool_is_set_aside(env: GpushiftEnv) -> None:
    spool = env.runtime_dir / "ledger-pending"
    spool.mkdir()
    bad = spool / "0c0ffee0-0000-4000-8000-000000000000.json"
    fifo(bad)
    pid = start_guarded(env)
    assert env.status()["daemon"]["pid"] == pid
    assert not os.path.lexists(bad)
    kept = Path(f"{bad}.bad")
    assert kept.is_fifo(), "kept for a person, as it was"
    (line,) = events(env, "ledger_spool_bad_file")
    assert line["path"] == str(bad) and line["kept"] == str(kept), line
    assert "not a regular file (FIFO)" in line["error"]
    assert env.status()["ledger"].get("bad_files") == [f"{bad}: not a regular file (FIFO)"], env.status()[
        "ledger"
    ]
    switch_works(env)
    assert [r["outcome"] for r in env.ledger()] == ["ok"]
    still_the_same_daemon(env, pid)


# ------------------------------------------------------------------ override.json


def test_an_override_linked_from_outside_the_state_directory_is_not_obeyed(env: GpushiftEnv) -> None:
    elsewhere = env.base / "elsewhere.json"
    elsewhere.write_text(
        json.dumps(
            {
                "mode": "hold",
                "backend": "b",
                "until": None,
                "set_by": "mallory",
                "set_at": "2026-01-01T08:00:00+00:00",
                "reason": "linked in",
                "source": "manual",
                "when_idle": False,
            }
        )
    )
    link = env.state_dir / "override.json"
    link.symlink_to(elsewhere)
    pid = start_guarded(env)
    st = env.status()
    why = st["daemon"]["override_ignored"]
    (moved,) = set_aside(env.state_dir, "override.json")
    assert why and why.startswith(f"a symbolic link out of {env.state_dir}"), st["daemon"]
    assert st["mode"] != "hold" and "b" not in (st.get("running") or []), st
    assert os.path.islink(moved) and elsewhere.exists(), "the link is moved, its target untouched"
    (line,) = events(env, "override_ignored")
    assert line["moved_to"] == str(moved) and line["error"] == why, line
    switch_works(env)
    saved = json.loads((env.state_dir / "override.json").read_text())
    assert saved["backend"] == "a" and not os.path.islink(env.state_dir / "override.json")
    still_the_same_daemon(env, pid)

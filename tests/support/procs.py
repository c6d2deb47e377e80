"""Processes the sandbox started, recognised and ended by PID (never by name).

A PID is recorded with its start time (``/proc/PID/stat``), so that a later stop never signals a
process that merely reuses the number.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable
from typing import Any


class Lines:
    """The lines a started process prints, read on a thread of their own (never blocks the test)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line.strip())

    def has(self, prefix: str) -> str | None:
        """The first line so far that starts with ``prefix`` (None: none yet)."""
        return next((line for line in self.lines if line.startswith(prefix)), None)


def first_executable(candidates: Iterable[str]) -> str | None:
    """The first of these paths that this user may execute (None: none of them)."""
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


def proc_starttime(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), or None.

    Recorded beside every PID so that a later ``stop`` never signals a recycled PID.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = data[data.rindex(b")") + 2 :].split()
    if rest[0] == b"Z":  # a zombie is already dead: nothing to signal
        return None
    return int(rest[19])


def alive(pid: int, starttime: int | None) -> bool:
    now = proc_starttime(pid)
    return now is not None and (starttime is None or now == starttime)


def end_pid(pid: int, starttime: int | None, child: subprocess.Popen[Any] | None, grace_s: float) -> None:
    """SIGTERM one process we started, wait ``grace_s``, then SIGKILL; reap it when it is our child."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if child is not None and child.poll() is not None:
            return
        if child is None and not alive(pid, starttime):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if child is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=0.05)
                if child.poll() is not None:
                    return
            elif not alive(pid, starttime):
                return
            else:
                time.sleep(0.05)

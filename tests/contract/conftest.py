"""Shared fixtures of the contract tests: real processes (file holders, private buses), stopped by PID.

Helpers reach the tests through the ``procs`` fixture (not by importing this module: every test
directory has a ``conftest`` and an import by that name would be ambiguous).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

HOLD = [sys.executable, "-m", "gpushift.adapters.simgpu", "hold"]

#: Runs a command as user nobody, without root's groups (the tests run as root).
AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


class Processes:
    """Starts processes for one test and ends every one of them (by PID) afterwards."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []
        self.extra_pids: list[int] = []

    def start(self, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[str]:
        p = subprocess.Popen(  # noqa: S603 - argv built by the test
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **kwargs,  # type: ignore[call-overload]
        )
        self.started.append(p)
        return p

    def hold(self, *paths: str) -> subprocess.Popen[str]:
        """A real process with ``paths`` open (the simgpu holder program); returns once they are open."""
        p = self.start([*HOLD, *paths])
        line = p.stdout.readline() if p.stdout else ""
        if not line.startswith("holding"):
            err = p.stderr.read() if p.stderr else ""
            raise AssertionError(f"holder did not start: {line!r} {err!r}")
        return p

    def adopt(self, pid: int) -> None:
        """A PID the test did not start directly (a forked grandchild) that it must still end."""
        self.extra_pids.append(pid)

    @staticmethod
    def require_setpriv() -> None:
        """The non-root tests need setpriv (util-linux) and root to switch users."""
        if shutil.which("setpriv") is None:
            raise AssertionError("setpriv (util-linux) is needed to run a probe as user nobody")
        if os.geteuid() != 0:
            raise AssertionError(
                "this test must run as root: it runs a probe as user nobody beside a root holder"
            )

    @staticmethod
    def wait_until(cond: Callable[[], bool], timeout_s: float = 10.0, interval_s: float = 0.05) -> bool:
        """Poll ``cond`` until it is true or the deadline passes; returns its last value."""
        deadline = time.monotonic() + timeout_s
        while True:
            if cond():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval_s)

    @staticmethod
    def pid_alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    def stop_all(self) -> None:
        for pid in self.extra_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in self.started:
            if p.poll() is None:
                p.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
            for stream in (p.stdout, p.stderr):
                if stream:
                    stream.close()


@pytest.fixture
def procs() -> Iterator[Processes]:
    ps = Processes()
    try:
        yield ps
    finally:
        ps.stop_all()


@pytest.fixture
def shared_dir() -> Iterator[str]:
    """A temp dir that user nobody can traverse (pytest's own tmp_path is 0700 under root)."""
    d = tempfile.mkdtemp(prefix="gpushift-contract-")
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def ledger_paths(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A ledger database file and a runtime directory for its spool (neither exists yet)."""
    yield tmp_path / "state" / "ledger.db", tmp_path / "run"


@pytest.fixture
def start_bus(procs: Processes, tmp_path: Path) -> Callable[[], str]:
    """Starts a private dbus-daemon (session configuration) for this test; returns its address.

    Each call starts another one; ``procs`` ends them all afterwards, by PID.
    """
    if shutil.which("dbus-daemon") is None:
        raise AssertionError("dbus-daemon is needed for the D-Bus tests (apt-get install dbus-daemon)")
    count = [0]

    def start() -> str:
        count[0] += 1
        socket = tmp_path / f"bus-{count[0]}"
        p = procs.start(
            [
                "dbus-daemon",
                "--session",
                "--nofork",
                "--nopidfile",
                "--nosyslog",
                "--print-address=1",
                f"--address=unix:path={socket}",
            ]
        )
        assert p.stdout is not None
        ready, _, _ = select.select([p.stdout], [], [], 10)
        address = p.stdout.readline().strip() if ready else ""
        if not address:
            err = p.stderr.read() if p.poll() is not None and p.stderr else ""
            raise AssertionError(f"dbus-daemon did not print its address within 10 s: {err!r}")
        return address

    return start

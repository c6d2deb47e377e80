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
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

HOLD = [sys.executable, "-m", "gpushift.host.simgpu", "hold"]

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


def release_fifo(path: str | os.PathLike[str]) -> None:
    """Open FIFO ``path`` for writing for a moment: a reader blocked in ``open()`` on it goes on."""
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))


@pytest.fixture
def fifos(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``fifos(name)`` makes a FIFO nobody writes to under ``tmp_path``; each is released at the end,
    so a reader stuck on one (the bug a test looks for) does not stay blocked."""
    made: list[Path] = []

    def make(name: str) -> Path:
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(p)
        made.append(p)
        return p

    try:
        yield make
    finally:
        for p in made:
            release_fifo(p)


class Served:
    """A real :class:`SwitcherService` published on a private bus, its GLib loop on a thread."""

    def __init__(self, address: str, service: Any, bus: Any, loop: Any, thread: threading.Thread) -> None:
        self.address = address
        self.service = service
        self.bus = bus
        self.loop = loop
        self.thread = thread
        self.busctl = [f"--address={address}"]  # for tests.support.busctl

    def on_loop(self, fn: Callable[[], Any], timeout_s: float = 10) -> Any:
        """Run ``fn`` on the service's loop thread (where the daemon runs it) and return its result."""
        from gi.repository import GLib

        done = threading.Event()
        box: list[Any] = []

        def run() -> bool:
            try:
                box.append(fn())
            finally:
                done.set()
            return False

        GLib.idle_add(run)
        assert done.wait(timeout_s), "the service's loop did not run the call"
        return box[0] if box else None


@pytest.fixture
def serve(start_bus: Callable[[], str]) -> Iterator[Callable[..., Served]]:
    """``serve(backend, cls=SwitcherService)`` publishes the service over ``backend`` (the daemon's
    side, a fake) on a private bus of its own, with a GLib main loop on a thread; everything is
    unpublished, stopped and closed afterwards (the bus by PID, through ``procs``)."""
    from gi.repository import GLib

    from gpushift.bus import service as dbus_service
    from gpushift.host.dbus import connect

    served: list[tuple[Served, Any]] = []

    def start(backend: Any, cls: Any = None) -> Served:
        address = start_bus()
        bus = connect("session", address)
        service = (cls or dbus_service.SwitcherService)(bus, backend, allowed_group="root")
        publication = dbus_service.publish(bus, service)
        loop = GLib.MainLoop()
        thread = threading.Thread(target=loop.run, name="dbus-loop", daemon=True)
        thread.start()
        s = Served(address, service, bus, loop, thread)
        served.append((s, publication))
        return s

    try:
        yield start
    finally:
        for s, publication in served:
            with contextlib.suppress(Exception):
                s.on_loop(publication.unpublish)
            s.loop.quit()
            s.thread.join(timeout=10)
            with contextlib.suppress(Exception):
                s.bus.con.close_sync(None)

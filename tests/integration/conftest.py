"""Integration fixtures: a REAL systemd user manager on a REAL D-Bus session bus, per test.

``sandbox`` is FUNCTION-scoped on purpose: every test gets a fresh manager (≈0.2 s to boot here),
so a unit left failed, a transient scope, or an orphan from one test can never change the next
one's outcome.  It is always stopped again (every unit, then the manager, then the bus, by PID;
processes left in its private cgroup are SIGKILLed by PID), even when the test fails.

When systemd or dbus-daemon is missing the fixture FAILS with a message saying what to install:
an integration test that cannot reach its real dependency is not allowed to pass by skipping.

Unit logs: the sandbox runs a private journald (``sandbox.journal(...)`` reads it); stand-in units log
there and also append their lines to a file (see :func:`standin_unit_text`), which tests poll and
assertion messages show.

Fixtures: ``sandbox``, ``install_standin`` (a factory), ``bus`` (a pydbus connection to the
sandbox's bus), ``procs`` (the processes a test starts, ended by PID after it), ``wait_for`` and
``free_port`` (helpers as fixtures: test modules do not import conftest.py, whose module name is
ambiguous across test directories).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gpushift_env import end

from tests.support import standin
from tests.support.sandbox import Sandbox, SandboxError, missing_tools

PY = sys.executable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    predicate: Callable[[], Any], timeout_s: float, what: str, detail: Callable[[], str] | None = None
) -> Any:
    """Poll ``predicate`` every 50 ms until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{detail()}" if detail else ""
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}{extra}")
        time.sleep(0.05)


def standin_unit_text(
    port: int,
    log: Path | str,
    args: Sequence[str] = (),
    *,
    description: str = "gpushift stand-in backend (test)",
    environment: Sequence[str] = (),
    exec_start: str | None = None,
    timeout_stop_s: int = 3,
    unit_lines: Sequence[str] = (),
    service_lines: Sequence[str] = (),
) -> str:
    """A backend unit running the stand-in (``tests.support.standin``), shaped like the shipped backends.

    ``Type=simple``, ``KillMode=control-group``, ``SendSIGKILL=yes``, a short ``TimeoutStopSec``,
    stdout/stderr to the sandbox's journal, and the stand-in's lines appended to ``log`` as well
    (``$STANDIN_LOG_FILE``).  The port reaches the command through
    ``Environment=STANDIN_PORT=`` and ``${STANDIN_PORT}``, so tests can compare the command as
    written with the one that runs.
    """
    cmd = exec_start or f"{standin.unit_command(PY)} --port ${{STANDIN_PORT}} {' '.join(args)}".rstrip()
    env_lines = [
        f"Environment=STANDIN_PORT={port}",
        "Environment=PYTHONUNBUFFERED=1",
        f"Environment={standin.UNIT_ENVIRONMENT}",
        f'Environment="STANDIN_LOG_FILE={log}"',
    ]
    env_lines += [f"Environment={e}" for e in environment]
    return "\n".join(
        [
            "[Unit]",
            f"Description={description}",
            *unit_lines,
            "",
            "[Service]",
            "Type=simple",
            *env_lines,
            f"ExecStart={cmd}",
            "KillMode=control-group",
            "SendSIGKILL=yes",
            f"TimeoutStopSec={timeout_stop_s}",
            "StandardOutput=journal",
            "StandardError=journal",
            *service_lines,
            "",
        ]
    )


@dataclass
class StandinUnit:
    """A stand-in unit installed in a sandbox."""

    name: str
    port: int
    log: Path
    path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return f"(no log at {self.log})"


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    """A started private systemd user manager + session bus; stopped after the test, whatever happens."""
    missing = missing_tools()
    if missing:
        pytest.fail(
            "integration tests need a real systemd user manager and D-Bus: missing "
            + ", ".join(missing)
            + " (Debian/Ubuntu: apt-get install systemd dbus)",
            pytrace=False,
        )
    sb = Sandbox()
    try:
        try:
            sb.start()
        except SandboxError as e:
            pytest.fail(f"could not boot the private systemd user manager: {e}", pytrace=False)
        yield sb
    finally:
        sb.stop()


@pytest.fixture
def install_standin(sandbox: Sandbox, tmp_path: Path) -> Callable[..., StandinUnit]:
    """Factory: ``install_standin("a.service", "--version", "1.0", ...)`` writes the unit and reloads.

    Keyword arguments go to :func:`standin_unit_text` (``port=`` picks the port, default a free one).
    The log file is ``tmp_path/<name>.log`` (kept after the test for a post-mortem).
    """

    def install(
        name: str, *args: str, port: int | None = None, reload: bool = True, **kw: Any
    ) -> StandinUnit:
        port = port if port is not None else free_port()
        log = tmp_path / f"{name}.log"
        path = sandbox.install_unit(name, standin_unit_text(port, log, args, **kw))
        if reload:
            sandbox.daemon_reload()
        return StandinUnit(name=name, port=port, log=log, path=path)

    return install


@pytest.fixture(name="wait_for")
def wait_for_fixture() -> Callable[..., Any]:
    """:func:`wait_for` as a fixture (test modules should not import from conftest.py)."""
    return wait_for


@pytest.fixture(name="free_port")
def free_port_fixture() -> Callable[[], int]:
    """:func:`free_port` as a fixture."""
    return free_port


@pytest.fixture
def bus(sandbox: Sandbox) -> Iterator[Any]:
    """A pydbus connection of this test's own to the sandbox's session bus (closed afterwards)."""
    try:
        from gpushift.host.dbus import connect
    except ImportError as e:  # pragma: no cover - the venv has them
        pytest.fail(f"pydbus/PyGObject are needed for the systemd adapter tests: {e}", pytrace=False)
    b = connect("session", sandbox.bus_address)
    try:
        yield b
    finally:
        with contextlib.suppress(Exception):
            b.con.close_sync(None)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """The processes the test starts; each is ended by PID afterwards, also on failure."""
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for p in started:
            end(p)

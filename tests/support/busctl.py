"""busctl(1) as the tests' D-Bus client: the tool a person uses, not gpushift's own client.

:func:`busctl` runs one command against a bus (``--address=`` for a private dbus-daemon, ``--user``
for the sandbox's session bus); :class:`Monitor` runs ``busctl monitor --json=short`` in the
background and collects the messages it sees, in order, as dictionaries; :func:`properties_changed`
picks gpushift's PropertiesChanged signals out of them with their values decoded.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpushift.bus.names import BUS_NAME, INTERFACE, OBJECT_PATH

PROPERTIES = "org.freedesktop.DBus.Properties"


def require() -> str:
    path = shutil.which("busctl")
    if path is None:
        raise AssertionError("busctl (systemd) is needed: the D-Bus tests use it as the client")
    return path


def busctl(
    bus: Sequence[str],
    *args: str,
    check: bool = True,
    timeout_s: float = 30,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``busctl <bus> <args>``; ``bus`` is e.g. ``["--address=unix:path=..."]`` or ``["--user"]``
    (then ``env`` names the user bus: ``$DBUS_SESSION_BUS_ADDRESS``, ``$XDG_RUNTIME_DIR``)."""
    r = subprocess.run(
        [require(), *bus, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=dict(env) if env is not None else None,
    )
    if check and r.returncode != 0:
        raise AssertionError(f"busctl {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def get_property(bus: Sequence[str], name: str, env: Mapping[str, str] | None = None) -> str:
    """The property as busctl prints it (``s "day"``, ``(st) "night" 1764619200``)."""
    return busctl(bus, "get-property", BUS_NAME, OBJECT_PATH, INTERFACE, name, env=env).stdout.strip()


def call(
    bus: Sequence[str],
    member: str,
    signature: str = "",
    *args: str,
    check: bool = True,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    sig = [signature, *args] if signature else []
    return busctl(bus, "call", BUS_NAME, OBJECT_PATH, INTERFACE, member, *sig, check=check, env=env)


def _plain(value: Any) -> Any:
    """busctl's JSON for a variant is ``{"type": ..., "data": ...}``: the data, recursively."""
    if isinstance(value, dict) and set(value) == {"type", "data"}:
        return _plain(value["data"])
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def properties_changed(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The changed values of each of gpushift's PropertiesChanged signals among ``messages``."""
    out = []
    for m in messages:
        if m.get("member") == "PropertiesChanged" and m.get("interface") == PROPERTIES:
            data = m.get("payload", {}).get("data") or []
            if data and data[0] == INTERFACE:
                out.append(_plain(data[1]))
    return out


def _longer_than(count: int, messages: list[dict[str, Any]]) -> bool:
    return len(messages) > count


class Monitor:
    """``busctl monitor`` in the background, from :meth:`start` until :meth:`stop` (ended by PID)."""

    def __init__(self, bus: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.bus = list(bus)
        self.env = dict(env) if env is not None else None
        self.messages: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def start(self, sync: Callable[[], None]) -> Monitor:
        """Start monitoring; ``sync()`` makes one call that the monitor must see before this returns
        (busctl prints nothing that tells it is listening)."""
        self._proc = subprocess.Popen(
            [require(), *self.bus, "monitor", "--json=short"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            mark = len(self.snapshot())
            sync()
            if self.wait_for(functools.partial(_longer_than, mark), 2):
                return self
        raise AssertionError(f"busctl monitor saw nothing within 20 s: {self.stop_and_stderr()}")

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            with contextlib.suppress(ValueError):
                msg = json.loads(line)
                with self._lock:
                    self.messages.append(msg)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.messages)

    def wait_for(self, cond: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 10) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if cond(self.snapshot()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def stop_and_stderr(self) -> str:
        p = self._proc
        if p is None:
            return ""
        if p.poll() is None:
            p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)
        if self._thread is not None:
            self._thread.join(timeout=5)
        err = p.stderr.read() if p.stderr is not None else ""
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()
        self._proc = None
        return err or ""

    def stop(self) -> None:
        self.stop_and_stderr()

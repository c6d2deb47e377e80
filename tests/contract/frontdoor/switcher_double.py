"""Helpers of the daemon link's contract tests: a private bus, a scripted ``org.gpushift.Switcher1``
and a recording core.

* :func:`start_bus` runs a real ``dbus-daemon`` with a config of the test's (a permissive policy
  that lets any user connect: the tests call as user nobody too), ended by PID by the caller.
* :class:`SwitcherDouble` owns ``org.gpushift.Switcher1`` on that bus, answers ``GetAll`` from its
  ``props`` and sends ``PropertiesChanged`` for each :meth:`~SwitcherDouble.change`, the way the
  daemon's service does; ``stale_before_reply`` makes it send a change just before its ``GetAll``
  answer (what a race between the two looks like on the wire).
* :class:`RecordingCore` is the front door's core reduced to answers and a record of every call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import subprocess
from pathlib import Path
from typing import Any

from jeepney import (
    DBusAddress,
    HeaderFields,
    Message,
    MessageType,
    new_error,
    new_method_call,
    new_method_return,
    new_signal,
)

from gpushift.frontdoor.busconn import BusConnection
from gpushift.frontdoor.view import DaemonView

SWITCHER = "org.gpushift.Switcher1"
SWITCHER_PATH = "/org/gpushift/Switcher1"
FRONTDOOR = DBusAddress(
    "/org/gpushift/FrontDoor1", bus_name="org.gpushift.FrontDoor1", interface="org.gpushift.FrontDoor1"
)

BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={socket}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_destination="*"/>
    <allow send_type="signal"/>
    <allow receive_sender="*"/>
  </policy>
</busconfig>
"""


def start_bus(directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A dbus-daemon on ``directory/bus`` (the directory must be searchable by everyone); its address."""
    sock = directory / "bus"
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    config = directory / "bus.conf"
    config.write_text(BUS_CONFIG.format(socket=sock))
    p = subprocess.Popen(
        [
            "dbus-daemon",
            f"--config-file={config}",
            "--nofork",
            "--nopidfile",
            "--nosyslog",
            "--print-address=1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert p.stdout is not None
    ready, _, _ = select.select([p.stdout], [], [], 10)
    if not ready or not p.stdout.readline().strip():
        p.kill()
        raise AssertionError(f"dbus-daemon did not start: {p.stderr.read() if p.stderr else b''!r}")
    os.chmod(sock, 0o777)
    return p, f"unix:path={sock}"


def variant(value: Any) -> tuple[str, Any]:
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, dict) and all(isinstance(v, (list, tuple)) for v in value.values()):
        return ("a{sas}", {k: list(v) for k, v in value.items()})
    if isinstance(value, dict):
        return ("a{st}", value)
    raise TypeError(value)


class SwitcherDouble:
    """A scripted ``org.gpushift.Switcher1``: see the module docstring."""

    def __init__(self, address: str, props: dict[str, Any]) -> None:
        self.address = address
        self.props = dict(props)
        self.stale_before_reply: dict[str, Any] | None = None
        self.conn: BusConnection | None = None
        self.reads = 0
        self._pump: asyncio.Task[None] | None = None

    async def start(self) -> SwitcherDouble:
        self.conn = await BusConnection.open(self.address, 5)
        self._pump = asyncio.ensure_future(self.conn.pump(self._on_message))
        (answer,) = await self.conn.bus_call("RequestName", "su", (SWITCHER, 4), 5)
        assert answer == 1, answer
        return self

    async def stop(self) -> None:
        if self.conn is not None:
            await self.conn.close()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(BaseException):
                await self._pump

    def _on_message(self, msg: Message) -> None:
        if msg.header.message_type == MessageType.method_call:
            asyncio.ensure_future(self._answer(msg))

    async def _answer(self, msg: Message) -> None:
        assert self.conn is not None
        member = msg.header.fields.get(HeaderFields.member)
        if member == "GetAll":
            self.reads += 1
            if self.stale_before_reply is not None:
                await self.conn.send(self._signal(self.stale_before_reply))
                self.stale_before_reply = None
            reply = new_method_return(msg, "a{sv}", ({k: variant(v) for k, v in self.props.items()},))
        else:
            reply = new_error(msg, "org.freedesktop.DBus.Error.UnknownMethod", "s", (str(member),))
        await self.conn.send(reply)

    def _signal(self, changed: dict[str, Any]) -> Message:
        emitter = DBusAddress(SWITCHER_PATH, interface="org.freedesktop.DBus.Properties")
        body = (SWITCHER, {k: variant(v) for k, v in changed.items()}, [])
        return new_signal(emitter, "PropertiesChanged", "sa{sv}as", body)

    async def change(self, **changed: Any) -> None:
        assert self.conn is not None
        self.props.update(changed)
        await self.conn.send(self._signal(changed))

    async def call_frontdoor(self, member: str, signature: str | None = None, *args: Any) -> Any:
        """A call to the front door from the daemon's own connection (the owner of Switcher1)."""
        assert self.conn is not None
        return (await self.conn.call(new_method_call(FRONTDOOR, member, signature, args), 5)).body


class RecordingCore:
    """The core's methods with fixed answers; every call recorded."""

    def __init__(self) -> None:
        self.views: list[DaemonView] = []
        self.calls: list[tuple[str, Any]] = []
        self.closed: set[str] = set()
        self.held = 0
        self.changed = asyncio.Event()

    def update(self, view: DaemonView) -> None:
        self.views.append(view)
        self.changed.set()

    async def close(self, backend: str) -> int:
        self.calls.append(("close", backend))
        self.closed.add(backend)
        return 2

    def in_flight(self, backend: str) -> int:
        self.calls.append(("in_flight", backend))
        return 1

    async def release(self, serving: str) -> tuple[int, float]:
        self.calls.append(("release", serving))
        self.closed.clear()
        held, self.held = self.held, 0
        return held, 1.25

    def status(self) -> dict[str, Any]:
        self.calls.append(("status", None))
        return {"listen": ["[::]:8000"], "held": self.held, "in_flight": {}, "closed": sorted(self.closed)}

    async def wait_view(self, cond: Any, since: int = 0, timeout_s: float = 20.0) -> DaemonView:
        """The latest view from ``views[since]`` on (already seen or to come) for which ``cond`` holds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            for v in reversed(self.views[since:]):
                if cond(v):
                    return v
            left = deadline - loop.time()
            if left <= 0:
                raise AssertionError(f"no such view within {timeout_s:g} s; views: {self.views[-5:]}")
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)

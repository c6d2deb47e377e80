"""Child processes for test_frontdoor_dbus_policy.py, run under setpriv as another user.

``link ADDRESS``: the REAL daemon link (:class:`gpushift.frontdoor.daemonlink.DaemonLink`) on the
bus at ADDRESS with a core that answers fixed values; it prints one JSON line per event:
``{"owns": true}`` once it owns org.gpushift.FrontDoor1, ``{"view": {...}}`` for each view it hands
the core, ``{"call": [method, arg]}`` for each call reaching the core.  Runs until SIGTERM.

``own ADDRESS NAME``: asks the bus for NAME; prints ``{"answer": n}`` or ``{"error": "<D-Bus error name>"}``.

``call ADDRESS MEMBER [ARG]``: calls org.gpushift.FrontDoor1's MEMBER (``Introspect``: the
Introspectable interface) and prints ``{"body": [...]}`` or ``{"error": name}``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any


def out(**kw: Any) -> None:
    print(json.dumps(kw, default=list), flush=True)


class PrintingCore:
    def update(self, view: Any) -> None:
        out(view={"connected": view.connected, "active": view.active, "switching": view.switching})

    async def close(self, backend: str) -> int:
        out(call=["close", backend])
        return 2

    def in_flight(self, backend: str) -> int:
        out(call=["in_flight", backend])
        return 0

    async def release(self, serving: str) -> tuple[int, float]:
        out(call=["release", serving])
        return 0, 0.0

    def status(self) -> dict[str, Any]:
        out(call=["status", None])
        return {}


async def link(address: str) -> None:
    import structlog

    from gpushift.frontdoor.daemonlink import DaemonLink

    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    d = DaemonLink(PrintingCore(), address, structlog.get_logger("helper"), call_timeout_s=5)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    task = asyncio.ensure_future(d.run())
    while not d.owns_name and not stop.is_set():
        await asyncio.sleep(0.02)
    out(owns=d.owns_name)
    await stop.wait()
    await d.stop()
    task.cancel()


def blocking(address: str, argv: list[str]) -> None:
    import jeepney
    from jeepney.io.blocking import open_dbus_connection
    from jeepney.wrappers import DBusErrorResponse

    conn = open_dbus_connection(address)
    bus = jeepney.DBusAddress(
        "/org/freedesktop/DBus", bus_name="org.freedesktop.DBus", interface="org.freedesktop.DBus"
    )
    if argv[0] == "own":
        msg = jeepney.new_method_call(bus, "RequestName", "su", (argv[1], 4))
    else:
        member, args = argv[1], tuple(argv[2:])
        iface = "org.freedesktop.DBus.Introspectable" if member == "Introspect" else "org.gpushift.FrontDoor1"
        addr = jeepney.DBusAddress(
            "/org/gpushift/FrontDoor1", bus_name="org.gpushift.FrontDoor1", interface=iface
        )
        msg = jeepney.new_method_call(addr, member, "s" * len(args) or None, args)
    reply = conn.send_and_get_reply(msg, timeout=10)
    try:
        body = jeepney.wrappers.unwrap_msg(reply)
    except DBusErrorResponse as e:
        out(error=e.name)
    else:
        out(answer=body[0]) if argv[0] == "own" else out(body=list(body))
    conn.close()


if __name__ == "__main__":
    if sys.argv[1] == "link":
        asyncio.run(link(sys.argv[2]))
    else:
        blocking(sys.argv[2], [sys.argv[1], *sys.argv[3:]])

"""Child processes for test_dbus_policy.py: the published service with a stub backend, and a probe.

``serve RECORD``: as root, publish the REAL ``SwitcherService`` on the bus named by
``$DBUS_SYSTEM_BUS_ADDRESS`` with :class:`StubBackend`, print ``ready`` and run a GLib main loop
until SIGTERM.  Every backend call is appended to RECORD as one JSON line (method, caller uid/user/pid,
arguments), so a test can tell whether a call reached the service and who the service saw.

``probe METHOD [ARG...]``: a plain pydbus client on the same bus; prints one JSON object with the
result, or the D-Bus error name the client saw (``Gio.DBusError.get_remote_error``) and its message.
``METHOD`` may be ``Introspect`` (org.freedesktop.DBus.Introspectable on the object); ``SwitchTo``
takes the backend and sends no options.

Run as a script (``python dbus_policy_helper.py ...``) so that it can be started under setpriv.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any

# What the stub's GetStatus answers: a marker no local fallback view could produce.
STUB_STATUS: dict[str, Any] = {
    "daemon": {"running": True, "state": "idle", "pid": 4242, "version": "stub-0"},
    "active": "stub-marker-backend",
    "since": "2026-01-01T00:00:00+00:00",
    "backends": {},
    "gpus": [],
    "simulated": True,
    "last_switch": None,
}


class StubBackend:
    """The daemon's side of the service, reduced to fixed answers and a record of every call.

    Backend names with a meaning: ``nosuch`` raises UnknownBackend, ``busy`` raises
    SwitchInProgress, ``crash`` raises a plain exception (a bug); any other name is "switched to"
    at once, with one Progress and one Finished signal shortly after the ticket is returned.
    """

    def __init__(self, record_path: str) -> None:
        self.record_path = record_path
        self.service: Any = None
        self.tickets = 0

    def _record(self, method: str, caller: Any, **args: Any) -> None:
        row = {"method": method, "uid": caller.uid, "user": caller.user, "pid": caller.pid, **args}
        with open(self.record_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def status_json(self) -> str:
        return json.dumps(STUB_STATUS)

    def summary_json(self) -> str:
        return json.dumps({"version": 1, "serving": {"backend": "stub-marker-backend"}})

    def switch(self, backend: str, options: dict[str, Any], caller: Any) -> str:
        from gi.repository import GLib

        from gpushift.errors import SwitchInProgress, UnknownBackend

        self._record("switch", caller, backend=backend, options=options)
        if backend == "nosuch":
            raise UnknownBackend("unknown backend 'nosuch' (configured: alpha, beta)")
        if backend == "busy":
            raise SwitchInProgress("switch stub-0 (alpha -> beta, by root) is still running")
        if backend == "crash":
            raise RuntimeError("stub bug")
        self.tickets += 1
        ticket = f"stub-{self.tickets}"
        GLib.timeout_add(50, self._finish, ticket, backend)
        return ticket

    def _finish(self, ticket: str, backend: str) -> bool:
        self.service.Progress(ticket, "start", f"starting stub unit of {backend}")
        result = {
            "ok": True,
            "ticket": ticket,
            "to": backend,
            "outcome": "ok",
            "message": f"stub switched to {backend}",
        }
        self.service.Finished(ticket, True, json.dumps(result))
        return False  # once

    def cancel(self, caller: Any) -> str:
        self._record("cancel", caller)
        return "stub-cancelled"

    def resume(self, caller: Any) -> str:
        self._record("resume", caller)
        return "stub-resumed"

    def reload(self, caller: Any) -> str:
        self._record("reload", caller)
        return "stub-reloaded"

    def property_values(self) -> dict[str, Any]:
        return {
            "ActiveBackend": STUB_STATUS["active"],
            "Mode": "manual",
            "SwitchInProgress": False,
            "Phase": "",
            "NextSwitch": ("", 0),
            "Backends": ["alpha", "beta"],
        }


def serve(record_path: str) -> int:
    """Publish the service on the system bus of this environment; run until SIGTERM."""
    from gi.repository import GLib

    from gpushift.bus.service import SwitcherService, publish
    from gpushift.host.dbus import connect

    bus = connect("system")  # as the daemon opens it
    stub = StubBackend(record_path)
    service = SwitcherService(bus, stub)
    stub.service = service
    publication = publish(bus, service)
    loop = GLib.MainLoop()
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGTERM, loop.quit)
    print("ready", flush=True)
    try:
        loop.run()
    finally:
        publication.unpublish()
    return 0


def probe(method: str, args: list[str]) -> int:
    """Call one method as whoever runs this; print {"ok", "value"} or {"ok", "error", "message"}."""
    import pydbus
    from gi.repository import Gio, GLib

    from gpushift.bus.service import BUS_NAME, OBJECT_PATH

    try:
        bus = pydbus.SystemBus()
        proxy = bus.get(BUS_NAME, OBJECT_PATH, timeout=10)
        if method == "Introspect":
            value = proxy["org.freedesktop.DBus.Introspectable"].Introspect()
        elif method == "SwitchTo":
            value = proxy.SwitchTo(args[0], {}, timeout=10)
        else:
            value = getattr(proxy, method)(*args, timeout=10)
        print(json.dumps({"ok": True, "value": value}))
    except GLib.Error as e:
        print(json.dumps({"ok": False, "error": Gio.DBusError.get_remote_error(e), "message": e.message}))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        sys.exit(serve(sys.argv[2]))
    sys.exit(probe(sys.argv[2], sys.argv[3:]))

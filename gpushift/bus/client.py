"""The CLI's pydbus side of the D-Bus API (cancel, resume, reload, and status's fallback) —
calls with timeouts, remote errors back into our classes.  ``gpushift switch`` and ``gpushift
status`` go through the light client (:mod:`gpushift.bus.lightclient`, jeepney), which spares
them PyGObject's import."""

from __future__ import annotations

import json
from typing import Any

from gpushift.bus.lightclient import NOBODY_OWNS, no_daemon
from gpushift.bus.names import BUS_NAME, INTERFACE, OBJECT_PATH
from gpushift.errors import DaemonUnavailable, GpushiftError
from gpushift.host.dbus import connect
from gpushift.host.dbus_errors import split_remote, translate

CALL_TIMEOUT_S = 30


class Client:
    """A connection to the daemon on the system or session bus."""

    def __init__(self, bus_kind: str = "system") -> None:
        try:
            self.bus = connect(bus_kind, error=DaemonUnavailable)
        except DaemonUnavailable as e:  # "cannot connect to the system bus: <why>": say what to do
            raise no_daemon(bus_kind, str(e).rpartition(": ")[2] or str(e)) from None
        self.bus_kind = bus_kind

    def _translate(self, e: BaseException) -> GpushiftError:
        name, _message = split_remote(e)
        return no_daemon(self.bus_kind) if name in NOBODY_OWNS else translate(e)

    def _proxy(self) -> Any:
        from gi.repository import GLib

        try:
            return self.bus.get(BUS_NAME, OBJECT_PATH, timeout=CALL_TIMEOUT_S)
        except GLib.Error as e:
            raise self._translate(e) from None
        except KeyError as e:  # pydbus: interface missing in introspection
            raise DaemonUnavailable(f"the daemon on the bus does not offer {INTERFACE}: {e}") from None

    def _call(self, method: str, *args: Any) -> Any:
        from gi.repository import GLib

        proxy = self._proxy()
        try:
            return getattr(proxy, method)(*args, timeout=CALL_TIMEOUT_S)
        except GLib.Error as e:
            raise self._translate(e) from None

    def owner(self) -> str | None:
        from gi.repository import GLib

        try:
            return str(self.bus.dbus.GetNameOwner(BUS_NAME))
        except GLib.Error:
            return None

    def status(self) -> dict[str, Any]:
        return dict(json.loads(self._call("GetStatus")))

    def cancel(self) -> str:
        return str(self._call("Cancel"))

    def resume(self) -> str:
        return str(self._call("Resume"))

    def reload(self) -> str:
        return str(self._call("Reload"))

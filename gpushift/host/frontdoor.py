"""The daemon's client of the front door: ``org.gpushift.FrontDoor1`` on the daemon's own bus.

The front door (``gpushift frontdoor``, docs/frontdoor.md) owns that name; the daemon calls it as
a drain begins (``Close``), while it drains (``InFlight``), as a switch ends (``Release``) and at
every sample (``Status``).  Each call goes straight to the connection (``call_sync`` on pydbus's
``Gio.DBusConnection``: no introspection round trip first, and never D-Bus activation), bounded
by ``[frontdoor] bus_timeout_s``.  Whatever goes wrong — nobody owns the name, the call times out,
the answer is not of its type — the call answers None and logs one line (a polled call only when
its error changes), so a switch never fails over the front door and waits at most that long.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from gpushift.host.dbus_errors import split_remote
from gpushift.host.nulllog import NULL_LOG

BUS_NAME = "org.gpushift.FrontDoor1"
OBJECT_PATH = "/org/gpushift/FrontDoor1"
INTERFACE = "org.gpushift.FrontDoor1"

#: A status document larger than this is not read (the front door's is a few hundred bytes).
MAX_STATUS_CHARS = 1024 * 1024
#: Calls the daemon makes every period: their errors are logged when they change, not each time.
_POLLED = frozenset({"in_flight", "status"})


class BusFrontDoor:
    """:class:`gpushift.ports.FrontDoorPort` over D-Bus.

    Args:
        bus: the daemon's pydbus bus (``.con`` is the ``Gio.DBusConnection``).
        timeout_s: the deadline of each call (``[frontdoor] bus_timeout_s``).
        log: a structlog-like logger.
    """

    def __init__(self, bus: Any, timeout_s: float, log: Any = NULL_LOG) -> None:
        self._con = bus.con
        self.timeout_s = timeout_s
        self._log = log
        self._lock = threading.Lock()
        self._errors: dict[str, str | None] = {}

    # -- the port

    def close(self, backend: str) -> int | None:
        got = self._call("close", "Close", "(s)", (backend,), "(u)")
        return int(got[0]) if got is not None else None

    def in_flight(self, backend: str) -> int | None:
        got = self._call("in_flight", "InFlight", "(s)", (backend,), "(u)")
        return int(got[0]) if got is not None else None

    def release(self, serving: str) -> tuple[int, float] | None:
        got = self._call("release", "Release", "(s)", (serving,), "(ud)")
        return (int(got[0]), float(got[1])) if got is not None else None

    def status(self) -> dict[str, Any] | None:
        got = self._call("status", "Status", "()", (), "(s)")
        if got is None:
            return None
        text = str(got[0])
        try:
            if len(text) > MAX_STATUS_CHARS:
                raise ValueError(f"{len(text)} characters, more than {MAX_STATUS_CHARS}")
            doc = json.loads(text)
            if not isinstance(doc, dict):
                raise ValueError(f"a JSON {type(doc).__name__}, not an object")
        except ValueError as e:
            self._failed("status", f"Status answered something that is not a status document: {e}")
            return None
        return doc

    def last_error(self, call: str) -> str | None:
        with self._lock:
            return self._errors.get(call)

    # -- the bus

    def _call(self, call: str, method: str, signature: str, args: tuple[Any, ...], reply: str) -> Any:
        from gi.repository import Gio, GLib

        try:
            answer = self._con.call_sync(
                BUS_NAME,
                OBJECT_PATH,
                INTERFACE,
                method,
                GLib.Variant(signature, args),
                GLib.VariantType.new(reply),
                Gio.DBusCallFlags.NO_AUTO_START,  # a front door not running is not activated by the bus
                max(1, int(self.timeout_s * 1000)),
                None,
            ).unpack()
        except GLib.Error as e:
            name, message = split_remote(e)
            self._failed(call, f"{method}: {name + ': ' if name else ''}{message}")
            return None
        except Exception as e:  # a bug or a closed connection: never into the switch
            self._failed(call, f"{method}: {type(e).__name__}: {e}")
            return None
        with self._lock:
            was = self._errors.get(call)
            self._errors[call] = None
        if was is not None and call in _POLLED:
            self._log.info("frontdoor_answering", call=call)
        return answer

    def _failed(self, call: str, error: str) -> None:
        with self._lock:
            same = self._errors.get(call) == error
            self._errors[call] = error
        if call in _POLLED and same:
            return
        self._log.warning(
            "frontdoor_call_failed", call=call, error=error[:300], timeout_s=self.timeout_s,
            detail="the switch goes on without the front door's answer",
        )  # fmt: skip

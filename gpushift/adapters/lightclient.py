"""L4: the CLI's light D-Bus client for reads — ``gpushift status`` without PyGObject or pydbus.

jeepney speaks the D-Bus wire protocol in pure Python: connecting and one method call cost a few
milliseconds, where importing PyGObject and pydbus alone costs about 0.15 s (measured), which would
make ``gpushift status`` slower than ``nvidia-smi``.  Only reads go through it; a switch, which
follows signals, keeps the full client (:mod:`gpushift.adapters.client`).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import DaemonUnavailable
from .dbus_errors import from_dbus
from .dbus_names import BUS_NAME, INTERFACE, OBJECT_PATH

CALL_TIMEOUT_S = 10.0


def get_status(bus_kind: str, timeout_s: float = CALL_TIMEOUT_S) -> dict[str, Any]:
    """The daemon's ``GetStatus`` as a dict.

    Raises:
        DaemonUnavailable: the bus cannot be reached, or no daemon owns the name.
        GpushiftError: the daemon answered with one of gpushift's errors.
    """
    from jeepney import DBusAddress, new_method_call
    from jeepney.io.blocking import open_dbus_connection
    from jeepney.wrappers import DBusErrorResponse, unwrap_msg

    try:
        conn = open_dbus_connection(bus="SYSTEM" if bus_kind == "system" else "SESSION")
    except (OSError, KeyError, ValueError) as e:
        raise DaemonUnavailable(f"cannot connect to the {bus_kind} bus: {e}") from None
    try:
        address = DBusAddress(OBJECT_PATH, bus_name=BUS_NAME, interface=INTERFACE)
        try:
            reply = conn.send_and_get_reply(new_method_call(address, "GetStatus"), timeout=timeout_s)
            (text,) = unwrap_msg(reply)
        except DBusErrorResponse as e:
            message = str(e.data[0]) if e.data else str(e)
            raise from_dbus(e.name, message) from None
        except TimeoutError:
            raise DaemonUnavailable(f"the gpushift daemon did not answer within {timeout_s:g} s") from None
    finally:
        conn.close()
    return dict(json.loads(text))

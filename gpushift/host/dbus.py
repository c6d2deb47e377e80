"""Opening the D-Bus connection, the same way for the daemon, the systemd adapter and the CLI; and
:func:`waiting`, the mark of a thread blocked in one synchronous D-Bus call.

pydbus and gi are imported lazily, inside the call (gpushift must import without them, and
``gpushift --help`` must start fast).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from gpushift.errors import GpushiftError, SystemdError
from gpushift.host.dbus_errors import split_remote


def connect(kind: str, address: str | None = None, *, error: type[GpushiftError] = SystemdError) -> Any:
    """Open the bus gpushift talks to systemd and its clients on (or, from the CLI, to the daemon).

    Args:
        kind: ``"system"`` (production) or ``"session"`` (tests and the demo).
        address: a D-Bus address to use instead of the default for ``kind``.  For ``"session"``
            the default is ``$DBUS_SESSION_BUS_ADDRESS`` read NOW, through a connection of our own
            (not GLib's process-wide singleton, which would keep the address of the first bus a
            test process ever used).
        error: what an unreachable bus raises: :class:`SystemdError` on the daemon's side,
            :class:`DaemonUnavailable` on the CLI's.

    Returns:
        A pydbus bus (``.con`` is the ``Gio.DBusConnection``).

    Raises:
        error: the bus cannot be reached.
        ValueError: ``kind`` is neither ``"system"`` nor ``"session"``.
    """
    if kind not in ("system", "session"):
        raise ValueError(f"bus must be 'system' or 'session', not {kind!r}")
    try:
        import pydbus
        from gi.repository import GLib
    except ImportError as e:  # a host without them (a GPU test box): say so, as for a missing bus
        raise error(f"cannot reach the {kind} bus: pydbus/PyGObject are not installed ({e})") from None

    try:
        if address is None and kind == "session":
            address = os.environ.get("DBUS_SESSION_BUS_ADDRESS") or None
        if address is not None:
            return pydbus.connect(address)
        return pydbus.SystemBus() if kind == "system" else pydbus.SessionBus()
    except GLib.Error as e:
        where = address or f"the {kind} bus"
        raise error(f"cannot connect to {where}: {split_remote(e)[1]}") from e


#: Thread ident -> the monotonic deadline of the synchronous D-Bus call it is blocked in.
_WAITS: dict[int, float] = {}


@contextlib.contextmanager
def waiting(timeout_s: float) -> Iterator[None]:
    """Marks the calling thread as blocked in one synchronous D-Bus call of at most ``timeout_s``.

    The watchdog (``gpushift/daemon/watchdog.py``) counts a main loop waiting so as alive until the
    call's own deadline: a bus slowed down by a flood of calls answers the systemd adapter late,
    and restarting the daemon would not make it answer sooner."""
    ident = threading.get_ident()
    _WAITS[ident] = time.monotonic() + timeout_s
    try:
        yield
    finally:
        _WAITS.pop(ident, None)


def waiting_until(ident: int) -> float | None:
    """The deadline of the D-Bus call thread ``ident`` is blocked in, or None."""
    return _WAITS.get(ident)

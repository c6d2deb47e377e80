"""D-Bus errors both ways: what the service raises is what the client gets back, class and message.

The way out is pydbus's rule (the D-Bus error name is the raised class's ``__name__``, the message
its ``str``); the way back starts from the ``GLib.Error`` GDBus itself builds for a remote error
(``Gio.DBusError.new_for_dbus_error``), so these run against the real GLib.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpushift import errors
from gpushift.adapters import dbus_errors
from gpushift.errors import AccessDenied, DaemonUnavailable, GpushiftError


def _gio() -> Any:
    try:
        from gi.repository import Gio
    except ImportError as e:
        pytest.fail(f"PyGObject (gi) is needed for the D-Bus error tests: {e}", pytrace=False)
    return Gio


def _error_classes() -> list[type[GpushiftError]]:
    """Every error class gpushift itself defines (test-made subclasses left out)."""
    out: list[type[GpushiftError]] = []
    stack: list[type[GpushiftError]] = [GpushiftError]
    while stack:
        cls = stack.pop()
        if cls.__module__ == errors.__name__:
            out.append(cls)
        stack.extend(cls.__subclasses__())
    return sorted(out, key=lambda c: c.__name__)


ERROR_CLASSES = _error_classes()


def _received(name: str, message: str) -> Exception:
    """The GLib.Error a GDBus caller holds after the remote side answered ``name``/``message``."""
    return _gio().DBusError.new_for_dbus_error(name, message)  # type: ignore[no-any-return]


def test_every_error_class_has_a_dotted_name_of_its_own() -> None:
    names = [cls.dbus_name() for cls in ERROR_CLASSES]
    assert len(ERROR_CLASSES) >= 11  # the hierarchy was found, not an empty walk
    assert len(set(names)) == len(names), names
    assert all(n.startswith("org.gpushift.Error.") for n in names), names


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda c: c.__name__)
def test_round_trip_keeps_class_and_message(cls: type[GpushiftError]) -> None:
    sent = dbus_errors.as_dbus_error(cls("unit day.service: it said no: twice"))
    name, message = type(sent).__name__, str(sent)  # what pydbus puts on the wire
    assert name == cls.dbus_name()
    back = dbus_errors.translate(_received(name, message))
    assert type(back) is cls
    assert str(back) == "unit day.service: it said no: twice"


def test_a_bug_in_a_handler_leaves_as_failed_and_comes_back_as_the_base_class() -> None:
    sent = dbus_errors.internal_error(KeyError("x"))
    assert type(sent).__name__ == "org.gpushift.Error.Failed"
    back = dbus_errors.translate(_received(type(sent).__name__, str(sent)))
    assert type(back) is GpushiftError
    assert str(back) == "internal error: KeyError('x')"


@pytest.mark.parametrize(
    "name",
    [
        "org.freedesktop.DBus.Error.ServiceUnknown",
        "org.freedesktop.DBus.Error.NameHasNoOwner",
        "org.freedesktop.DBus.Error.NoReply",
        "org.freedesktop.DBus.Error.Disconnected",
    ],
)
def test_bus_names_for_an_absent_daemon_become_daemon_unavailable(name: str) -> None:
    back = dbus_errors.translate(_received(name, "The name is not activatable"))
    assert type(back) is DaemonUnavailable
    assert str(back) == f"the gpushift daemon is not running on this bus ({name})"
    assert back.code == 6


def test_the_bus_policy_refusing_a_call_becomes_access_denied() -> None:
    back = dbus_errors.translate(
        _received("org.freedesktop.DBus.Error.AccessDenied", "Rejected send message")
    )
    assert type(back) is AccessDenied
    assert str(back) == "the bus refused the call: Rejected send message"
    assert back.code == 5


def test_an_unknown_remote_name_keeps_name_and_message() -> None:
    back = dbus_errors.translate(_received("org.example.Error.Odd", "strange"))
    assert type(back) is GpushiftError
    assert str(back) == "org.example.Error.Odd: strange"


def test_a_local_error_has_no_name() -> None:
    from gi.repository import GLib

    _gio()
    local = GLib.Error("Timeout was reached")
    assert dbus_errors.split_remote(local) == (None, "Timeout was reached")
    assert str(dbus_errors.translate(local)) == "D-Bus error: Timeout was reached"


def test_split_remote_separates_name_and_message() -> None:
    got = dbus_errors.split_remote(
        _received("org.freedesktop.systemd1.NoSuchUnit", "Unit x.service not loaded.")
    )
    assert got == ("org.freedesktop.systemd1.NoSuchUnit", "Unit x.service not loaded.")

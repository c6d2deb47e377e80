"""D-Bus errors both ways: what the service raises is what the client gets back, class and message.

The way out is pydbus's rule (the D-Bus error name is the raised class's ``__name__``, the message
its ``str``); the way back starts from the ``GLib.Error`` GDBus itself builds for a remote error
(``Gio.DBusError.new_for_dbus_error``), so these run against the real GLib.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpushift import errors
from gpushift.errors import AccessDenied, DaemonUnavailable, GpushiftError
from gpushift.host import dbus_errors


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
        "org.freedesktop.DBus.Error.Disconnected",
    ],
)
def test_bus_names_for_an_absent_daemon_become_daemon_unavailable(name: str) -> None:
    back = dbus_errors.translate(_received(name, "The name is not activatable"))
    assert type(back) is DaemonUnavailable
    assert str(back) == f"the gpushift daemon is not running on this bus ({name})"
    assert back.code == 6


def test_no_reply_because_the_daemon_left_is_a_daemon_not_running() -> None:
    name = "org.freedesktop.DBus.Error.NoReply"
    back = dbus_errors.translate(
        _received(name, "Message recipient disconnected from message bus without replying")
    )
    assert type(back) is DaemonUnavailable
    assert str(back) == f"the gpushift daemon is not running on this bus ({name})"


def test_no_reply_from_a_daemon_that_holds_its_name_is_not_answering() -> None:
    """The bus's reply timeout (dbus-daemon's NoReply text): the daemon is there but hung."""
    back = dbus_errors.translate(
        _received(
            "org.freedesktop.DBus.Error.NoReply",
            "Did not receive a reply. Possible causes include: the remote application did not send a reply, "
            "the message bus security policy blocked the reply, the reply timeout expired, or the network "
            "connection was broken.",
        )
    )
    assert type(back) is DaemonUnavailable and back.code == 6
    assert str(back).startswith(
        "the gpushift daemon is not answering: it holds its bus name but did not reply"
    )


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


# -------------------------------------------------------------------- over a real bus


class _Raising:
    """A daemon whose GetStatus fails with ``error``."""

    def __init__(self) -> None:
        self.error: Exception = RuntimeError("unset")

    def status_json(self) -> str:
        raise self.error


@pytest.fixture
def published(start_bus: Callable[[], str], monkeypatch: pytest.MonkeyPatch) -> Iterator[_Raising]:
    """The real SwitcherService on a private bus, its GLib loop in a thread of this test."""
    from gi.repository import GLib

    from gpushift.bus.service import SwitcherService, publish
    from gpushift.host.dbus import connect

    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", start_bus())
    bus = connect("session")
    backend = _Raising()
    publication = publish(bus, SwitcherService(bus, backend))  # type: ignore[arg-type]
    loop = GLib.MainLoop()
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        yield backend
    finally:
        GLib.idle_add(loop.quit)  # runs once the loop runs, however early this is
        thread.join(10)
        publication.unpublish()
        bus.con.close_sync(None)


def _status_error(bus_kind: str = "session") -> GpushiftError:
    from gpushift.bus.client import Client

    client = Client(bus_kind)
    try:
        with pytest.raises(GpushiftError) as got:
            client.status()
    finally:
        client.bus.con.close_sync(None)
    return got.value


def test_every_error_reaches_the_client_as_its_class_over_a_bus(published: _Raising) -> None:
    for cls in ERROR_CLASSES:
        published.error = cls(f"{cls.__name__} happened: see the journal")
        back = _status_error()
        assert (type(back), str(back)) == (cls, f"{cls.__name__} happened: see the journal")


def test_a_handler_bug_reaches_the_client_as_an_internal_error(published: _Raising) -> None:
    published.error = ZeroDivisionError("division by zero")
    back = _status_error()
    assert type(back) is GpushiftError
    assert str(back) == "internal error: ZeroDivisionError('division by zero')"


def test_the_client_on_a_bus_without_the_daemon_says_it_is_not_running(
    start_bus: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", start_bus())
    back = _status_error()
    assert type(back) is DaemonUnavailable
    assert "the gpushift daemon (gpushift.service) is not running on the session bus" in str(back)
    assert "start it with `systemctl --user start gpushift`" in str(back)  # and what to do

"""The CLI's light D-Bus client — ``gpushift status`` and ``gpushift switch`` without PyGObject
or pydbus.

jeepney speaks the D-Bus wire protocol in pure Python: connecting and one method call cost a few
milliseconds, where importing PyGObject and pydbus alone costs about 0.15 s (measured), which would
make ``gpushift status`` slower than ``nvidia-smi`` and every ``gpushift switch`` that much slower.

A switch is followed through the ``Progress``/``Finished`` signals that carry its ticket: the match
rules are added BEFORE the call (a signal may arrive before the call returns), and the bus name's
owner is watched (``NameOwnerChanged``, and asked again every 2 s): if the daemon goes away
mid-switch the client says so instead of waiting forever.  The other calls (cancel, resume,
reload) keep the pydbus client (:mod:`gpushift.bus.client`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from gpushift.bus.args import variant_types
from gpushift.bus.names import BUS_NAME, INTERFACE, OBJECT_PATH
from gpushift.errors import DaemonUnavailable
from gpushift.host.dbus_errors import from_dbus, not_answering

CALL_TIMEOUT_S = 10.0
#: The bus's authentication (jeepney's own default is 1 s: a bus slowed down by a flood of calls,
#: which dbus-daemon answers in turn, took longer and `gpushift status` said it could not connect).
AUTH_TIMEOUT_S = 10.0
#: A switch call's own deadline (the daemon answers with a ticket at once; it validates first).
SWITCH_CALL_TIMEOUT_S = 30.0
#: While following a switch, the daemon's bus name is asked about at least this often.
OWNER_CHECK_S = 2.0
UNKNOWN_METHOD = "org.freedesktop.DBus.Error.UnknownMethod"
#: The bus's answers that mean nobody owns the daemon's name: it is not running (on this bus).
NOBODY_OWNS = frozenset(
    {"org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.NameHasNoOwner"}
)


def start_command(bus_kind: str) -> str:
    """The command that starts the daemon where the CLI looks for it."""
    return "systemctl start gpushift" if bus_kind == "system" else "systemctl --user start gpushift"


def no_daemon(bus_kind: str, why: str = "") -> DaemonUnavailable:
    """ "No daemon to ask", with what to do: start gpushift.service, or name the bus it runs on.

    ``why``: why the bus itself could not be reached (empty: the bus answered that nobody owns the
    daemon's name)."""
    todo = f"start it with `{start_command(bus_kind)}`, or set `[daemon] bus` in the config to the bus it runs on"
    if why:
        return DaemonUnavailable(
            f"the gpushift daemon (gpushift.service) is not running: cannot connect to the {bus_kind} bus "
            f"({why}); {todo}"
        )
    return DaemonUnavailable(
        f"the gpushift daemon (gpushift.service) is not running on the {bus_kind} bus: {todo}"
    )


def connect_failure(e: BaseException) -> str:
    """Why opening the bus failed, in words (no exception repr): jeepney raises a ``KeyError``
    naming the variable for a session bus without ``$DBUS_SESSION_BUS_ADDRESS``."""
    if isinstance(e, KeyError) and e.args:
        return f"${e.args[0]} is not set"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def get_status(bus_kind: str, timeout_s: float = CALL_TIMEOUT_S) -> dict[str, Any]:
    """The daemon's ``GetStatus`` as a dict.

    Raises:
        DaemonUnavailable: the bus cannot be reached, or no daemon owns the name.
        GpushiftError: the daemon answered with one of gpushift's errors.
    """
    conn = _connect(bus_kind)
    try:
        (text,) = _call(conn, "GetStatus", timeout_s=timeout_s, bus_kind=bus_kind)
    except _Remote as e:  # no GetStatus at all: not a gpushift daemon
        raise from_dbus(e.name, str(e)) from None
    finally:
        conn.close()
    return dict(json.loads(text))


def _connect(bus_kind: str) -> Any:
    from jeepney.io.blocking import open_dbus_connection

    try:
        return open_dbus_connection(
            bus="SYSTEM" if bus_kind == "system" else "SESSION", auth_timeout=AUTH_TIMEOUT_S
        )
    except (OSError, KeyError, ValueError) as e:
        raise no_daemon(bus_kind, connect_failure(e)) from None


def _call(
    conn: Any,
    member: str,
    signature: str | None = None,
    body: tuple[Any, ...] = (),
    timeout_s: float = CALL_TIMEOUT_S,
    bus_kind: str = "system",
) -> Any:
    """One method call on the daemon: its body, or the matching gpushift error."""
    from jeepney import DBusAddress, new_method_call
    from jeepney.wrappers import DBusErrorResponse, unwrap_msg

    address = DBusAddress(OBJECT_PATH, bus_name=BUS_NAME, interface=INTERFACE)
    try:
        return unwrap_msg(
            conn.send_and_get_reply(new_method_call(address, member, signature, body), timeout=timeout_s)
        )
    except DBusErrorResponse as e:
        if e.name in NOBODY_OWNS:
            raise no_daemon(bus_kind) from None
        raise _remote(e) from None
    except TimeoutError:
        if _owner(conn) is None:
            raise no_daemon(bus_kind) from None
        raise DaemonUnavailable(not_answering(f"no answer to {member} within {timeout_s:g} s")) from None


class _Remote(Exception):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


def _remote(e: Any) -> Exception:
    message = str(e.data[0]) if e.data else str(e)
    if e.name == UNKNOWN_METHOD:
        return _Remote(e.name, message)
    return from_dbus(e.name, message)


def _owner(conn: Any) -> str | None:
    from jeepney import message_bus
    from jeepney.io.blocking import Proxy
    from jeepney.wrappers import DBusErrorResponse

    try:
        return str(Proxy(message_bus, conn).GetNameOwner(BUS_NAME)[0])
    except DBusErrorResponse:
        return None


def _switch_call(conn: Any, backend: str, options: dict[str, Any], bus_kind: str) -> str:
    """``SwitchTo`` with typed options; ``SwitchWithOptions`` (JSON) for a daemon older than it."""
    typed = variant_types(options)  # {key: (signature, value)}: jeepney's form of a variant
    try:
        (ticket,) = _call(conn, "SwitchTo", "sa{sv}", (backend, typed), SWITCH_CALL_TIMEOUT_S, bus_kind)
    except _Remote:  # an older daemon, upgraded on disk but not restarted
        try:
            (ticket,) = _call(
                conn,
                "SwitchWithOptions",
                "ss",
                (backend, json.dumps(options)),
                SWITCH_CALL_TIMEOUT_S,
                bus_kind,
            )
        except _Remote as e:
            raise DaemonUnavailable(f"the daemon on the bus does not offer a switch method: {e}") from None
    return str(ticket)


def switch(
    bus_kind: str,
    backend: str,
    options: dict[str, Any],
    on_progress: Callable[[str, str], None] | None = None,
    wait: bool = True,
) -> dict[str, Any]:
    """Ask for a switch; with ``wait``, follow it to the end and return the Finished result.

    Raises:
        DaemonUnavailable: no daemon on the bus, or its name went away before Finished arrived.
        GpushiftError: the daemon refused the switch (its error, as the daemon named it).
    """
    from collections import deque

    from jeepney import HeaderFields, MatchRule, message_bus
    from jeepney.io.blocking import Proxy

    conn = _connect(bus_kind)
    try:
        if not wait:
            return {"ticket": _switch_call(conn, backend, options, bus_kind), "queued": True}
        owner = _owner(conn)
        if owner is None:
            raise no_daemon(bus_kind)
        ours = MatchRule(type="signal", sender=BUS_NAME, interface=INTERFACE, path=OBJECT_PATH)
        # The messages themselves carry the owner's unique name as their sender, not BUS_NAME.
        ours_here = MatchRule(type="signal", sender=owner, interface=INTERFACE, path=OBJECT_PATH)
        gone = MatchRule(type="signal", sender="org.freedesktop.DBus", interface="org.freedesktop.DBus",
                         member="NameOwnerChanged", path="/org/freedesktop/DBus")  # fmt: skip
        gone.add_arg_condition(0, BUS_NAME)
        bus = Proxy(message_bus, conn)
        inbox: deque[Any] = deque()
        with (
            conn.filter(ours_here, queue=inbox, bufsize=100000),
            conn.filter(gone, queue=inbox, bufsize=100000),
        ):
            bus.AddMatch(ours)
            bus.AddMatch(gone)
            ticket = _switch_call(conn, backend, options, bus_kind)
            while True:
                while inbox:
                    msg = inbox.popleft()
                    member = msg.header.fields.get(HeaderFields.member)
                    if member == "NameOwnerChanged":
                        if msg.body[0] == BUS_NAME and msg.body[2] != owner:
                            raise _went_away(ticket)
                        continue
                    if not msg.body or msg.body[0] != ticket:
                        continue
                    if member == "Progress" and on_progress is not None:
                        on_progress(str(msg.body[1]), str(msg.body[2]))
                    elif member == "Finished":
                        try:
                            result = dict(json.loads(msg.body[2]))
                        except ValueError:
                            result = {"ok": bool(msg.body[1]), "message": str(msg.body[2])}
                        result.setdefault("ticket", ticket)
                        return result
                try:
                    inbox.appendleft(conn.recv_until_filtered(inbox, timeout=OWNER_CHECK_S))  # it pops it
                except TimeoutError:
                    if _owner(conn) != owner:  # a NameOwnerChanged this connection did not see
                        raise _went_away(ticket) from None
    finally:
        conn.close()


def _went_away(ticket: str) -> DaemonUnavailable:
    return DaemonUnavailable(
        f"the gpushift daemon went away during switch {ticket} (see `gpushift status` and `journalctl -u gpushift`)"
    )

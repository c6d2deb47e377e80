"""The object ``/org/gpushift/FrontDoor1`` on the bus: ``org.gpushift.FrontDoor1``'s methods answered
by calling the front door's core, its introspection, and the check of who calls.

The contract is ``org.gpushift.FrontDoor1.xml`` beside this module.  The bus policy
(``etc/dbus-1/system.d/org.gpushift.FrontDoor1.conf``) lets only root send here; on top of it every
call to the interface is checked again: the caller must be uid 0 (asked of the bus,
``GetConnectionUnixUser``) or the connection that owns ``org.gpushift.Switcher1`` (the daemon),
else ``org.gpushift.Error.AccessDenied``.  Introspection and ``org.freedesktop.DBus.Peer`` answer
whoever the policy lets through.  A failure inside the core is ``org.gpushift.Error.Failed`` with
its message, never an exception out of the link.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, Protocol

from jeepney import HeaderFields, Message, MessageFlag, new_error, new_method_return

from gpushift.errors import AccessDenied, GpushiftError, InvalidArgument

BUS_NAME = "org.gpushift.FrontDoor1"
OBJECT_PATH = "/org/gpushift/FrontDoor1"
INTERFACE = "org.gpushift.FrontDoor1"
#: A backend name in a call: one line of at most this many characters.
MAX_BACKEND = 256

_INTROSPECTABLE = "org.freedesktop.DBus.Introspectable"
_PEER = "org.freedesktop.DBus.Peer"
_PROPERTIES = "org.freedesktop.DBus.Properties"
_UNKNOWN_METHOD = "org.freedesktop.DBus.Error.UnknownMethod"
_UNKNOWN_OBJECT = "org.freedesktop.DBus.Error.UnknownObject"
_UNKNOWN_INTERFACE = "org.freedesktop.DBus.Error.UnknownInterface"
_INVALID_ARGS = "org.freedesktop.DBus.Error.InvalidArgs"
_FAILED = GpushiftError.dbus_name()

_STANDARD = """  <interface name="org.freedesktop.DBus.Introspectable">
    <method name="Introspect"><arg name="xml_data" type="s" direction="out"/></method>
  </interface>
  <interface name="org.freedesktop.DBus.Peer">
    <method name="Ping"/>
    <method name="GetMachineId"><arg name="machine_uuid" type="s" direction="out"/></method>
  </interface>
  <interface name="org.freedesktop.DBus.Properties">
    <method name="GetAll">
      <arg name="interface_name" type="s" direction="in"/>
      <arg name="props" type="a{sv}" direction="out"/>
    </method>
  </interface>
"""
_DOCTYPE = (
    '<!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN"\n'
    ' "http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">\n'
)


class Core(Protocol):
    """What the bus object calls: the front door's core (``gpushift.frontdoor.core.FrontDoor``)."""

    async def close(self, backend: str) -> int: ...
    def in_flight(self, backend: str) -> int: ...
    async def release(self, serving: str) -> tuple[int, float]: ...
    def status(self) -> dict[str, Any]: ...


def contract_xml() -> str:
    """``org.gpushift.FrontDoor1.xml`` as shipped in the package."""
    return resources.files("gpushift.frontdoor").joinpath("org.gpushift.FrontDoor1.xml").read_text("utf-8")


def introspection(path: str) -> str | None:
    """The answer to ``Introspect`` on ``path``: the object itself, each node above it (with its one
    child), None for any other path."""
    if path == OBJECT_PATH:
        body = contract_xml()
        interface = body[body.index("<interface ") : body.rindex("</node>")]
        return f"{_DOCTYPE}<node>\n{_STANDARD}  {interface}</node>\n"
    parts = OBJECT_PATH.strip("/").split("/")
    for depth in range(len(parts)):
        here = "/" + "/".join(parts[:depth])
        if path == here:
            return f'{_DOCTYPE}<node>\n{_STANDARD}  <node name="{parts[depth]}"/>\n</node>\n'
    return None


def backend_arg(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_BACKEND or any(c in value for c in "\n\r\0"):
        raise InvalidArgument(
            f"{what}: expected a backend name of one line and at most {MAX_BACKEND} characters"
        )
    return value


class FrontDoorObject:
    """Answers the method calls addressed to this connection.

    ``caller_uid(unique_name)`` asks the bus (cached by the caller); ``switcher_owner()`` is the
    unique name owning ``org.gpushift.Switcher1`` now (None when nobody does); ``on_done(member,
    sender)`` is told of every ``Close`` and ``Release`` done.
    """

    def __init__(
        self,
        core: Core,
        caller_uid: Callable[[str], Awaitable[int | None]],
        switcher_owner: Callable[[], str | None],
        log: Any,
        on_done: Callable[[str, str], None] = lambda member, sender: None,
    ) -> None:
        self.core = core
        self._caller_uid = caller_uid
        self._switcher_owner = switcher_owner
        self._log = log
        self._on_done = on_done  # (member, sender) after each Close and Release answered

    @staticmethod
    def wants_reply(msg: Message) -> bool:
        return not (msg.header.flags & MessageFlag.no_reply_expected)

    async def answer(self, msg: Message) -> Message:
        """The reply (a method return or an error) to one method call."""
        fields = msg.header.fields
        path = fields.get(HeaderFields.path, "")
        interface = fields.get(HeaderFields.interface)
        member = fields.get(HeaderFields.member, "")
        signature = fields.get(HeaderFields.signature, "")
        if interface in (None, _INTROSPECTABLE) and member == "Introspect":
            xml = introspection(path)
            if xml is None:
                return new_error(msg, _UNKNOWN_OBJECT, "s", (f"no object at {path}",))
            return new_method_return(msg, "s", (xml,))
        if interface in (None, _PEER) and member in ("Ping", "GetMachineId"):
            return self._peer(msg, member)
        if path != OBJECT_PATH:
            return new_error(msg, _UNKNOWN_OBJECT, "s", (f"no object at {path}",))
        if interface == _PROPERTIES and member == "GetAll" and signature == "s":
            return new_method_return(msg, "a{sv}", ({},))  # the interface has no properties
        if interface not in (None, INTERFACE):
            return new_error(msg, _UNKNOWN_INTERFACE, "s", (f"{path} has no interface {interface}",))
        try:
            return await self._frontdoor_call(msg, member, signature)
        except GpushiftError as e:
            return new_error(msg, type(e).dbus_name(), "s", (str(e),))
        except Exception as e:  # noqa: BLE001 - a bug in the core: an answer and a log line, never a dead link
            self._log.error("frontdoor_bus_call_failed", member=member, exc_info=True)
            return new_error(msg, _FAILED, "s", (f"{member} failed: {type(e).__name__}: {e}",))

    def _peer(self, msg: Message, member: str) -> Message:
        if member == "Ping":
            return new_method_return(msg)
        try:
            with open("/etc/machine-id", encoding="ascii") as f:
                return new_method_return(msg, "s", (f.read().strip(),))
        except OSError as e:
            return new_error(msg, _FAILED, "s", (f"cannot read /etc/machine-id: {e.strerror}",))

    async def _frontdoor_call(self, msg: Message, member: str, signature: str) -> Message:
        wanted = {"Close": "s", "InFlight": "s", "Release": "s", "Status": ""}
        if member not in wanted:
            return new_error(msg, _UNKNOWN_METHOD, "s", (f"{INTERFACE} has no method {member}",))
        if signature != wanted[member]:
            want = wanted[member] or "no arguments"
            return new_error(msg, _INVALID_ARGS, "s", (f"{member} takes {want!r}, got {signature!r}",))
        await self._check_caller(msg, member)
        if member == "Status":
            return new_method_return(msg, "s", (json.dumps(self.core.status(), default=str),))
        name = backend_arg(msg.body[0], f"{member}'s argument")
        sender = str(msg.header.fields.get(HeaderFields.sender, ""))
        if member == "InFlight":
            return new_method_return(msg, "u", (_count(self.core.in_flight(name)),))
        if member == "Close":
            in_flight = await self.core.close(name)
            self._on_done(member, sender)
            self._log.info("frontdoor_closed", backend=name, in_flight=in_flight)
            return new_method_return(msg, "u", (_count(in_flight),))
        held, longest = await self.core.release(name)
        self._on_done(member, sender)
        self._log.info("frontdoor_released", serving=name, held=held, longest_s=round(float(longest), 3))
        return new_method_return(msg, "ud", (_count(held), max(0.0, float(longest))))

    async def _check_caller(self, msg: Message, member: str) -> None:
        sender = msg.header.fields.get(HeaderFields.sender, "")
        if sender and sender == self._switcher_owner():
            return
        uid = await self._caller_uid(sender) if sender else None
        if uid == 0:
            return
        self._log.warning("frontdoor_call_refused", member=member, sender=sender, uid=uid)
        raise AccessDenied(
            f"{INTERFACE}.{member} is for the gpushift daemon: the caller must be root or the owner of "
            f"org.gpushift.Switcher1 (this caller: {'uid ' + str(uid) if uid is not None else 'unknown uid'})"
        )


def _count(n: Any) -> int:
    """A count for a ``u`` (never negative, never above 2**32-1)."""
    return max(0, min(int(n), 2**32 - 1))

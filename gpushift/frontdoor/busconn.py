"""One connection to the bus on asyncio (jeepney's ``io.asyncio``): calls with a deadline, and every
other message handed to the caller in the order it arrived.

jeepney's own ``DBusRouter`` drops messages when a filter's queue is full and hides the end of its
receiving task; the front door needs to know the moment the connection ends (to reconnect) and
needs signals in order with the replies (a property read and the changes after it), so it reads
the connection itself: :meth:`BusConnection.pump` is the one reader; replies complete the
:meth:`call` waiting for them, everything else goes to ``on_message`` at once, in order.  Never
GLib or pydbus: the front door imports nothing of the daemon's process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from jeepney import DBusAddress, HeaderFields, Message, MessageType, new_method_call
from jeepney.io.asyncio import DBusConnection, open_dbus_connection
from jeepney.wrappers import DBusErrorResponse

BUS_DAEMON = DBusAddress(
    "/org/freedesktop/DBus", bus_name="org.freedesktop.DBus", interface="org.freedesktop.DBus"
)


class BusClosed(ConnectionError):
    """The connection to the bus ended (the bus went away, or it closed us)."""


class CallFailed(Exception):
    """A call answered with an error, or no answer within its deadline."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.text = message


def bus_address(kind_or_address: str) -> str:
    """jeepney's name for ``[daemon] bus`` (``system``/``session``), or an address as it is."""
    return {"system": "SYSTEM", "session": "SESSION"}.get(kind_or_address, kind_or_address)


class BusConnection:
    """An open, authenticated connection (``Hello`` answered); :meth:`pump` must run for calls to be answered."""

    def __init__(self, conn: DBusConnection) -> None:
        self._conn = conn
        self._replies: dict[int, asyncio.Future[Message]] = {}
        self.closed = False

    @classmethod
    async def open(cls, address: str, timeout_s: float) -> BusConnection:
        """Connect and authenticate within ``timeout_s``.

        Raises:
            OSError, ValueError, KeyError, TimeoutError: the bus cannot be reached (jeepney's
                ``KeyError`` names a missing ``$DBUS_SESSION_BUS_ADDRESS``).
        """
        conn = await asyncio.wait_for(open_dbus_connection(bus_address(address)), timeout_s)
        return cls(conn)

    @property
    def unique_name(self) -> str:
        return str(self._conn.unique_name)

    async def pump(self, on_message: Callable[[Message], None]) -> None:
        """Read until the connection ends; then fail every call still waiting, and raise :class:`BusClosed`."""
        try:
            while True:
                try:
                    msg = await self._conn.receive()
                except (EOFError, OSError) as e:
                    raise BusClosed(f"the bus closed the connection ({type(e).__name__})") from None
                serial = msg.header.fields.get(HeaderFields.reply_serial)
                waiting = self._replies.get(serial) if serial is not None else None
                if waiting is not None and msg.header.message_type in (
                    MessageType.method_return,
                    MessageType.error,
                ):
                    if not waiting.done():
                        waiting.set_result(msg)
                    continue
                on_message(msg)
        finally:
            self.closed = True
            for fut in self._replies.values():
                if not fut.done():
                    fut.set_exception(BusClosed("the bus connection ended before the answer"))

    async def send(self, msg: Message) -> None:
        if self.closed:
            raise BusClosed("the bus connection has ended")
        try:
            await self._conn.send(msg)
        except (OSError, RuntimeError) as e:
            raise BusClosed(f"cannot send on the bus connection ({type(e).__name__})") from None

    async def call(self, msg: Message, timeout_s: float) -> Message:
        """Send a method call; its reply (a method return), within ``timeout_s``.

        Raises:
            CallFailed: an error reply (its name and message), or none within the deadline
                (``org.freedesktop.DBus.Error.Timeout``).
            BusClosed: the connection ended.
        """
        if self.closed:
            raise BusClosed("the bus connection has ended")
        serial = next(self._conn.outgoing_serial)
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._replies[serial] = fut
        try:
            try:
                await self._conn.send(msg, serial=serial)
            except (OSError, RuntimeError) as e:
                raise BusClosed(f"cannot send on the bus connection ({type(e).__name__})") from None
            try:
                reply = await asyncio.wait_for(fut, timeout_s)
            except asyncio.TimeoutError:
                member = msg.header.fields.get(HeaderFields.member, "?")
                raise CallFailed(
                    "org.freedesktop.DBus.Error.Timeout", f"no answer to {member} within {timeout_s:g} s"
                ) from None
        finally:
            self._replies.pop(serial, None)
        if reply.header.message_type == MessageType.error:
            answer = DBusErrorResponse(reply)
            raise CallFailed(str(answer.name), str(answer.data[0]) if answer.data else "")
        return reply

    async def bus_call(
        self, member: str, signature: str | None, body: tuple[Any, ...], timeout_s: float
    ) -> Any:
        """A call to the bus itself (``org.freedesktop.DBus``); the reply's body."""
        return (await self.call(new_method_call(BUS_DAEMON, member, signature, body), timeout_s)).body

    async def close(self) -> None:
        self.closed = True
        with contextlib.suppress(Exception):
            await self._conn.close()

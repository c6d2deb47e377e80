"""The front door's link to the gpushift daemon over D-Bus (jeepney's asyncio; never GLib/pydbus).

On the bus ``[daemon] bus`` names (the system bus in production), the link:

* owns ``org.gpushift.FrontDoor1`` and answers its methods at ``/org/gpushift/FrontDoor1`` by
  calling the core (:mod:`gpushift.frontdoor.busobject`: who may call, the introspection);
* follows ``org.gpushift.Switcher1``: its properties read once (``GetAll``) and then every
  ``PropertiesChanged`` -- no polling -- each change handed to the core as a new
  :class:`~gpushift.frontdoor.view.DaemonView` (``core.update``); ``NameOwnerChanged`` tells a
  daemon that went away (the view says ``connected=False`` and keeps the last values, so the core
  goes on forwarding to the backend it last knew serving) from one that came back (read again);
* reconnects when the bus connection ends, after a pause that doubles from 0.1 s to 5 s (reset
  once a connection has lasted 30 s), while the HTTP side goes on serving.

Order of a read and the changes after it: the match rules are added before ``GetAll``, and a
``PropertiesChanged`` the daemon sent before its ``GetAll`` answer (a lower serial from the same
connection) is older than that answer and is dropped.  A daemon that restarted mid-switch never
sends ``Release`` for the switch it lost: when a daemon other than the one that called ``Close``
(another connection: it restarted, or the bus did) shows no switch in progress, the front door
releases to what serves now.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

from jeepney import DBusAddress, HeaderFields, MatchRule, Message, MessageType, new_error, new_method_call

from gpushift.frontdoor import properties
from gpushift.frontdoor.busconn import BusClosed, BusConnection, CallFailed
from gpushift.frontdoor.busobject import BUS_NAME, FrontDoorObject
from gpushift.frontdoor.view import DaemonView

_DO_NOT_QUEUE = 4
_PRIMARY_OWNER, _ALREADY_OWNER = 1, 4
#: Method calls answered at once at most; beyond, a call is refused with LimitsExceeded.
MAX_CALLS = 32
#: A connection that lasted this long resets the reconnect pause.
STEADY_S = 30.0


class Core(Protocol):
    def update(self, view: DaemonView) -> None: ...
    async def close(self, backend: str) -> int: ...
    def in_flight(self, backend: str) -> int: ...
    async def release(self, serving: str) -> tuple[int, float]: ...
    def status(self) -> dict[str, Any]: ...


@dataclasses.dataclass
class Backoff:
    """The pause before the next connection attempt: ``first``, doubling up to ``longest``."""

    first: float = 0.1
    longest: float = 5.0
    _next: float = 0.0

    def pause(self) -> float:
        self._next = min(self.longest, self._next * 2) if self._next else self.first
        return self._next

    def reset(self) -> None:
        self._next = 0.0


class DaemonLink:
    """Run with :meth:`run` (a task for the process's life); :meth:`stop` ends it."""

    def __init__(
        self,
        core: Core,
        bus: str,
        log: Any,
        call_timeout_s: float = 5.0,
        backoff: Backoff | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = core
        self.bus = bus  # "system", "session" or a D-Bus address
        self.log = log
        self.call_timeout_s = call_timeout_s
        self.backoff = backoff or Backoff()
        self._monotonic = monotonic
        self.view = DaemonView()
        self.owns_name = False
        self.connected = asyncio.Event()  # the bus connection is up (tests wait on it)
        #: Set once the link has tried the daemon: its properties read, nobody owning its name, or the
        #: bus or the read failing.  The command serves only then (bounded), so that a request the
        #: front door accepts right after a restart is not answered "daemon not answering" while the
        #: answer is a few milliseconds away; until then connections wait in the socket's backlog.
        self.first_read = asyncio.Event()
        self._failures = 0
        self._failed_since = 0.0
        self._conn: BusConnection | None = None
        self._switcher_owner: str | None = None
        self._uids: dict[str, int | None] = {}
        self._stopping = asyncio.Event()
        self._calls: set[asyncio.Task[None]] = set()
        self._session_no = 0
        #: Who called Close last without a Release since: (connection number, the caller's unique name).
        self._closer: tuple[int, str] | None = None

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Connect, serve and follow until :meth:`stop`; reconnect after every lost connection."""
        while not self._stopping.is_set():
            began = self._monotonic()
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the link never dies: log, pause, reconnect
                self._note_failure(e)
            self._lost()
            self.first_read.set()
            if self._monotonic() - began >= STEADY_S:
                self.backoff.reset()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.backoff.pause())

    def _note_failure(self, e: Exception) -> None:
        """The first failure in a row is a warning; the next ones once a minute (a bus that stays
        away must not fill the journal at every attempt)."""
        now = self._monotonic()
        self._failures += 1
        if self._failures == 1 or now - self._failed_since >= 60.0:
            self._failed_since = now
            self.log.warning(
                "frontdoor_bus_lost", bus=self.bus, error=f"{type(e).__name__}: {e}", attempts=self._failures
            )

    async def get_summary(self) -> str:
        """``Switcher1.GetSummary()``: the status page's redacted summary, as JSON text
        (``frontdoor/page.py`` asks at most every 2 s).

        Raises:
            BusClosed: no bus connection now.
            CallFailed: the daemon answered with an error, or not within the call timeout.
        """
        conn = self._conn
        if conn is None:
            raise BusClosed("not connected to the bus")
        switcher = DBusAddress(
            properties.SWITCHER_PATH,
            bus_name=properties.SWITCHER_BUS_NAME,
            interface=properties.SWITCHER_INTERFACE,
        )
        reply = await conn.call(new_method_call(switcher, "GetSummary"), self.call_timeout_s)
        return str(reply.body[0])

    async def stop(self) -> None:
        self._stopping.set()
        conn = self._conn
        if conn is not None:
            await conn.close()
        for task in list(self._calls):
            task.cancel()

    def _lost(self) -> None:
        self.connected.clear()
        self.owns_name = False
        self._conn = None
        self._switcher_owner = None
        self._uids.clear()
        self._push(dataclasses.replace(self.view, connected=False))

    def _push(self, view: DaemonView) -> None:
        if view == self.view:
            return
        was = self.view
        self.view = view
        if view.connected != was.connected:
            self.log.info("frontdoor_daemon", connected=view.connected, active=view.active)
        try:
            self.core.update(view)
        except Exception:  # noqa: BLE001 - the core's bug must not end the link
            self.log.error("frontdoor_update_failed", exc_info=True)

    # ------------------------------------------------------------------ one connection

    async def _session(self) -> None:
        """One connection, from its opening to its end (which raises: :class:`BusClosed`, or a failed call)."""
        conn = await BusConnection.open(self.bus, self.call_timeout_s)
        self._conn = conn
        self._session_no += 1
        signals: asyncio.Queue[Message] = asyncio.Queue()
        served = FrontDoorObject(
            self.core, self._caller_uid, lambda: self._switcher_owner, self.log, self._done
        )
        tasks = [asyncio.ensure_future(conn.pump(lambda m: self._dispatch(m, conn, served, signals)))]
        try:
            await self._add_matches(conn)
            self.connected.set()
            self._failures = 0
            self.log.info("frontdoor_bus_connected", bus=self.bus, unique_name=conn.unique_name)
            tasks += [
                asyncio.ensure_future(self._watch(conn, signals)),
                asyncio.ensure_future(self._own_name(conn)),
            ]
            while tasks:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    error = task.exception()
                    if error is not None:
                        raise error
                tasks = [t for t in tasks if not t.done()]  # the name is owned: the rest goes on
        finally:
            for task in [*tasks, *self._calls]:
                task.cancel()
            await conn.close()

    def _done(self, member: str, sender: str) -> None:
        self._closer = (self._session_no, sender) if member == "Close" else None

    def _dispatch(
        self, msg: Message, conn: BusConnection, served: FrontDoorObject, signals: asyncio.Queue[Message]
    ) -> None:
        kind = msg.header.message_type
        if kind == MessageType.signal:
            signals.put_nowait(msg)
        elif kind == MessageType.method_call:
            if len(self._calls) >= MAX_CALLS:
                self.log.warning("frontdoor_bus_calls_refused", pending=len(self._calls))
                self._spawn(self._refuse(conn, msg))
            else:
                self._spawn(self._answer(conn, served, msg))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)

    async def _answer(self, conn: BusConnection, served: FrontDoorObject, msg: Message) -> None:
        reply = await served.answer(msg)
        if served.wants_reply(msg):
            with contextlib.suppress(BusClosed):
                await conn.send(reply)

    async def _refuse(self, conn: BusConnection, msg: Message) -> None:
        with contextlib.suppress(BusClosed):
            await conn.send(
                new_error(
                    msg, "org.freedesktop.DBus.Error.LimitsExceeded", "s", (f"{MAX_CALLS} calls in progress",)
                )
            )

    async def _add_matches(self, conn: BusConnection) -> None:
        for rule in (_owner_rule(), _changes_rule(sender=properties.SWITCHER_BUS_NAME)):
            await conn.bus_call("AddMatch", "s", (rule.serialise(),), self.call_timeout_s)

    async def _own_name(self, conn: BusConnection) -> None:
        """Own ``org.gpushift.FrontDoor1``; retried with the backoff while another process has it or the
        policy refuses (the front door forwards meanwhile, but the daemon cannot reach it)."""
        pause = Backoff(first=0.5, longest=10.0)
        while True:
            try:
                (answer,) = await conn.bus_call(
                    "RequestName", "su", (BUS_NAME, _DO_NOT_QUEUE), self.call_timeout_s
                )
            except CallFailed as e:
                self.log.error("frontdoor_name_refused", name=BUS_NAME, error=e.name, message=e.text)
            else:
                if answer in (_PRIMARY_OWNER, _ALREADY_OWNER):
                    self.owns_name = True
                    self.log.info("frontdoor_name_owned", name=BUS_NAME)
                    return
                self.log.error(
                    "frontdoor_name_taken", name=BUS_NAME, hint="another front door runs on this bus"
                )
            await asyncio.sleep(pause.pause())

    async def _caller_uid(self, sender: str) -> int | None:
        if sender in self._uids:
            return self._uids[sender]
        conn = self._conn
        uid: int | None = None
        if conn is not None:
            try:
                (uid,) = await conn.bus_call("GetConnectionUnixUser", "s", (sender,), self.call_timeout_s)
            except (CallFailed, BusClosed):
                return None
        if len(self._uids) > 1024:
            self._uids.clear()
        self._uids[sender] = uid
        return uid

    # ------------------------------------------------------------------ following the daemon

    async def _watch(self, conn: BusConnection, signals: asyncio.Queue[Message]) -> None:
        try:
            (owner,) = await conn.bus_call(
                "GetNameOwner", "s", (properties.SWITCHER_BUS_NAME,), self.call_timeout_s
            )
        except CallFailed:
            owner = ""
        follow = _Follow(str(owner))
        await self._read(conn, follow)
        self.first_read.set()
        while True:
            retry = follow.owner and follow.serial is None
            try:
                msg = await (
                    asyncio.wait_for(signals.get(), follow.retry.pause()) if retry else signals.get()
                )
            except asyncio.TimeoutError:
                await self._read(conn, follow)
                continue
            await self._signal(conn, follow, msg)

    async def _signal(self, conn: BusConnection, follow: _Follow, msg: Message) -> None:
        fields = msg.header.fields
        member = fields.get(HeaderFields.member)
        if member == "NameOwnerChanged" and fields.get(HeaderFields.sender) == "org.freedesktop.DBus":
            name, _old, new = (list(msg.body) + ["", "", ""])[:3]
            if name != properties.SWITCHER_BUS_NAME or new == follow.owner:
                return
            self.log.info("frontdoor_daemon_owner", owner=new or None)
            follow.owner, follow.serial, follow.known = new, None, {}
            self._uids.clear()
            if new:
                await self._read(conn, follow)
            else:
                self._switcher_owner = None
                self._push(dataclasses.replace(self.view, connected=False))
            return
        if member != "PropertiesChanged" or fields.get(HeaderFields.sender) != follow.owner:
            return
        if follow.serial is None or msg.header.serial <= follow.serial:
            return  # not read yet (the read follows), or older than the read
        interface, changed, invalidated = (list(msg.body) + ["", {}, []])[:3]
        if interface != properties.SWITCHER_INTERFACE or not isinstance(changed, dict):
            return
        follow.known = properties.merged(follow.known, changed, invalidated)
        self._push(properties.view_of(follow.known))
        if invalidated:
            await self._read(conn, follow)

    async def _read(self, conn: BusConnection, follow: _Follow) -> None:
        """``GetAll`` from the owner now; on failure the view says not connected and it is tried again."""
        self._switcher_owner = follow.owner or None
        if not follow.owner:
            self._push(dataclasses.replace(self.view, connected=False))
            return
        msg = new_method_call(
            DBusAddress(
                properties.SWITCHER_PATH, bus_name=follow.owner, interface="org.freedesktop.DBus.Properties"
            ),
            "GetAll",
            "s",
            (properties.SWITCHER_INTERFACE,),
        )
        try:
            reply = await conn.call(msg, self.call_timeout_s)
        except CallFailed as e:
            self.log.warning("frontdoor_daemon_unreadable", error=e.name, message=e.text)
            follow.serial = None
            self._push(dataclasses.replace(self.view, connected=False))
            return
        follow.serial = reply.header.serial
        follow.retry.reset()
        follow.known = properties.merged({}, reply.body[0] if reply.body else {})
        self._push(properties.view_of(follow.known))
        await self._release_orphans(follow.owner)

    async def _release_orphans(self, owner: str) -> None:
        """A Close from a daemon that is gone (it restarted, or the bus did) will never be released by
        it: once the daemon now owning the name shows no switch in progress, release to what serves."""
        closer = self._closer
        if closer is None or closer == (self._session_no, owner) or self.view.switching:
            return
        self._closer = None
        try:
            held, longest = await self.core.release(self.view.serving)
        except Exception:  # noqa: BLE001 - logged; the core's own deadlines still end each hold
            self.log.error("frontdoor_release_orphans_failed", exc_info=True)
            return
        self.log.warning(
            "frontdoor_released_orphans", serving=self.view.serving, held=held, longest_s=longest
        )


@dataclasses.dataclass
class _Follow:
    """What the watch knows of the daemon: its connection, the serial of the last read, the properties."""

    owner: str
    serial: int | None = None
    known: dict[str, Any] = dataclasses.field(default_factory=dict)
    retry: Backoff = dataclasses.field(default_factory=lambda: Backoff(first=0.5, longest=5.0))


def _owner_rule() -> MatchRule:
    rule = MatchRule(
        type="signal",
        sender="org.freedesktop.DBus",
        interface="org.freedesktop.DBus",
        member="NameOwnerChanged",
        path="/org/freedesktop/DBus",
    )
    rule.add_arg_condition(0, properties.SWITCHER_BUS_NAME)
    return rule


def _changes_rule(sender: str) -> MatchRule:
    rule = MatchRule(
        type="signal",
        sender=sender,
        interface="org.freedesktop.DBus.Properties",
        member="PropertiesChanged",
        path=properties.SWITCHER_PATH,
    )
    rule.add_arg_condition(0, properties.SWITCHER_INTERFACE)
    return rule

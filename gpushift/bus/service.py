"""The D-Bus face of the daemon (org.gpushift.Switcher1) — thin, no logic of its own.

pydbus runs these handlers on the GLib loop thread and replies only when they return, so each one
returns at once: a switch is queued and answered with a ticket; progress and completion arrive as
signals carrying it.  Expected errors leave under their dotted D-Bus names
(``org.gpushift.Error.SwitchInProgress``...), made by :mod:`gpushift.host.dbus_errors`; every
method that takes arguments has them checked by :func:`gpushift.bus.args.check` once the
caller is known, before anything changes.

The read-only properties (``ActiveBackend``, ``Mode``, ...) are the values the daemon computes from
memory (``Backend.property_values``); :meth:`SwitcherService.announce` computes them and sends the
changed ones in one ``PropertiesChanged``.  It runs on every read, before the answer to a method
that changes what runs (the reply goes out after the signal), and whenever the daemon calls it
(after each Progress and Finished, and every second).  When computing fails the last values stay,
the failure is logged once, and methods still answer.

Any user may call ``GetStatus`` (the system bus's policy lets everyone), as fast as the bus lets
them: :func:`publish` answers it from the cached document's reply body, and runs the methods that
authorize their caller once the bus has said, asynchronously, who that is.  Every call handled
stamps ``last_call``, which the watchdog reads as the loop's progress (``gpushift/daemon/watchdog.py``).
Measured before choosing (a stand-alone service, 20,000 pipelined calls, one run each): the daemon's
CPU for them was 2.7 s through pydbus, 1.5 s with this dispatcher, and 2.45 s answering on GDBus's
worker thread through a message filter (which every outgoing message passes too).
"""

from __future__ import annotations

import collections
import functools
import grp
import logging
import os
import pwd
import time
from collections.abc import Callable
from importlib import resources
from typing import Any, Protocol

from pydbus.generic import signal

from gpushift.bus import args as dbus_args
from gpushift.bus.names import BUS_NAME, INTERFACE, OBJECT_PATH
from gpushift.errors import AccessDenied, GpushiftError
from gpushift.host import dbus_errors
from gpushift.values import Caller

# pydbus logs every exception a handler raises with a traceback; expected errors are not bugs.
logging.getLogger("pydbus.registration").setLevel(logging.CRITICAL)


def interface_xml() -> str:
    return resources.files("gpushift.bus").joinpath("org.gpushift.Switcher1.xml").read_text()


class Backend(Protocol):
    """What the daemon offers the service (the daemon object implements it)."""

    def status_json(self) -> str: ...

    def summary_json(self) -> str:
        """The status page's redacted summary as JSON (from memory, no I/O)."""
        ...

    def switch(self, backend: str, options: dict[str, Any], caller: Caller) -> str: ...

    def cancel(self, caller: Caller) -> str: ...

    def resume(self, caller: Caller) -> str: ...

    def reload(self, caller: Caller) -> str: ...

    def property_values(self) -> dict[str, Any]:
        """Every property by name, from memory only (no I/O): see :data:`PROPERTY_DEFAULTS`."""
        ...


#: How long one computed status document answers GetStatus (unless something changed it sooner): a
#: flood of calls then costs the loop a reply each, not a status each.  Shorter than a CLI's start,
#: so a `gpushift status` run after `gpushift switch` exited never gets a document from before.
STATUS_REUSE_S = 0.05

#: The methods that need to know who calls (authorize): :func:`publish` asks the bus for the caller's
#: credentials without blocking the loop before it runs them.
NEEDS_CALLER = frozenset({"Switch", "SwitchWithOptions", "SwitchTo", "Cancel", "Resume", "Reload"})
#: How many callers' credentials are remembered (a unique bus name is never given out again).
CREDENTIALS_KEPT = 256
#: The most the bus may take to say who a caller is (ms; GDBus's own default).
CREDENTIALS_TIMEOUT_MS = 25_000
#: How long one computed summary answers GetSummary, whatever the traffic and whatever changed: the
#: status page's data is refreshed at most this often (the page learns of a switch from the
#: properties, which are announced at once).
SUMMARY_REUSE_S = 2.0

#: The properties and the values they have before anything was computed (the XML documents them).
PROPERTY_DEFAULTS: dict[str, Any] = {
    "ActiveBackend": "",
    "Mode": "",
    "SwitchInProgress": False,
    "Phase": "",
    "NextSwitch": ("", 0),
    "Backends": [],
    "SwitchTarget": "",
    "NextServed": {},
    "Models": {},
    "TimeZone": "",
    "Instances": {},
}


def _property(name: str) -> Any:
    return property(lambda self: self.read_property(name))


def _handler(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The D-Bus method edge: expected errors get dotted names; a bug is logged and named Failed.
    Every call handled stamps ``last_call`` (the watchdog's sign that the loop makes progress)."""

    @functools.wraps(fn)
    def wrapper(self: SwitcherService, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except GpushiftError as e:
            raise dbus_errors.as_dbus_error(e) from None
        except Exception as e:
            logging.getLogger("gpushift").exception("dbus_handler_crashed")
            raise dbus_errors.internal_error(e) from None
        finally:
            self.last_call = time.monotonic()

    return wrapper


class SwitcherService:
    """The object published at /org/gpushift/Switcher1."""

    dbus = interface_xml()

    Progress = signal()
    Finished = signal()
    PropertiesChanged = signal()  # pydbus sends it as org.freedesktop.DBus.Properties's signal

    ActiveBackend = _property("ActiveBackend")
    Mode = _property("Mode")
    SwitchInProgress = _property("SwitchInProgress")
    Phase = _property("Phase")
    NextSwitch = _property("NextSwitch")
    Backends = _property("Backends")
    SwitchTarget = _property("SwitchTarget")
    NextServed = _property("NextServed")
    Models = _property("Models")
    TimeZone = _property("TimeZone")
    Instances = _property("Instances")

    def __init__(self, bus: Any, backend: Backend, allowed_group: str = "gpushift") -> None:
        self._bus = bus
        self._backend = backend
        self.allowed_group = allowed_group
        self._values: dict[str, Any] = dict(PROPERTY_DEFAULTS)
        self._failing = False
        # (monotonic time computed, the JSON, the reply's body as a GVariant or None) for GetStatus
        self._status: tuple[float, str, Any] | None = None
        self.last_call = 0.0  # monotonic time the last call was handled (for the watchdog)
        self._credentials: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._summary: tuple[float, str] | None = None  # (monotonic time computed, the JSON) for GetSummary
        self.clock: Callable[[], float] = time.monotonic  # GetSummary's (a test sets its own)
        if backend is not None:  # the values before anything is announced: then only changes go out
            self._compute()

    # -- properties

    def _compute(self) -> dict[str, Any] | None:
        try:
            values = self._backend.property_values()
            # a property the daemon does not compute (an older Backend) keeps its default
            new = {name: values.get(name, default) for name, default in PROPERTY_DEFAULTS.items()}
        except Exception as e:
            if not self._failing:
                logging.getLogger("gpushift").error("dbus_properties_failed: %r (the last values stay)", e)
            self._failing = True
            return None
        if self._failing:
            logging.getLogger("gpushift").info("dbus_properties_recovered")
        self._failing = False
        changed = {k: v for k, v in new.items() if self._values.get(k) != v}
        self._values = new
        return changed

    def announce(self) -> bool:
        """Compute the properties and send the changed ones (loop thread).  True, so that it can be
        a GLib timeout's callback.  The cached status document goes too."""
        self._status = None
        changed = self._compute()
        if changed:
            self.PropertiesChanged(INTERFACE, changed, [])
        return True

    def read_property(self, name: str) -> Any:
        self.announce()
        self.last_call = time.monotonic()
        return self._values[name]

    # -- caller identity (read from the bus, never from the message)

    def caller(self, dbus_context: Any) -> tuple[Caller, list[int]]:
        sender = dbus_context.sender if dbus_context is not None else None
        if not sender:
            return Caller(uid=os.getuid(), user=_user_name(os.getuid())), []
        creds = self._credentials.get(sender)
        if creds is None:  # not asked ahead (a publication other than publish()'s): ask now
            creds = self._remember(sender, self._bus.dbus.GetConnectionCredentials(sender))
        uid = int(creds.get("UnixUserID", -1))
        # dbus-daemon before UnixGroupIDs existed (older distributions): the user's groups from
        # the user database instead.
        gids = [int(g) for g in creds["UnixGroupIDs"]] if "UnixGroupIDs" in creds else _groups_of(uid)
        pid = creds.get("ProcessID")
        return Caller(uid=uid, user=_user_name(uid), pid=int(pid) if pid is not None else None), gids

    def _remember(self, sender: str, creds: dict[str, Any]) -> dict[str, Any]:
        self._credentials[sender] = creds
        while len(self._credentials) > CREDENTIALS_KEPT:
            self._credentials.popitem(last=False)
        return creds

    def ask_credentials(
        self, sender: str, then: Callable[[], None], fail: Callable[[str, str], None]
    ) -> None:
        """Learn who ``sender`` is without blocking the loop (GetConnectionCredentials, answered to
        the loop like a call), then run ``then()``; ``fail(name, message)`` when the bus cannot say
        (the caller left).  A loop that waited for the bus here waited as long as a flood of calls
        made the bus slow, and answered nothing else meanwhile."""
        if not sender or sender in self._credentials:  # no sender: a peer connection (caller() says who)
            then()
            return
        from gi.repository import Gio, GLib

        def done(con: Any, result: Any, *_: Any) -> None:
            try:
                creds = con.call_finish(result).unpack()[0]
            except GLib.Error as e:
                name, msg = dbus_errors.split_remote(e)
                fail(name or GpushiftError.dbus_name(), f"cannot tell who is calling: {msg}")
                return
            self._remember(sender, dict(creds))
            then()

        self._bus.con.call(
            "org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus",
            "GetConnectionCredentials",
            GLib.Variant("(s)", (sender,)),
            GLib.VariantType.new("(a{sv})"),
            Gio.DBusCallFlags.NONE,
            CREDENTIALS_TIMEOUT_MS,
            None,
            done,
        )

    def authorize(self, dbus_context: Any) -> Caller:
        """Root, the daemon's own user, and members of ``allowed_group`` may change what runs.

        The system-bus policy file already enforces this; checking again here is defence in depth
        (a bus with a looser policy, or the session bus).
        """
        caller, gids = self.caller(dbus_context)
        if caller.uid in (0, os.getuid()):
            return caller
        try:
            gid = grp.getgrnam(self.allowed_group).gr_gid
        except KeyError:
            gid = None
        if gid is not None and gid in gids:
            return caller
        raise AccessDenied(
            f"user {caller.user} (uid {caller.uid}) may not change the running backend: "
            f"only root and members of group {self.allowed_group!r} may"
        )

    # -- methods

    @_handler
    def GetStatus(self) -> str:
        """The status document (pydbus's path; :func:`publish` answers through :meth:`answer_status`)."""
        return self._status_reply()[0]

    def _status_reply(self) -> tuple[str, Any]:
        """(the JSON, the reply body or None), computed at most once per :data:`STATUS_REUSE_S` and
        again after anything that can change it went through this service (an announcement — after
        each Progress, after the sample that follows Finished, on the one-second timer — or a
        changing method): any user may call GetStatus, and 45,000 pipelined calls computed one by
        one held the loop long enough for the watchdog to restart the daemon."""
        now = time.monotonic()
        cached = self._status
        if cached is not None and now - cached[0] < STATUS_REUSE_S:
            return cached[1], cached[2]
        text = self._backend.status_json()
        self._status = (time.monotonic(), text, None)
        return text, None

    def answer_status(self, invocation: Any) -> None:
        """GetStatus answered on the loop from the cached document, its reply body made once per
        document: no argument inspection, no new GVariant, no exception machinery per call — a
        flood of calls costs the loop about half of what pydbus's generic path did
        (docs/benchmarks.md, ``status_flood``)."""
        try:
            text, body = self._status_reply()
            if body is None:
                from gi.repository import GLib

                body = GLib.Variant.new_tuple(GLib.Variant.new_string(text))
                cached = self._status
                if cached is not None and cached[1] is text:
                    self._status = (cached[0], text, body)
        except GpushiftError as e:
            invocation.return_dbus_error(e.dbus_name(), str(e))
        except Exception as e:
            logging.getLogger("gpushift").exception("dbus_handler_crashed")
            invocation.return_dbus_error(GpushiftError.dbus_name(), f"internal error: {e!r}")
        else:
            invocation.return_value(body)
        finally:
            self.last_call = time.monotonic()

    @_handler
    def GetSummary(self) -> str:
        """The status page's redacted summary (no argv, environment, key, PID, user or reason can
        be in it: ``gpushift/statuspage/summary.py``), computed at most once per
        :data:`SUMMARY_REUSE_S`: any user may call it, as often as they like."""
        now = self.clock()
        cached = self._summary
        if cached is not None and now - cached[0] < SUMMARY_REUSE_S:
            return cached[1]
        text = self._backend.summary_json()
        self._summary = (self.clock(), text)
        return text

    # A switch's arguments are checked (dbus_args.check, with gpushift.config.validate's rules) after the
    # caller and before anything changes: a refusal is org.gpushift.Error.InvalidArgument naming
    # the field.

    @_handler
    def Switch(self, backend: str, reason: str, dbus_context: Any = None) -> str:
        caller = self.authorize(dbus_context)
        options = dbus_args.check("Switch", backend, reason)
        return self._announced(self._backend.switch(backend, options, caller))

    @_handler
    def SwitchWithOptions(self, backend: str, options_json: str, dbus_context: Any = None) -> str:
        caller = self.authorize(dbus_context)
        options = dbus_args.check("SwitchWithOptions", backend, options_json)
        return self._announced(self._backend.switch(backend, options, caller))

    @_handler
    def SwitchTo(self, backend: str, options: dict[str, Any], dbus_context: Any = None) -> str:
        caller = self.authorize(dbus_context)
        checked = dbus_args.check("SwitchTo", backend, options)
        return self._announced(self._backend.switch(backend, checked, caller))

    @_handler
    def Cancel(self, dbus_context: Any = None) -> str:
        return self._announced(self._backend.cancel(self.authorize(dbus_context)))

    @_handler
    def Resume(self, dbus_context: Any = None) -> str:
        return self._announced(self._backend.resume(self.authorize(dbus_context)))

    @_handler
    def Reload(self, dbus_context: Any = None) -> str:
        return self._announced(self._backend.reload(self.authorize(dbus_context)))

    def _announced(self, answer: str) -> str:
        """A method that may have changed the properties: the changes go out before its answer."""
        self.announce()
        return answer


def _groups_of(uid: int) -> list[int]:
    try:
        pw = pwd.getpwuid(uid)
        return list(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except (KeyError, OverflowError, OSError):
        return []


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def publish(bus: Any, service: SwitcherService) -> Any:
    """Export the object and own the bus name; returns what ``unpublish()`` takes back.

    No replacement either way: a second daemon must fail to start rather than steal the name
    (pydbus's default would let it).  Raises RuntimeError when the name is taken.

    pydbus's own object wrapper serves every member (signals, properties, methods) except
    ``GetStatus``, which :meth:`SwitcherService.answer_status` answers straight from the cached
    reply: the call any user may flood.  The methods that authorize their caller run once the bus
    has said who it is (:meth:`SwitcherService.ask_credentials`), never waiting for it on the loop.
    """
    from gi.repository import Gio
    from pydbus.exitable import ExitableWithAliases
    from pydbus.registration import ObjectRegistration, ObjectWrapper

    class _Wrapper(ObjectWrapper):  # type: ignore[misc]
        def call_method(self, con: Any, sender: str, path: str, iface: str, member: str, *rest: Any) -> None:
            invocation = rest[-1]  # rest: the parameters, the invocation
            if iface != INTERFACE or member not in NEEDS_CALLER | {"GetStatus"}:
                super().call_method(con, sender, path, iface, member, *rest)
            elif member == "GetStatus":
                service.answer_status(invocation)
            else:
                service.ask_credentials(
                    sender,
                    lambda: ObjectWrapper.call_method(self, con, sender, path, iface, member, *rest),
                    invocation.return_dbus_error,
                )

    class _Publication(ExitableWithAliases("unpublish")):  # type: ignore[misc]
        def __init__(self) -> None:
            interfaces = Gio.DBusNodeInfo.new_for_xml(type(service).dbus).interfaces
            wrapper = _Wrapper(service, interfaces)
            reg = ObjectRegistration(bus, OBJECT_PATH, interfaces, wrapper, own_wrapper=True)
            self._at_exit(reg.__exit__)
            try:  # the name only after the object is registered (as pydbus's Publication)
                owner = bus.request_name(BUS_NAME, allow_replacement=False, replace=False)
            except BaseException:
                self.__exit__()  # a name taken: nothing stays registered
                raise
            self._at_exit(owner.__exit__)

    return _Publication()

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
"""

from __future__ import annotations

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
}


def _property(name: str) -> Any:
    return property(lambda self: self.read_property(name))


def _handler(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The D-Bus method edge: expected errors get dotted names; a bug is logged and named Failed."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GpushiftError as e:
            raise dbus_errors.as_dbus_error(e) from None
        except Exception as e:
            logging.getLogger("gpushift").exception("dbus_handler_crashed")
            raise dbus_errors.internal_error(e) from None

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

    def __init__(self, bus: Any, backend: Backend, allowed_group: str = "gpushift") -> None:
        self._bus = bus
        self._backend = backend
        self.allowed_group = allowed_group
        self._values: dict[str, Any] = dict(PROPERTY_DEFAULTS)
        self._failing = False
        self._status: tuple[float, str] | None = None  # (monotonic time computed, the JSON) for GetStatus
        self._summary: tuple[float, str] | None = None  # the same for GetSummary
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
        return self._values[name]

    # -- caller identity (read from the bus, never from the message)

    def caller(self, dbus_context: Any) -> tuple[Caller, list[int]]:
        sender = dbus_context.sender if dbus_context is not None else None
        if not sender:
            return Caller(uid=os.getuid(), user=_user_name(os.getuid())), []
        creds = self._bus.dbus.GetConnectionCredentials(sender)
        uid = int(creds.get("UnixUserID", -1))
        # dbus-daemon before UnixGroupIDs existed (older distributions): the user's groups from
        # the user database instead.
        gids = [int(g) for g in creds["UnixGroupIDs"]] if "UnixGroupIDs" in creds else _groups_of(uid)
        pid = creds.get("ProcessID")
        return Caller(uid=uid, user=_user_name(uid), pid=int(pid) if pid is not None else None), gids

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
        """The status document, computed at most once per :data:`STATUS_REUSE_S` and again after
        anything that can change it went through this service (an announcement — after each
        Progress, after the sample that follows Finished, on the one-second timer — or a changing
        method): any user may call it, and 45,000 pipelined calls computed one by one held the loop
        long enough for the watchdog to restart the daemon."""
        now = time.monotonic()
        cached = self._status
        if cached is not None and now - cached[0] < STATUS_REUSE_S:
            return cached[1]
        text = self._backend.status_json()
        self._status = (time.monotonic(), text)
        return text

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
    """Export the object and own the bus name.

    No replacement either way: a second daemon must fail to start rather than steal the name
    (pydbus's default would let it).  Raises RuntimeError when the name is taken.
    """
    from pydbus.publication import Publication

    return Publication(bus, BUS_NAME, (OBJECT_PATH, service), allow_replacement=False, replace=False)

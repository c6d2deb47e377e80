"""L4: the D-Bus face of the daemon (org.gpushift.Switcher1) — thin, no logic of its own.

pydbus runs these handlers on the GLib loop thread and replies only when they return, so each one
returns at once: a switch is queued and answered with a ticket; progress and completion arrive as
signals carrying it.  Expected errors leave under their dotted D-Bus names
(``org.gpushift.Error.SwitchInProgress``...), made by :mod:`gpushift.adapters.dbus_errors`.
"""

from __future__ import annotations

import functools
import grp
import logging
import os
import pwd
from collections.abc import Callable
from importlib import resources
from typing import Any, Protocol

from pydbus.generic import signal

from .. import validate
from ..errors import AccessDenied, GpushiftError
from ..model import Caller
from . import dbus_errors
from .dbus_names import BUS_NAME, OBJECT_PATH

# pydbus logs every exception a handler raises with a traceback; expected errors are not bugs.
logging.getLogger("pydbus.registration").setLevel(logging.CRITICAL)


def interface_xml() -> str:
    return resources.files("gpushift").joinpath("org.gpushift.Switcher1.xml").read_text()


class Backend(Protocol):
    """What the daemon offers the service (the daemon object implements it)."""

    def status_json(self) -> str: ...

    def switch(self, backend: str, options: dict[str, Any], caller: Caller) -> str: ...

    def cancel(self, caller: Caller) -> str: ...

    def resume(self, caller: Caller) -> str: ...

    def reload(self, caller: Caller) -> str: ...


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

    def __init__(self, bus: Any, backend: Backend, allowed_group: str = "gpushift") -> None:
        self._bus = bus
        self._backend = backend
        self.allowed_group = allowed_group

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
        return self._backend.status_json()

    # A switch's arguments are checked (gpushift.validate) after the caller and before anything
    # changes: a refusal is org.gpushift.Error.InvalidArgument naming the field.

    @_handler
    def Switch(self, backend: str, reason: str, dbus_context: Any = None) -> str:
        caller = self.authorize(dbus_context)
        options = validate.switch_request(backend, {"reason": reason})
        return self._backend.switch(backend, options, caller)

    @_handler
    def SwitchWithOptions(self, backend: str, options_json: str, dbus_context: Any = None) -> str:
        caller = self.authorize(dbus_context)
        options = validate.switch_request(backend, validate.options_json(options_json))
        return self._backend.switch(backend, options, caller)

    @_handler
    def Cancel(self, dbus_context: Any = None) -> str:
        return self._backend.cancel(self.authorize(dbus_context))

    @_handler
    def Resume(self, dbus_context: Any = None) -> str:
        return self._backend.resume(self.authorize(dbus_context))

    @_handler
    def Reload(self, dbus_context: Any = None) -> str:
        return self._backend.reload(self.authorize(dbus_context))


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

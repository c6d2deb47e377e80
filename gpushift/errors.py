"""The one exception hierarchy.

Each class carries the CLI exit code (``code``) and the D-Bus error name a client sees
(``dbus_name``).  pydbus names a D-Bus error after the Python class's ``__name__``; a name without a
dot would reach clients as ``unknown.ClassName``, so the D-Bus service re-raises these under their
dotted names (see ``host/dbus_errors.py``).
"""

from __future__ import annotations

from typing import ClassVar

ERROR_PREFIX = "org.gpushift.Error."


class GpushiftError(Exception):
    """Base of every expected failure. ``str(e)`` is a one-line message for a person."""

    code: ClassVar[int] = 1
    dbus_suffix: ClassVar[str] = "Failed"

    @classmethod
    def dbus_name(cls) -> str:
        return ERROR_PREFIX + cls.dbus_suffix


class ConfigError(GpushiftError):
    """A config or schedule file is wrong: the message names file, key/line and what was expected."""

    code = 2
    dbus_suffix = "InvalidConfig"


class InvalidArgument(GpushiftError):
    """An argument from outside (a D-Bus call's, a command line's) breaks its rule: the message
    names the field and the rule (``gpushift.config.validate``).  Nothing was changed."""

    code = 2
    dbus_suffix = "InvalidArgument"


class UnknownBackend(GpushiftError):
    code = 3
    dbus_suffix = "UnknownBackend"


class SwitchInProgress(GpushiftError):
    code = 4
    dbus_suffix = "SwitchInProgress"


class AccessDenied(GpushiftError):
    code = 5
    dbus_suffix = "AccessDenied"


class DaemonUnavailable(GpushiftError):
    """The CLI could not reach the daemon (or lost it mid-switch)."""

    code = 6
    dbus_suffix = "DaemonUnavailable"


class SwitchFailed(GpushiftError):
    """A switch ended without the target serving (refused, rolled back, failed)."""

    code = 7
    dbus_suffix = "SwitchFailed"


class VramNotReleased(SwitchFailed):
    code = 8
    dbus_suffix = "VramNotReleased"


class NothingToCancel(GpushiftError):
    code = 9
    dbus_suffix = "NothingToCancel"


class CancelRefused(NothingToCancel):
    """The switch in flight cannot be cancelled now (it is rolling back to what served before)."""

    dbus_suffix = "CancelRefused"


class SystemdError(GpushiftError):
    """systemd refused or failed a job we asked for (translated at the adapter's edge)."""

    code = 10
    dbus_suffix = "Systemd"


class LedgerError(GpushiftError):
    code = 11
    dbus_suffix = "Ledger"


class FleetError(GpushiftError):
    """The fleet's central database (``[mirror]``) cannot be reached, or refuses (docs/fleet.md)."""

    code = 12
    dbus_suffix = "Fleet"


#: Every error class by its D-Bus name, so the client can turn a remote error back into one.
def by_dbus_name() -> dict[str, type[GpushiftError]]:
    out: dict[str, type[GpushiftError]] = {}
    stack: list[type[GpushiftError]] = [GpushiftError]
    while stack:
        cls = stack.pop()
        out[cls.dbus_name()] = cls
        stack.extend(cls.__subclasses__())
    return out

"""D-Bus errors both ways — our errors out under their dotted names, remote errors back into our classes.

Out (the daemon's D-Bus methods): pydbus names the D-Bus error a handler raises after the Python
class's ``__name__`` (a name without a dot reaches callers as ``unknown.ClassName``), so a
:class:`GpushiftError` leaves as an exception whose class is named ``e.dbus_name()``
(``org.gpushift.Error.SwitchInProgress``...), with ``str(e)`` as the message.

Back (the CLI, the systemd adapter): GDBus turns a remote error into a ``GLib.Error`` whose message
reads ``GDBus.Error:NAME: message``; :func:`split_remote` takes it apart and :func:`from_dbus` picks
the gpushift class for the name, including the bus's own names for "nobody owns that name" and
"the policy refused the call".

Imports neither pydbus nor gi: it works on names and messages only.
"""

from __future__ import annotations

import functools
import re

from gpushift.errors import AccessDenied, DaemonUnavailable, GpushiftError, by_dbus_name

#: The bus's answers that mean the daemon is not (or no longer) there to answer.
DAEMON_GONE = frozenset(
    {
        "org.freedesktop.DBus.Error.ServiceUnknown",
        "org.freedesktop.DBus.Error.NameHasNoOwner",
        "org.freedesktop.DBus.Error.NoReply",
        "org.freedesktop.DBus.Error.Disconnected",
    }
)

NO_REPLY = "org.freedesktop.DBus.Error.NoReply"
#: dbus-daemon's NoReply when the callee's connection closed before it replied (it is gone, not hung).
_RECIPIENT_LEFT = re.compile(r"disconnected from message bus without replying", re.IGNORECASE)


def not_answering(why: str) -> str:
    """The message for a daemon that holds its bus name but does not reply."""
    return (
        f"the gpushift daemon is not answering: it holds its bus name but did not reply ({why}); "
        "see `systemctl status gpushift` and `journalctl -u gpushift`"
    )


#: The bus's answer when its policy refuses a call.
BUS_ACCESS_DENIED = "org.freedesktop.DBus.Error.AccessDenied"

_REMOTE_ERROR = re.compile(r"^GDBus\.Error:(?P<name>[\w.]+):\s*(?P<msg>.*)$", re.DOTALL)


@functools.cache
def _dotted(name: str) -> type[Exception]:
    return type(name, (Exception,), {})


def as_dbus_error(e: GpushiftError) -> Exception:
    """The exception a D-Bus handler raises so the caller sees ``e.dbus_name()`` and ``str(e)``."""
    return _dotted(e.dbus_name())(str(e))


def internal_error(e: BaseException) -> Exception:
    """What a handler raises for a bug: ``org.gpushift.Error.Failed``, never ``unknown.*``."""
    return _dotted(GpushiftError.dbus_name())(f"internal error: {e!r}")


def split_remote(e: BaseException) -> tuple[str | None, str]:
    """(D-Bus error name or None, message without GDBus's prefix) of a ``GLib.Error``.

    An error made on this side (a timeout, a closed connection) has no name.
    """
    message = str(getattr(e, "message", None) or e)
    m = _REMOTE_ERROR.match(message)
    if m:
        return m.group("name"), m.group("msg").strip()
    return None, message.strip()


def from_dbus(name: str | None, message: str) -> GpushiftError:
    """The gpushift error for a D-Bus error name and its message."""
    if name == NO_REPLY and not _RECIPIENT_LEFT.search(message):
        # The bus's own reply timeout: a daemon holds the name but did not answer (hung, stopped).
        return DaemonUnavailable(not_answering(f"the bus gave up waiting ({name})"))
    if name in DAEMON_GONE:
        return DaemonUnavailable(f"the gpushift daemon is not running on this bus ({name})")
    if name == BUS_ACCESS_DENIED:
        return AccessDenied(f"the bus refused the call: {message}")
    cls = by_dbus_name().get(name or "")
    if cls is not None:
        return cls(message)
    return GpushiftError(f"{name or 'D-Bus error'}: {message}")


def translate(e: BaseException) -> GpushiftError:
    """A ``GLib.Error`` from a D-Bus call → the matching gpushift error."""
    return from_dbus(*split_remote(e))

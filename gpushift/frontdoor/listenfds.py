"""The listening sockets systemd hands the front door (socket activation, sd_listen_fds(3)).

``gpushift-frontdoor.socket`` owns the listening sockets: systemd binds them once and keeps them
while the front door restarts, so a client's connection waits in the backlog instead of being
refused.  systemd passes them to the service from descriptor 3 on (``SD_LISTEN_FDS_START``), and
says so in three variables (sd_listen_fds(3)):

* ``LISTEN_PID`` -- the process they are meant for; in any other process (a child that inherited
  the environment) they are not ours, and nothing is taken;
* ``LISTEN_FDS`` -- how many, from descriptor 3 on;
* ``LISTEN_FDNAMES`` -- their names, ``:``-separated (``FileDescriptorName=`` of the socket unit;
  ``unknown`` for each when the variable is absent).

The three are unset once read (as ``sd_listen_fds(1)`` does), so a child process never takes them
for its own.  Each descriptor must be a listening stream socket (``SO_ACCEPTCONN``) of family
``AF_INET``, ``AF_INET6`` or ``AF_UNIX``; anything else is a mistake in the socket unit and is an
error that names the descriptor.  The sockets come back non-blocking and close-on-exec, ready for
asyncio (``loop.create_server(sock=...)``, aiohttp's ``SockSite``).
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import MutableMapping
from dataclasses import dataclass

#: The first descriptor systemd passes (SD_LISTEN_FDS_START).
LISTEN_FDS_START = 3
#: More than this many is not a socket unit of ours (a mistake, or an environment from elsewhere).
MAX_FDS = 64
VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
_FAMILIES = {socket.AF_INET: "AF_INET", socket.AF_INET6: "AF_INET6", socket.AF_UNIX: "AF_UNIX"}


class ListenFdsError(ValueError):
    """The sockets systemd passed cannot be used (the message names the variable or descriptor)."""


@dataclass(frozen=True)
class ListenSocket:
    """One socket systemd passed: its descriptor number as passed, its name, the socket."""

    fd: int
    name: str
    sock: socket.socket

    @property
    def address(self) -> str:
        """Where it listens, written as ``[frontdoor] listen`` writes it (``[::]:8000``, ``0.0.0.0:80``,
        a path for AF_UNIX)."""
        return sockname(self.sock)


def sockname(sock: socket.socket) -> str:
    """``HOST:PORT`` (IPv6 in brackets) of a bound socket, or its path for AF_UNIX."""
    name = sock.getsockname()
    if sock.family == socket.AF_INET6:
        return f"[{name[0]}]:{name[1]}"
    if sock.family == socket.AF_INET:
        return f"{name[0]}:{name[1]}"
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)


def listen_fds(
    environ: MutableMapping[str, str] | None = None,
    pid: int | None = None,
    start: int = LISTEN_FDS_START,
    unset: bool = True,
) -> list[ListenSocket]:
    """The sockets passed to this process, in descriptor order; ``[]`` when none are ours.

    Args:
        environ: where the variables are (default ``os.environ``); they are removed from it when
            ``unset``, whatever they said.
        pid: this process's id (default ``os.getpid()``).
        start: the first descriptor (systemd's is 3; tests pass another).

    Raises:
        ListenFdsError: ``LISTEN_FDS`` or ``LISTEN_FDNAMES`` is malformed, or a descriptor is not a
            listening stream socket of a family the front door serves.
    """
    env = os.environ if environ is None else environ
    values = {k: env.get(k) for k in VARIABLES}
    if unset:
        for k in VARIABLES:
            env.pop(k, None)
    listen_pid, count_text, names_text = values["LISTEN_PID"], values["LISTEN_FDS"], values["LISTEN_FDNAMES"]
    if listen_pid is None or count_text is None:
        return []
    me = os.getpid() if pid is None else pid
    if not listen_pid.isdigit() or int(listen_pid) != me:
        return []  # meant for another process (we inherited its environment): not ours
    count = _count(count_text)
    names = _names(names_text, count)
    return [_adopt(start + i, names[i]) for i in range(count)]


def _count(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= MAX_FDS:
        raise ListenFdsError(f"LISTEN_FDS={text!r}: expected a number of sockets from 0 to {MAX_FDS}")
    return int(text)


def _names(text: str | None, count: int) -> list[str]:
    if text is None:
        return ["unknown"] * count
    names = text.split(":") if text else []
    if len(names) != count:
        raise ListenFdsError(f"LISTEN_FDNAMES={text!r} names {len(names)} sockets, LISTEN_FDS says {count}")
    return names


def _adopt(fd: int, name: str) -> ListenSocket:
    where = f"descriptor {fd} ({name!r}) that systemd passed"
    try:
        mode = os.fstat(fd).st_mode
    except OSError as e:
        raise ListenFdsError(f"{where} is not open: {e.strerror}") from None
    if not stat.S_ISSOCK(mode):
        raise ListenFdsError(f"{where} is not a socket")
    sock = socket.socket(fileno=fd)
    try:
        if sock.family not in _FAMILIES:
            raise ListenFdsError(
                f"{where} is a socket of family {sock.family!r}, not AF_INET, AF_INET6 or AF_UNIX"
            )
        if sock.type != socket.SOCK_STREAM:
            raise ListenFdsError(f"{where} is not a stream socket (ListenStream=)")
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise ListenFdsError(f"{where} is not listening (Accept=no and ListenStream= make one that is)")
    except BaseException:
        sock.detach()  # the descriptor stays systemd's to report; not closed behind its back
        raise
    sock.set_inheritable(False)
    sock.setblocking(False)
    return ListenSocket(fd=fd, name=name, sock=sock)

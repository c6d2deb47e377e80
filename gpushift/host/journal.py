"""The journal's native protocol — one datagram to ``/run/systemd/journal/socket`` per entry.

The format (systemd's "Native Journal Protocol", https://systemd.io/JOURNAL_NATIVE_PROTOCOL/): an
entry is a run of fields; a field is ``NAME=value\\n``, or, when the value holds a newline (or is
binary), ``NAME\\n`` + the value's length as a little-endian 64-bit integer + the value + ``\\n``.
Field names are upper-case letters, digits and ``_``, do not start with a digit or ``_`` (those are
journald's own, trusted fields) and are at most 64 characters long.  An entry too large for one
datagram is written into a sealed memfd whose descriptor is sent instead (``SCM_RIGHTS``), which
is what ``sd_journal_sendv`` does too.

Whether this process's output goes to the journal at all is told by ``$JOURNAL_STREAM``
(systemd.exec(5)): ``DEVICE:INODE`` of the stream systemd connected, to be compared with what
stdout/stderr are now — a child that inherited the variable but writes to a pipe is not connected.
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import os
import re
import socket
import struct
import threading
from collections.abc import Iterable, Mapping

#: Where journald listens for native entries (the same path on every systemd since 38).
SOCKET_PATH = "/run/systemd/journal/socket"

#: journald's limit on a field name (``journal_field_valid``: at most 64 characters).
NAME_MAX = 64

_INVALID = re.compile(r"[^A-Z0-9_]")

#: A send that journald does not take within this long is given up (the caller falls back), so a
#: stalled journald cannot stall the daemon's main loop and starve its watchdog.
SEND_TIMEOUT_S = 2.0

# errno values of a datagram too large for the socket: the entry goes through a memfd instead.
_TOO_LARGE = (errno.EMSGSIZE, errno.ENOBUFS)


def field_name(key: str, prefix: str = "") -> str:
    """``prefix`` + ``key`` as a valid journal field name: upper-cased, every character outside
    ``A-Z0-9_`` replaced by ``_``, cut to 64 characters; a leading digit or ``_`` gets ``X``
    in front (journald drops such names, or reserves them for its trusted fields).

    >>> field_name("failed-phase", "GPUSHIFT_")
    'GPUSHIFT_FAILED_PHASE'
    """
    name = _INVALID.sub("_", (prefix + key).upper())
    if not name or name[0].isdigit() or name[0] == "_":
        name = "X" + name
    return name[:NAME_MAX]


def valid_name(name: str) -> bool:
    """True when journald accepts ``name`` from a client."""
    return (
        0 < len(name) <= NAME_MAX
        and _INVALID.search(name) is None
        and not name[0].isdigit()
        and not name.startswith("_")
    )


def encode(fields: Iterable[tuple[str, str | bytes]]) -> bytes:
    """The entry's bytes in the native format; a value with a newline uses the length-prefixed form.

    Raises:
        ValueError: a field name journald would reject (see :func:`valid_name`).
    """
    out = bytearray()
    for name, value in fields:
        if not valid_name(name):
            raise ValueError(f"not a valid journal field name: {name!r}")
        data = value.encode("utf-8", "replace") if isinstance(value, str) else bytes(value)
        key = name.encode("ascii")
        if b"\n" in data:
            out += key + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key + b"=" + data + b"\n"
    return bytes(out)


def connected(environ: Mapping[str, str] | None = None, fds: Iterable[int] = (2, 1)) -> bool:
    """True when stderr or stdout is still the journal stream systemd gave this process.

    ``$JOURNAL_STREAM`` is ``DEVICE:INODE`` (decimal) of that stream (systemd.exec(5)); it is inherited
    by children, so only a descriptor whose device and inode match proves the connection.
    """
    env = os.environ if environ is None else environ
    dev, sep, ino = env.get("JOURNAL_STREAM", "").partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    want = (int(dev), int(ino))
    for fd in fds:
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == want:
            return True
    return False


class JournalSocket:
    """Sends entries to journald over its native socket.

    One unconnected datagram socket, made at the first send and shared by every thread (a datagram
    is sent whole or not at all); each send names the path, so a restarted journald is found again.

    Args:
        path: the socket journald listens on (tests pass their own).
        timeout_s: how long a send may wait for room in journald's queue.
    """

    def __init__(self, path: str = SOCKET_PATH, timeout_s: float = SEND_TIMEOUT_S) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def send(self, fields: Iterable[tuple[str, str | bytes]]) -> None:
        """Send one entry.

        Raises:
            OSError: journald did not take it (no socket, refused, timed out, no memfd); the caller
                decides where the line goes instead.
            ValueError: an invalid field name.
        """
        data = encode(fields)
        sock = self._socket()
        try:
            sock.sendto(data, self.path)
        except OSError as e:
            if e.errno not in _TOO_LARGE:
                raise
            self._send_memfd(sock, data)

    def _socket(self) -> socket.socket:
        with self._lock:
            if self._sock is None:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                s.settimeout(self.timeout_s)
                self._sock = s
            return self._sock

    def _send_memfd(self, sock: socket.socket, data: bytes) -> None:
        """A large entry: written into a memfd, sealed against change, and its descriptor sent.

        journald reads a sealed memfd as the entry (systemd's journald-native.c accepts a sealed
        memfd, or a plain file it alone can read, and nothing else).
        """
        fd = os.memfd_create("gpushift-journal-entry", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            rights = array.array("i", [fd])
            sock.sendmsg([], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)], 0, self.path)
        finally:
            os.close(fd)

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.close()
                self._sock = None

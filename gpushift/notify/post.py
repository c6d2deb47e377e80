"""One HTTP POST under one deadline, no redirect followed — the webhook's transport.

:func:`post` sends a body to a URL and returns the answer's status and headers, or why none came.

* **One deadline for the whole delivery.**  ``timeout_s`` covers the name lookup, the connect, the
  TLS handshake, sending the request and reading the status line, the headers and (up to
  :data:`MAX_BODY_BYTES` of) the body.  Every socket operation gets the time that is LEFT as its
  timeout, and none starts after the deadline: a receiver that trickles one header line every few
  seconds is cut off at ``timeout_s``, not held for ever (a plain socket timeout is per read).
  The name lookup (``getaddrinfo`` has no timeout) runs on a helper thread that the POST stops
  waiting for at the deadline; at most one such lookup is left running at a time.
* **No redirect is followed.**  This is :mod:`http.client`, which never follows one: a 3xx comes
  back as a status like any other, so the body is never re-sent as a bodyless ``GET`` and the
  ``Authorization`` header never leaves for the ``Location``'s origin.
* Proxies from the environment are not used (the daemon talks to the receiver itself).
"""

from __future__ import annotations

import http.client
import io
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

#: How much of an answer's body is read (it is not used: reading it lets the receiver finish).
MAX_BODY_BYTES = 65536

#: The lookup a POST stopped waiting for, still running (at most one at a time).
_stuck_lookup: list[threading.Thread] = []


class DeadlinePassed(TimeoutError):
    """The delivery's deadline passed before it was complete."""


@dataclass
class Answer:
    """What came back: ``status`` None when no complete answer came (``error`` says why);
    ``headers`` by lower-case name."""

    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    error: str | None = None


class Deadline:
    """``timeout_s`` from now, on the monotonic clock."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.at = time.monotonic() + timeout_s

    def left(self) -> float:
        """The seconds left; raises :class:`DeadlinePassed` when none are."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise DeadlinePassed(f"no complete answer within timeout_s = {self.timeout_s:g} s")
        return left


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> Answer:
    """POST ``body`` to ``url`` (``http://`` or ``https://``, no credentials in it) with
    ``headers``; the answer, never a redirect followed.  Never raises for a network failure."""
    deadline = Deadline(timeout_s)
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = _Connection(parts.hostname or "", parts.port, parts.scheme == "https", deadline)
    try:
        conn.request("POST", target, body=body, headers={**headers, "Connection": "close"})
        resp = conn.getresponse()
        got = {k.lower(): v for k, v in resp.getheaders()}
        resp.read(MAX_BODY_BYTES)
        return Answer(int(resp.status), got)
    except TimeoutError as e:  # a socket operation's timeout is the time left: the deadline passed
        late = f"no complete answer within timeout_s = {timeout_s:g} s"
        return Answer(None, error=str(e) if isinstance(e, DeadlinePassed) else late)
    except http.client.HTTPException as e:
        return Answer(None, error=f"a malformed answer: {e or type(e).__name__}")
    except (OSError, ValueError) as e:
        return Answer(None, error=str(e) or type(e).__name__)
    finally:
        conn.close_all()


class _Connection(http.client.HTTPConnection):
    """An :class:`http.client.HTTPConnection` whose every socket operation is under ``deadline``."""

    def __init__(self, host: str, port: int | None, tls: bool, deadline: Deadline) -> None:
        default = http.client.HTTPS_PORT if tls else http.client.HTTP_PORT
        super().__init__(host, port or default, timeout=deadline.timeout_s)
        self._tls = tls
        self._deadline = deadline
        self._real: socket.socket | None = None

    def connect(self) -> None:
        sock = _connect(self.host, self.port, self._deadline)
        if self._tls:
            try:
                sock.settimeout(self._deadline.left())  # the whole handshake (CPython: one deadline)
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
            except BaseException:
                sock.close()
                raise
        self._real = sock
        self.sock = _DeadlineSocket(sock, self._deadline)

    def close_all(self) -> None:
        self.close()
        if self._real is not None:
            self._real.close()
            self._real = None


def _connect(host: str, port: int, deadline: Deadline) -> socket.socket:
    error: OSError = OSError(f"{host}: no address")
    for family, kind, proto, _, address in _lookup(host, port, deadline):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.left())
            sock.connect(address)
            return sock
        except DeadlinePassed:
            sock.close()
            raise
        except OSError as e:
            sock.close()
            error = e
    raise error


def _lookup(host: str, port: int, deadline: Deadline) -> list[Any]:
    """``getaddrinfo`` bounded by the deadline (on a helper thread: the call has no timeout)."""
    if _stuck_lookup and _stuck_lookup[0].is_alive():
        raise OSError(f"{host}: an earlier name lookup has not come back yet")
    _stuck_lookup.clear()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["found"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            box["error"] = e

    thread = threading.Thread(target=run, name="webhook-lookup", daemon=True)
    thread.start()
    thread.join(deadline.left())
    if thread.is_alive():
        _stuck_lookup.append(thread)
        deadline.left()
        raise DeadlinePassed(f"the name lookup took longer than timeout_s = {deadline.timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return list(box["found"])


class _DeadlineSocket:
    """What :class:`http.client.HTTPConnection` uses of a socket (``sendall``, ``makefile``,
    ``close``), each operation's timeout the time left.  ``close`` leaves the real socket to
    :meth:`_Connection.close_all` (http.client closes it before the body is read)."""

    def __init__(self, sock: socket.socket, deadline: Deadline) -> None:
        self._sock = sock
        self._deadline = deadline

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(self._deadline.left())  # sendall's timeout covers the whole call
        self._sock.sendall(data)

    def makefile(self, mode: str = "rb", *args: object, **kwargs: object) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def close(self) -> None:
        pass


class _DeadlineReader(io.RawIOBase):
    """The socket's bytes, each ``recv`` under the time left."""

    def __init__(self, sock: socket.socket, deadline: Deadline) -> None:
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(self._deadline.left())
        return self._sock.recv_into(buffer)

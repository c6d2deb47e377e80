"""A bounded HTTP listener for ``/metrics``: one thread, one event loop, non-blocking sockets.

A local user can open as many connections as the daemon lets them; GLib aborts the daemon in C when
a descriptor cannot be made, which no Python handler can catch.  So the listener's use of
descriptors is bounded by construction, whatever its clients do:

- at most :data:`MAX_CONNECTIONS` connections are open at once; the kernel's accept queue
  (:data:`BACKLOG`) holds the next ones, outside the daemon's descriptor table;
- with every slot taken, a new connection is accepted only by closing the oldest one that has not
  finished sending its request and has been open at least :data:`EVICT_AFTER_S` (a scrape sends
  its request at once, so an idle or slow client cannot keep Prometheus out); with none such, the
  listener stops accepting until a slot frees;
- a request's head must arrive within :data:`HEAD_DEADLINE_S` of the connection's accept, its body
  within :data:`BODY_DEADLINE_S` of the head; a response must make progress every
  :data:`SEND_IDLE_S` and be sent within :data:`SEND_DEADLINE_S`; then the connection is closed
  (written side first, the rest read for at most :data:`LINGER_S`);
- no thread per connection: the ``metrics-http`` thread runs every connection, and the WSGI
  application (prometheus-client's) on it, one request after another.

Its descriptors: the connections, the listening socket, the epoll instance and a socket pair that
wakes the loop to stop -- :data:`DESCRIPTORS` in all.
"""

from __future__ import annotations

import contextlib
import errno
import io
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from gpushift.metrics import wire

#: The most connections open at once.
MAX_CONNECTIONS = 64
#: The kernel's queue of connections not yet accepted (not the daemon's descriptors).
BACKLOG = 64
#: Seconds from a connection's accept to the end of its request's head.
HEAD_DEADLINE_S = 10.0
#: Seconds from the end of the head to the end of the body (``Content-Length``).
BODY_DEADLINE_S = 10.0
#: Seconds a response may go without a byte taken by the client.
SEND_IDLE_S = 10.0
#: Seconds to send a whole response.
SEND_DEADLINE_S = 30.0
#: Seconds a connection whose response is sent is read (and its bytes dropped) before it is closed.
LINGER_S = 2.0
#: Seconds a connection that has not sent its request is kept when every slot is taken.
EVICT_AFTER_S = 1.0
#: The most descriptors the listener holds: its connections, the listening socket, the epoll
#: instance and the wake-up socket pair.
DESCRIPTORS = MAX_CONNECTIONS + 4

#: Accepts in a row before the loop turns to its connections again.
_ACCEPT_BATCH = 16
#: Seconds without accepting after the process ran out of descriptors (or memory) in accept().
_ACCEPT_BACKOFF_S = 1.0
_OUT_OF = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)

App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

_LISTEN, _WAKE = "listen", "wake"


class _Conn:
    """One connection: its phase (``head``, ``body``, ``send``, ``linger``), what it received, what
    is left to send, and when it is closed unless it moves on."""

    __slots__ = (
        "sock",
        "peer",
        "accepted",
        "phase",
        "buf",
        "scanned",
        "request",
        "out",
        "deadline",
        "send_by",
    )

    def __init__(self, sock: socket.socket, peer: Any, now: float, head_deadline_s: float) -> None:
        self.sock = sock
        self.peer = peer
        self.accepted = now
        self.phase = "head"
        self.buf = bytearray()
        self.scanned = 0
        self.request: wire.Request | None = None
        self.out = memoryview(b"")
        self.deadline = now + head_deadline_s
        self.send_by = 0.0


class Listener:
    """Binds ``host``:``port`` at once (OSError when it cannot) and, once :meth:`start` ed, serves
    ``app`` (a WSGI application) under the bounds above; the deadlines may be given shorter (tests).

    Args:
        host, port: where to listen (the address family from ``getaddrinfo``, as prometheus-client's
            server chose it; port 0: any free one, see :attr:`server_address`).
        app: the WSGI application that answers every request that passes.
        on_error: called with a line of text when the application or the loop fails.
    """

    def __init__(
        self,
        host: str,
        port: int,
        app: App,
        on_error: Callable[[str], None] | None = None,
        *,
        head_deadline_s: float = HEAD_DEADLINE_S,
        body_deadline_s: float = BODY_DEADLINE_S,
        send_idle_s: float = SEND_IDLE_S,
        send_deadline_s: float = SEND_DEADLINE_S,
    ) -> None:
        self._app = app
        self._on_error = on_error
        self._head_s, self._body_s = head_deadline_s, body_deadline_s
        self._idle_s, self._send_s = send_idle_s, send_deadline_s
        self._sock = _bind(host, port)
        self.server_address: tuple[Any, ...] = self._sock.getsockname()
        self._conns: dict[int, _Conn] = {}  # by descriptor, oldest first
        self._listening = False
        self._resume_at = 0.0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._sel: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start serving on the ``metrics-http`` thread; returns at once."""
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._listen()
        self._thread = threading.Thread(target=self._serve, name="metrics-http", daemon=True)
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving: every connection and the listening socket closed, the thread ended."""
        self._stopping = True
        if self._thread is None:
            self._sock.close()
            return
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
        self._thread.join(timeout_s)

    @property
    def connections(self) -> int:
        """How many connections are open now."""
        return len(self._conns)

    # ------------------------------------------------------------------ the loop

    def _serve(self) -> None:
        sel = self._sel
        assert sel is not None
        try:
            while not self._stopping:
                for key, mask in sel.select(self._timeout(time.monotonic())):
                    if key.data is _LISTEN:
                        self._accept()
                    elif isinstance(key.data, _Conn):
                        self._event(key.data, mask)
                now = time.monotonic()
                for conn in [c for c in self._conns.values() if now >= c.deadline]:
                    self._drop(conn)
                self._maybe_listen(now)
        except Exception as e:  # the thread's edge: a bug ends the listener, logged; the daemon goes on
            self._error(f"metrics listener stopped: {e!r}")
        finally:
            self._close_all()

    def _timeout(self, now: float) -> float:
        due = [c.deadline for c in self._conns.values()]
        if not self._listening:
            due.append(self._resume_at)
        return max(0.0, min([now + 5.0, *due]) - now)

    def _event(self, conn: _Conn, mask: int) -> None:
        try:
            if mask & selectors.EVENT_WRITE and conn.phase == "send":
                self._send(conn)
            elif mask & selectors.EVENT_READ:
                self._receive(conn)
        except Exception as e:  # one connection's failure closes it, not the listener
            self._error(f"metrics connection: {e!r}")
            self._drop(conn)

    # ------------------------------------------------------------------ accepting

    def _listen(self) -> None:
        assert self._sel is not None
        if not self._listening:
            self._sel.register(self._sock, selectors.EVENT_READ, _LISTEN)
            self._listening = True

    def _pause(self, resume_at: float) -> None:
        assert self._sel is not None
        if self._listening:
            self._sel.unregister(self._sock)
            self._listening = False
        self._resume_at = resume_at

    def _maybe_listen(self, now: float) -> None:
        if self._listening or self._stopping or now < self._resume_at:
            return
        if len(self._conns) < MAX_CONNECTIONS or self._evictable(now) is not None:
            self._listen()
        else:
            self._pause(self._next_evictable())

    def _evictable(self, now: float) -> _Conn | None:
        """The oldest connection that has not sent its request and may be closed for a new one."""
        for c in self._conns.values():
            if c.phase in ("head", "body"):
                return c if now - c.accepted >= EVICT_AFTER_S else None
        return None

    def _next_evictable(self) -> float:
        c = next((c for c in self._conns.values() if c.phase in ("head", "body")), None)
        return c.accepted + EVICT_AFTER_S if c is not None else float("inf")

    def _accept(self) -> None:
        assert self._sel is not None
        for _ in range(_ACCEPT_BATCH):
            now = time.monotonic()
            if len(self._conns) >= MAX_CONNECTIONS:
                oldest = self._evictable(now)
                if oldest is None:
                    self._pause(self._next_evictable())
                    return
                self._drop(oldest)
            try:
                sock, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _OUT_OF:
                    self._error(f"metrics listener: accept: {e.strerror or e}")
                    self._pause(now + _ACCEPT_BACKOFF_S)
                    return
                continue  # a connection reset before it was accepted
            sock.setblocking(False)
            conn = _Conn(sock, peer, now, self._head_s)
            self._conns[sock.fileno()] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    # ------------------------------------------------------------------ one connection

    def _receive(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client closed (or reset) its side
            self._drop(conn)
            return
        if conn.phase == "linger":
            return
        conn.buf += data
        now = time.monotonic()
        if conn.phase == "head":
            end = wire.head_end(conn.buf, max(0, conn.scanned - 3))
            conn.scanned = len(conn.buf)
            if end is None and len(conn.buf) <= wire.MAX_HEAD_BYTES:
                return
            parsed = wire.parse_head(bytes(conn.buf[: end or len(conn.buf)]))
            if isinstance(parsed, wire.Refusal):
                self._respond(conn, wire.refusal_response(parsed), now)
                return
            assert parsed is not None
            conn.request, conn.phase = parsed, "body"
            conn.deadline = now + self._body_s
        request = conn.request
        if (
            conn.phase == "body"
            and request is not None
            and len(conn.buf) >= request.head_length + request.body_length
        ):
            self._respond(conn, self._answer(conn, request), now)

    def _answer(self, conn: _Conn, request: wire.Request) -> bytes:
        body = bytes(conn.buf[request.head_length : request.head_length + request.body_length])
        conn.buf = bytearray()
        got: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            got[:] = [status, headers]
            return lambda _data: None

        try:
            result = self._app(_environ(request, body, self.server_address, conn.peer), start_response)
            try:
                out = b"".join(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        except Exception as e:
            self._error(f"metrics: rendering failed: {e!r}")
            return wire.refusal_response(wire.Refusal("500 Internal Server Error", "the exposition failed"))
        status, headers = got
        return wire.response(status, headers, out, head_only=request.method == "HEAD")

    def _respond(self, conn: _Conn, data: bytes, now: float) -> None:
        assert self._sel is not None
        conn.phase, conn.out = "send", memoryview(data)
        conn.send_by = now + self._send_s
        conn.deadline = min(conn.send_by, now + self._idle_s)
        self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._send(conn)

    def _send(self, conn: _Conn) -> None:
        assert self._sel is not None
        try:
            n = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        now = time.monotonic()
        conn.out = conn.out[n:]
        if conn.out:
            conn.deadline = min(conn.send_by, now + self._idle_s)
            return
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(conn)
            return
        conn.phase, conn.deadline = "linger", now + LINGER_S
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _drop(self, conn: _Conn) -> None:
        assert self._sel is not None
        if self._conns.pop(conn.sock.fileno(), None) is None:
            return
        self._sel.unregister(conn.sock)
        conn.sock.close()
        self._resume_at = 0.0  # a slot is free (or a descriptor): accept again

    def _close_all(self) -> None:
        for conn in list(self._conns.values()):
            self._drop(conn)
        if self._sel is not None:
            self._sel.close()
        for s in (self._sock, self._wake_r, self._wake_w):
            if s is not None:
                s.close()

    def _error(self, text: str) -> None:
        if self._on_error is not None:
            self._on_error(text)


def _bind(host: str, port: int) -> socket.socket:
    """A listening, non-blocking socket on ``host``:``port`` (the family ``getaddrinfo`` gives first)."""
    family, _, _, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _environ(request: wire.Request, body: bytes, server: tuple[Any, ...], peer: Any) -> dict[str, Any]:
    """The WSGI environ (PEP 3333) of ``request``."""
    env: dict[str, Any] = {
        "REQUEST_METHOD": request.method,
        "SCRIPT_NAME": "",
        "PATH_INFO": request.path,
        "QUERY_STRING": request.query,
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": request.version,
        "REMOTE_ADDR": str(peer[0]) if isinstance(peer, tuple) and peer else "",
        "CONTENT_LENGTH": str(request.body_length) if request.body_length else "",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for name, value in request.headers:
        key = name.upper().replace("-", "_")
        if key == "CONTENT_TYPE":
            env[key] = value
        elif key != "CONTENT_LENGTH":
            env.setdefault(f"HTTP_{key}", value)  # the first of a repeated header
    return env

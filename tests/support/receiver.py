"""A real local HTTP receiver for webhook tests: records every POST, answers as scripted.

``Receiver(port=0).start()`` listens on 127.0.0.1 on a thread of the test's process; ``stop()``
ends it, and ``start()`` again listens on the same port (a receiver that was down comes back).
``script`` is a list of answers used in order, each ``(status, headers)``; once it is used up every
POST gets 200.  ``requests`` records every request of any method (a redirected client's ``GET``
too), ``posts`` the POSTs.

:class:`Trickler` is a receiver that never finishes its answer: after the request it sends the
status line, then one header line every ``interval_s`` (a slow-header attack on the sender).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Post:
    path: str
    headers: dict[str, str]
    body: Any
    at: float  # time.monotonic() when it arrived
    status: int


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]


@dataclass
class Receiver:
    port: int = 0
    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    posts: list[Post] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def parse_request(self) -> bool:
                ok = super().parse_request()
                if ok:
                    with receiver._arrived:
                        receiver.requests.append(Request(self.command, self.path, dict(self.headers)))
                        receiver._arrived.notify_all()
                return ok

            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_HEAD = do_PUT = do_DELETE = do_PATCH = do_GET  # noqa: N815

            def do_POST(self) -> None:  # noqa: N802
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body: Any = json.loads(data)
                except ValueError:
                    body = data.decode("utf-8", "replace")
                with receiver._arrived:
                    status, headers = receiver.script.pop(0) if receiver.script else (200, {})
                    receiver.posts.append(Post(self.path, dict(self.headers), body, time.monotonic(), status))
                    receiver._arrived.notify_all()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a: object) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, name="receiver", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def delivered(self) -> list[Any]:
        """The bodies of the POSTs that were answered 2xx, in arrival order."""
        with self._lock:
            return [p.body for p in self.posts if 200 <= p.status < 300]

    def wait(self, n: int, timeout_s: float) -> list[Any]:
        """Wait until ``n`` documents were delivered (2xx); their bodies.  AssertionError after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while True:
                got = [p.body for p in self.posts if 200 <= p.status < 300]
                if len(got) >= n:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"{len(got)} of {n} documents delivered after {timeout_s:g} s: {self.posts}"
                    )
                self._arrived.wait(left)


@dataclass
class Trickler:
    """A receiver on 127.0.0.1 that reads the request, sends ``HTTP/1.1 200 OK`` and then one
    header line every ``interval_s``, never the blank line that ends the headers (at most
    ``max_lines``).  ``ended`` holds, per connection, the ``time.monotonic()`` seconds from its
    accept until the client closed it (None while it is open)."""

    port: int = 0
    interval_s: float = 2.0
    max_lines: int = 60
    accepted: list[float] = field(default_factory=list)
    ended: list[float | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Trickler:
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", self.port))
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        threading.Thread(target=self._accept, name="trickler", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _accept(self) -> None:
        listener = self._sock
        while listener is not None and not self._stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.accepted.append(time.monotonic())
                self.ended.append(None)
                i = len(self.ended) - 1
            threading.Thread(target=self._trickle, args=(conn, i), name="trickle", daemon=True).start()

    def _trickle(self, conn: socket.socket, i: int) -> None:
        with conn:
            conn.settimeout(0.2)
            with contextlib.suppress(TimeoutError, OSError):
                conn.recv(65536)  # the request (small: one document)
            try:
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                for n in range(self.max_lines):
                    if self._wait_for_close(conn, self.interval_s):
                        break
                    conn.sendall(f"X-Slow-{n}: {n}\r\n".encode())
            except OSError:
                pass
            with self._lock:
                self.ended[i] = time.monotonic() - self.accepted[i]

    def _wait_for_close(self, conn: socket.socket, seconds: float) -> bool:
        """Wait ``seconds``; True as soon as the client closed the connection (or on stop)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._stop.is_set():
                return True
            try:
                if conn.recv(65536) == b"":
                    return True
            except TimeoutError:
                continue
        return False

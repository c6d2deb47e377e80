"""A real local HTTP receiver for webhook tests: records every POST, answers as scripted.

``Receiver(port=0).start()`` listens on 127.0.0.1 on a thread of the test's process; ``stop()``
ends it, and ``start()`` again listens on the same port (a receiver that was down comes back).
``script`` is a list of answers used in order, each ``(status, headers)``; once it is used up every
POST gets 200.
"""

from __future__ import annotations

import json
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
class Receiver:
    port: int = 0
    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    posts: list[Post] = field(default_factory=list)

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

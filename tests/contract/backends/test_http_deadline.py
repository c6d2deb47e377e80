"""Every HTTP probe (health, version URL, in-flight requests) ends by its deadline, whatever the
server does: a real local TCP server that answers one byte every 0.3 s (a per-read timeout never
fires on it), one that never answers, one that sends an endless body.  Also: chunked answers,
and credentials in the URL go out as Basic authentication, never in the request line."""

from __future__ import annotations

import base64
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from gpushift.backends import probe as http_probe
from gpushift.backends.probe import HttpBackendProbe
from gpushift.config.schema import parse

T = TypeVar("T")
Responder = Callable[[socket.socket, threading.Event], None]
TRICKLE_S = 0.3
SLACK_S = 0.5  # a probe gives up within its deadline plus this


class RawServer:
    """A TCP server on 127.0.0.1 whose answer to each request is ``respond(conn, stop)``."""

    def __init__(self, respond: Responder) -> None:
        self.respond = respond
        self.stop = threading.Event()
        self.requests: list[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.threads: list[threading.Thread] = []
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def url(self, path: str = "/health", userinfo: str = "") -> str:
        return f"http://{userinfo}127.0.0.1:{self.port}{path}"

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            data = b""
            try:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    data += chunk
                self.requests.append(data)
                self.respond(conn, self.stop)
            except OSError:
                pass  # the client gave up and closed: expected

    def close(self) -> None:
        self.stop.set()
        self.acceptor.join(5)
        for t in self.threads:
            t.join(5)
        self.sock.close()


def trickle(answer: bytes) -> Responder:
    def respond(conn: socket.socket, stop: threading.Event) -> None:
        for i in range(len(answer)):
            if stop.wait(TRICKLE_S):
                return
            conn.sendall(answer[i : i + 1])

    return respond


OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n{"status":"ok"}'


Serve = Callable[[Responder], "RawServer"]


@pytest.fixture
def serve() -> Iterator[Serve]:
    made: list[RawServer] = []

    def make(respond: Responder) -> RawServer:
        s = RawServer(respond)
        made.append(s)
        return s

    try:
        yield make
    finally:
        for s in made:
            s.close()


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    t0 = time.monotonic()
    value = fn()
    return time.monotonic() - t0, value


def test_http_probe_health_gives_up_at_its_deadline_on_a_trickling_server(serve: Serve) -> None:
    srv = serve(trickle(OK))  # 80 bytes, one every 0.3 s: 24 s in all
    took, h = timed(lambda: HttpBackendProbe().health(srv.url(), 2.0))
    assert took < 2.0 + SLACK_S, f"held {took:.1f} s by a server trickling its answer"
    assert not h.ok and h.status is None and "no answer" in h.detail and "2 s" in h.detail


def test_http_probe_trickled_body_after_headers_also_ends_at_the_deadline(serve: Serve) -> None:
    def respond(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        trickle(b"x" * 1000)(conn, stop)

    srv = serve(respond)
    took, h = timed(lambda: HttpBackendProbe().health(srv.url(), 1.5))
    assert took < 1.5 + SLACK_S and not h.ok


def test_http_probe_version_url_gives_up_at_its_deadline(serve: Serve) -> None:
    srv = serve(trickle(b'HTTP/1.1 200 OK\r\nContent-Length: 19\r\n\r\n{"version":"0.9.0"}'))
    took, v = timed(lambda: HttpBackendProbe().version(srv.url("/version"), None, timeout_s=1.5))
    assert took < 1.5 + SLACK_S
    assert v.version is None and v.source == "url" and "within 1.5 s" in v.raw


def test_http_probe_in_flight_gives_up_at_its_deadline(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_probe, "IN_FLIGHT_TIMEOUT_S", 1.5)
    srv = serve(trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\nvllm:num_requests_running 2.0\n"))
    cfg = parse(f'[backends.day]\nkind = "vllm"\nunit = "d.service"\nhealth_url = "{srv.url()}"\n')
    took, n = timed(lambda: HttpBackendProbe().in_flight(cfg.backends["day"]))
    assert took < 1.5 + SLACK_S and n is None


def test_http_probe_server_that_accepts_and_never_answers(serve: Serve) -> None:
    def hang(conn: socket.socket, stop: threading.Event) -> None:
        stop.wait(30)

    srv = serve(hang)
    took, h = timed(lambda: HttpBackendProbe().health(srv.url(), 1.0))
    assert took < 1.0 + SLACK_S and not h.ok


def test_http_probe_endless_body_is_read_up_to_the_bound_only(serve: Serve) -> None:
    def respond(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")  # no length: the body would end when the server closes
        block = b"x" * 65536
        while not stop.is_set():
            conn.sendall(block)

    srv = serve(respond)
    took, h = timed(lambda: HttpBackendProbe().health(srv.url(), 5.0))
    assert took < 2.0 and h.ok


def test_http_probe_chunked_answer_is_decoded(serve: Serve) -> None:
    def respond(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b'd\r\n{"version": "\r\n7;ext=1\r\n0.11.0"\r\n1\r\n}\r\n0\r\n\r\n'
        )
        stop.wait(30)  # keeps the connection open: the last chunk, not the close, ends the body

    srv = serve(respond)
    took, v = timed(lambda: HttpBackendProbe().version(srv.url("/version"), None, timeout_s=3.0))
    assert v.version == "0.11.0" and took < 1.0


def test_http_probe_url_credentials_go_as_basic_auth_not_in_the_request_line(serve: Serve) -> None:
    srv = serve(lambda conn, stop: conn.sendall(OK))
    assert HttpBackendProbe().health(srv.url("/health", "probe:s3cr%40t@"), 2.0).ok
    (req,) = srv.requests
    assert req.startswith(b"GET /health HTTP/1.1\r\n") and b"s3cr" not in req.split(b"\r\n")[0]
    assert b"Authorization: Basic " + base64.b64encode(b"probe:s3cr@t") in req


def test_http_probe_version_that_is_not_utf8_is_kept_replaced_never_fatal(serve: Serve) -> None:
    body = b'{"version": "0.9.0\xff\xfe\\u001b[31m"}'
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
    srv = serve(lambda conn, stop: conn.sendall(head + body))
    v = HttpBackendProbe().version(srv.url("/version"), None, timeout_s=2.0)
    assert v.version == "0.9.0\ufffd\ufffd\x1b[31m"  # kept as sent; escaped only where shown
    cmd = ["printf", "\\377\\376 build\\nversion: 7312 (\\033]0;title\\007)\\n"]
    c = HttpBackendProbe().version(None, cmd)
    assert c.version == "7312 (\x1b]0;title\x07)" and c.source == "command"

"""The bounded /metrics listener against real sockets: it never holds more than its descriptors
(:data:`~gpushift.metrics.listener.DESCRIPTORS`, at most half of the unit's ``LimitNOFILE=``)
however many clients connect, never starts a thread per connection, closes slow and idle clients
at its deadlines, lets a scrape in while idle connections take every slot, answers what it cannot
serve with an error, and serves prometheus-client's exposition as prometheus-client's own server
did (content negotiation, gzip, ``name[]``, OPTIONS, 405)."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest, make_wsgi_app

from gpushift.metrics import listener as lst
from gpushift.metrics.listener import Listener

REPO = Path(__file__).resolve().parents[3]

#: argv: port count.  Opens ``count`` connections to 127.0.0.1:port, 20 every 0.05 s (a burst would
#: overflow the accept queue), never sends a byte, and holds them until ended.
HOLDER = r"""
import socket, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
held = []
for i in range(count):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    held.append(s)
    if i % 20 == 19:
        time.sleep(0.05)
time.sleep(3600)
"""


def registry() -> CollectorRegistry:
    r = CollectorRegistry()
    c = Counter("demo_events", "Events seen.", ["kind"], registry=r)
    c.labels("a").inc(3)
    c.labels("b").inc()
    return r


@pytest.fixture
def serve() -> Iterator[Callable[..., Listener]]:
    """``serve(app=None, **deadlines)``: a started listener on a free loopback port, closed after."""
    made: list[Listener] = []

    def start(app: Any = None, **kw: Any) -> Listener:
        server = Listener("127.0.0.1", 0, app or make_wsgi_app(registry()), **kw)
        made.append(server)
        server.start()
        return server

    yield start
    for s in made:
        s.close()


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait(10)


def port(server: Listener) -> int:
    return int(server.server_address[1])


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)
    return value


def exchange(p: int, data: bytes, timeout_s: float = 20) -> bytes:
    """Send ``data``, read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", p), timeout=timeout_s) as s:
        s.sendall(data)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def closed_after(s: socket.socket, timeout_s: float) -> float:
    """Seconds until the server closes ``s`` (EOF or reset), reading and dropping what it sends."""
    t0 = time.monotonic()
    s.settimeout(timeout_s)
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def unit_nofile() -> int:
    for line in (REPO / "units" / "gpushift.service").read_text().splitlines():
        if line.startswith("LimitNOFILE="):
            return int(line.split("=", 1)[1].split(":")[0])
    raise AssertionError("units/gpushift.service sets no LimitNOFILE=")


def test_the_listeners_descriptors_are_at_most_half_of_the_units_limit() -> None:
    assert lst.DESCRIPTORS == lst.MAX_CONNECTIONS + 4
    assert unit_nofile() // 2 >= lst.DESCRIPTORS, (lst.DESCRIPTORS, unit_nofile())


def test_a_flood_of_idle_connections_holds_at_most_its_descriptors_and_a_scrape_still_answers(
    serve: Callable[..., Listener], holders: list[subprocess.Popen[bytes]]
) -> None:
    before, threads = fds(), threading.active_count()
    server = serve()
    holder = subprocess.Popen(  # no pipe: every descriptor this process gains is the listener's
        [sys.executable, "-c", HOLDER, str(port(server)), "400"], stdout=subprocess.DEVNULL
    )
    holders.append(holder)
    wait_for(lambda: server.connections == lst.MAX_CONNECTIONS, 20, "every slot to be taken")
    most = 0
    for _ in range(20):
        most = max(most, fds() - before)
        assert server.connections <= lst.MAX_CONNECTIONS
        time.sleep(0.05)
    assert most <= lst.DESCRIPTORS, most
    assert threading.active_count() == threads + 1  # the loop's thread, none per connection
    # The oldest idle connection gives its slot to the scrape (they have been open over 1 s).
    with urllib.request.urlopen(f"http://127.0.0.1:{port(server)}/metrics", timeout=30) as r:
        assert 'demo_events_total{kind="a"} 3.0' in r.read().decode()
    assert fds() - before <= lst.DESCRIPTORS


def test_a_slow_header_client_is_closed_at_the_head_deadline(serve: Callable[..., Listener]) -> None:
    server = serve(head_deadline_s=1.0)
    t0 = time.monotonic()  # before the connect: the deadline runs from the accept, which comes after
    s = socket.create_connection(("127.0.0.1", port(server)))
    try:
        for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\nX: " + b"y" * 100:
            s.send(bytes([b]))
            time.sleep(0.1)
            s.setblocking(False)
            try:
                if s.recv(1) == b"":
                    break
            except BlockingIOError:
                continue
            except ConnectionResetError:
                break
            finally:
                s.setblocking(True)
        else:
            pytest.fail("the slow client was never closed")
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        s.close()
    assert time.monotonic() - t0 >= 1.0
    wait_for(lambda: server.connections == 0, 10, "the connection to be gone")


def test_a_silent_client_and_a_short_body_are_closed_at_their_deadlines(
    serve: Callable[..., Listener],
) -> None:
    server = serve(head_deadline_s=1.0, body_deadline_s=1.0)
    # The head's deadline runs from the accept, which cannot come before the connect began: the
    # close is measured from there (closed_after's own clock starts later, after the other client).
    connecting = time.monotonic()
    idle = socket.create_connection(("127.0.0.1", port(server)))
    short = socket.create_connection(("127.0.0.1", port(server)))
    try:
        short.sendall(b"POST /metrics HTTP/1.1\r\nContent-Length: 100\r\n\r\n0123456789")
        assert closed_after(idle, 20) < 20
        assert time.monotonic() - connecting >= 1.0
        assert closed_after(short, 20) < 20
    finally:
        idle.close()
        short.close()
    wait_for(lambda: server.connections == 0, 10, "the connections to be gone")


def test_a_client_that_stops_reading_is_closed_at_the_send_deadline(serve: Callable[..., Listener]) -> None:
    big = b"x" * (64 << 20)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [big]

    server = serve(app, send_idle_s=1.0)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port(server)))
    try:
        wait_for(lambda: server.connections == 1, 10, "the connection to be accepted")
        s.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        wait_for(lambda: server.connections == 0, 20, "the stalled response's connection to be closed")
        got = 0
        s.settimeout(10)
        try:
            while chunk := s.recv(1 << 20):
                got += len(chunk)
        except ConnectionResetError:
            pass
        assert got < len(big)
    finally:
        s.close()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"nonsense\r\n\r\n", b"400 Bad Request"),
        (b"GET /metrics HTTP/1.1\r\nbad header\r\n\r\n", b"400 Bad Request"),
        (b"GET /metrics HTTP/1.1\r\nX: " + b"y" * 20000 + b"\r\n\r\n", b"431 "),
        (b"POST /metrics HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n", b"413 "),
        (b"POST /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", b"501 "),
        (b"GET /metrics HTTP/2.0\r\n\r\n", b"505 "),
    ],
)
def test_a_request_it_cannot_serve_is_answered_with_an_error_and_closed(
    serve: Callable[..., Listener], request_bytes: bytes, status: bytes
) -> None:
    server = serve()
    out = exchange(port(server), request_bytes)
    assert out.startswith(b"HTTP/1.1 " + status), out[:200]
    assert b"\r\nConnection: close\r\n" in out
    wait_for(lambda: server.connections == 0, 10, "the connection to be gone")


def test_the_exposition_is_prometheus_clients_as_its_own_server_served_it(
    serve: Callable[..., Listener],
) -> None:
    reg = registry()
    server = serve(make_wsgi_app(reg))
    url = f"http://127.0.0.1:{port(server)}"
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert r.read() == generate_latest(reg)
    req = urllib.request.Request(f"{url}/metrics", headers={"Accept": "application/openmetrics-text"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text")
        assert r.read().endswith(b"# EOF\n")
    req = urllib.request.Request(
        f"{url}/metrics?name[]=demo_events_total", headers={"Accept-Encoding": "gzip"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        assert b'demo_events_total{kind="b"} 1.0' in gzip.decompress(r.read())
    out = exchange(port(server), b"OPTIONS /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 OK\r\n") and b"Allow: OPTIONS,GET\r\n" in out
    out = exchange(port(server), b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc")
    assert out.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n") and out.endswith(b"use OPTIONS or GET\n")
    out = exchange(port(server), b"HEAD /metrics HTTP/1.1\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 405 ") and out.endswith(b"\r\n\r\n")  # no body to a HEAD


def test_an_exposition_that_fails_is_a_500_and_the_listener_goes_on(serve: Callable[..., Listener]) -> None:
    errors: list[str] = []
    calls = []

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        calls.append(environ["PATH_INFO"])
        if len(calls) == 1:
            raise RuntimeError("collector broke")
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok\n"]

    server = Listener("127.0.0.1", 0, app, errors.append)
    server.start()
    try:
        assert exchange(port(server), b"GET /a HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 500 ")
        assert exchange(port(server), b"GET /b HTTP/1.1\r\n\r\n").endswith(b"\r\n\r\nok\n")
    finally:
        server.close()
    assert calls == ["/a", "/b"] and errors == ["metrics: rendering failed: RuntimeError('collector broke')"]


def test_close_ends_the_thread_and_every_connection(serve: Callable[..., Listener]) -> None:
    before = fds()
    server = Listener("127.0.0.1", 0, make_wsgi_app(registry()))
    p = port(server)
    server.start()
    idle = socket.create_connection(("127.0.0.1", p))
    try:
        wait_for(lambda: server.connections == 1, 10, "the connection to be accepted")
        server.close()
        assert "metrics-http" not in {t.name for t in threading.enumerate()}
        assert closed_after(idle, 10) < 10
    finally:
        idle.close()
    assert fds() == before
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", p), timeout=5).close()

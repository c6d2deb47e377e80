"""Hostile clients against the real front door (issue 19 item 8): a head that never finishes (closed
after header_timeout_s with a 408), a body that never finishes (408), bodies over max_body_bytes
(413, by Content-Length, chunked, or with Expect), malformed JSON (400, or passed on unchanged where
the route takes anything), a model that is not a string (400), garbage and oversized heads, 2,000
idle connections, more connections than max_connections, a held client that goes away — and in
each, a normal client's request still goes through."""

from __future__ import annotations

import json
import re
import resource
import socket
import sys
import time

from tests.support.frontdoor_rig import DAY, NIGHT, Door, answer, nothing_yet, send, wait_for

#: argv: port count.  Opens ``count`` connections to 127.0.0.1:port (20 every 0.02 s: a burst would
#: overflow the accept queue), never sends a byte, prints "open" and holds them until ended.
HOLDER = r"""
import resource, socket, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 64)), hard))
held = []
for i in range(count):
    s = socket.socket()
    s.connect(("127.0.0.1", port))
    held.append(s)
    if i % 20 == 19:
        time.sleep(0.02)
print("open", flush=True)
time.sleep(3600)
"""


def normal(door: Door) -> None:
    """A normal client's request goes through."""
    status, _, body = answer(send(door, "POST", "/v1/chat/completions", {"model": DAY}))
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "from day"


def closed_by_peer(c: socket.socket) -> bytes:
    """Everything ``c`` receives until the front door closes it."""
    got = b""
    while True:
        chunk = c.recv(65536)
        if not chunk:
            return got
        got += chunk


def test_a_head_that_never_finishes_is_closed_after_header_timeout_s(door_factory) -> None:
    door = door_factory(header_timeout_s=0.5)
    slow = [door.connect() for _ in range(3)]
    slow[0].sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")  # stops mid-header
    slow[1].sendall(b"GE")  # stops mid-line
    started = time.monotonic()  # slow[2] sends nothing at all
    normal(door)
    for c in slow:
        got = closed_by_peer(c)
        assert got.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), got
        assert b'"code": "request_timeout"' in got
    assert time.monotonic() - started >= 0.4  # not before its deadline (less the connect's own time)
    normal(door)


def test_a_kept_alive_connection_gets_the_head_deadline_for_each_request(door_factory) -> None:
    door = door_factory(header_timeout_s=0.5)
    c = door.connect()
    c.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    first = c.recv(65536)
    assert first.startswith(b"HTTP/1.1 200")
    time.sleep(0.7)  # idle between requests: idle_timeout_s applies, not the head's deadline
    c.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")  # a head it never finishes
    assert closed_by_peer(c).startswith(b"HTTP/1.1 408")


def test_a_body_that_never_finishes_is_a_408(door_factory) -> None:
    door = door_factory(body_timeout_s=0.5)
    c = door.connect()
    c.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"model": ')
    normal(door)
    got = closed_by_peer(c)
    assert got.startswith(b"HTTP/1.1 408"), got
    assert not [s for s in door.day.seen if s.path == "/v1/completions"]


def test_bodies_over_max_body_bytes_are_413(door_factory) -> None:
    door = door_factory(max_body_bytes=4096)
    big = json.dumps({"model": DAY, "prompt": "x" * 5000}).encode()
    c = door.connect()  # by Content-Length, answered before the body is read
    c.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(big)).encode() + b"\r\n\r\n"
    )
    got = closed_by_peer(c)
    assert got.startswith(b"HTTP/1.1 413") and b"max_body_bytes" in got
    c = door.connect()  # chunked: counted as it arrives
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    for i in range(0, len(big), 1000):
        part = big[i : i + 1000]
        c.sendall(f"{len(part):x}\r\n".encode() + part + b"\r\n")
    c.sendall(b"0\r\n\r\n")
    assert closed_by_peer(c).startswith(b"HTTP/1.1 413")
    c = door.connect()  # Expect: 100-continue: the 413 instead of the 100
    c.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 99999999\r\n\r\n"
    )
    assert closed_by_peer(c).startswith(b"HTTP/1.1 413")
    status, _, _ = answer(send(door, "POST", "/v1/completions", {"model": DAY, "prompt": "x" * 3000}))
    assert status == 200  # under the bound
    assert not [s for s in door.day.seen if len(s.body) > 4096]


def test_expect_100_continue_under_the_bound_is_answered_then_forwarded(door_factory) -> None:
    door = door_factory()
    body = json.dumps({"model": DAY}).encode()
    c = door.connect()
    c.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
    )
    assert c.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
    c.sendall(body)
    status, _, got = answer(c)
    assert status == 200 and door.day.seen[-1].body == body and not door.day.header(-1, "Expect")


def test_malformed_json_and_a_model_that_is_not_a_string(door_factory) -> None:
    door = door_factory()
    c = door.connect()
    c.sendall(
        b'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n{"model":'
    )
    status, _, body = answer(c)
    err = json.loads(body)["error"]
    assert status == 400 and err["code"] == "invalid_json" and "not valid JSON" in err["message"]
    # a route that takes anything: passed on unchanged, as naming no model
    c = door.connect()
    c.sendall(
        b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n{bad!"
    )
    status, _, body = answer(c)
    assert status == 200 and door.day.seen[-1].body == b"{bad!"
    for bad in (7, None, ["a"], {"x": 1}, True):
        status, _, body = answer(send(door, "POST", "/v1/chat/completions", {"model": bad, "messages": []}))
        if bad is None:
            assert status == 200  # null: names no model
            continue
        err = json.loads(body)["error"]
        assert (status, err["param"], err["code"], err["type"]) == (
            400,
            "model",
            "invalid_model",
            "invalid_request_error",
        )
    normal(door)


def test_garbage_and_oversized_heads_get_an_error_not_a_crash(door_factory) -> None:
    door = door_factory()
    for raw in (
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS ClientHello
        b"GET /v1/models HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
        b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(300)) + b"\r\n",
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nabcdef",
        b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
    ):
        c = door.connect()
        c.sendall(raw)
        got = closed_by_peer(c)
        assert re.match(rb"HTTP/1\.[01] 4\d\d ", got), (raw[:40], got[:80])
        assert b'{"error": {"message": "the request could not be read: ' in got, got
    normal(door)


def raise_fd_limit(need: int) -> None:
    """This process serves the connections itself: a soft limit of 1024 (CI's) would not hold them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        assert hard >= need, f"RLIMIT_NOFILE hard limit {hard} < {need}: the test needs {need} descriptors"
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def test_2000_idle_connections_and_a_normal_request_still_answered(door_factory, procs) -> None:
    raise_fd_limit(4096 + 512)
    door = door_factory(header_timeout_s=120)
    holder = procs.start([sys.executable, "-c", HOLDER, str(door.port), "2000"])
    assert holder.stdout is not None and holder.stdout.readline().strip() == "open", (
        holder.stderr.read() if holder.stderr else ""
    )
    server = door.fd._network.server  # type: ignore[union-attr]
    wait_for(lambda: len(server.connections) >= 2000, "2000 connections accepted")
    normal(door)
    status, _, body = answer(send(door, "GET", "/v1/models"))
    assert status == 200 and json.loads(body)["data"][0]["id"] == DAY


def test_beyond_max_connections_a_connection_waits_for_a_free_one(door_factory) -> None:
    door = door_factory(max_connections=16, header_timeout_s=120)
    idle = [door.connect() for _ in range(16)]
    server = door.fd._network.server  # type: ignore[union-attr]
    wait_for(lambda: len(server.connections) == 16, "16 connections accepted")
    waiting = send(door, "GET", "/v1/models")  # connected in the backlog, not accepted yet
    assert nothing_yet(waiting, 0.5)
    idle.pop().close()
    status, _, _ = answer(waiting)
    assert status == 200
    for c in idle:
        c.close()


def test_a_held_client_that_goes_away_leaves_the_hold(door_factory) -> None:
    door = door_factory()
    door.update(active="day", switching=True, target="night")
    c = send(door, "POST", "/v1/chat/completions", {"model": NIGHT})
    wait_for(lambda: door.loop.call(door.fd.status)["held"] == 1, "held")
    c.close()
    wait_for(lambda: door.loop.call(door.fd.status)["held"] == 0, "left the hold")
    count, _ = door.loop.run(door.fd.release("night"))
    assert count == 1  # it was held during the switch
    assert not [s for s in door.night.seen if s.path.startswith("/v1/chat")]
    assert door.loop.call(lambda: door.fd.in_flight("night")) == 0


def test_deadlines_hold_under_every_hostile_client_at_once(door_factory, procs) -> None:
    raise_fd_limit(4096 + 512)
    door = door_factory(header_timeout_s=1, body_timeout_s=1, max_body_bytes=4096)
    holder = procs.start([sys.executable, "-c", HOLDER, str(door.port), "500"])
    slow_head = door.connect()
    slow_head.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    slow_body = door.connect()
    slow_body.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
    huge = door.connect()
    huge.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9999999\r\n\r\n")
    assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
    bad = send(door, "POST", "/v1/chat/completions", headers="X-Bad: 1\r\n")  # empty body: forwarded
    normal(door)
    assert closed_by_peer(huge).startswith(b"HTTP/1.1 413")
    assert answer(bad)[0] == 200
    assert closed_by_peer(slow_head).startswith(b"HTTP/1.1 408")
    assert closed_by_peer(slow_body).startswith(b"HTTP/1.1 408")
    normal(door)

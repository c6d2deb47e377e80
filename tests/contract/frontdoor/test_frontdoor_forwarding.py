"""The front door forwarding to real HTTP servers on loopback ports: streaming chunk by chunk (the
client has the first chunk while the backend has not sent the last), end-to-end headers kept and
hop-by-hop ones dropped, an alias rewritten, a kind's own routes, /v1/models answered here, a
backend that is down (502), and open-proxy attempts that never reach anything but the backend."""

from __future__ import annotations

import http.client
import json
import socket
import time

from gpushift.frontdoor import wire
from tests.support.frontdoor_rig import DAY, DEADLINE_S, NIGHT, Door


def post(
    door: Door, path: str, doc: object, headers: dict[str, str] | None = None
) -> http.client.HTTPResponse:
    c = http.client.HTTPConnection("127.0.0.1", door.port, timeout=DEADLINE_S)
    c.request(
        "POST", path, body=json.dumps(doc), headers={"Content-Type": "application/json", **(headers or {})}
    )
    return c.getresponse()


def test_a_stream_passes_chunk_by_chunk(door_factory) -> None:
    door = door_factory()
    r = post(door, "/v1/chat/completions", {"model": DAY, "stream": True, "chunks": 5, "gate": True})
    assert r.status == 200 and r.getheader("Content-Type") == "text/event-stream"
    first = r.readline()
    assert first.startswith(b"data: ") and b"day-0" in first
    assert not door.day.last_sent.is_set()  # the backend is still waiting to send the rest
    door.day.go()
    rest = r.read()
    assert door.day.last_sent.is_set()
    events = [line for line in (first + rest).split(b"\n") if line.startswith(b"data: ")]
    assert len(events) == 6 and events[-1] == b"data: [DONE]"
    assert door.loop.call(lambda: door.fd.in_flight("day")) == 0


def test_headers_end_to_end_pass_hop_by_hop_do_not(door_factory) -> None:
    door = door_factory()
    c = socket.create_connection(("127.0.0.1", door.port), timeout=DEADLINE_S)
    body = json.dumps({"model": DAY}).encode()
    c.sendall(
        b"POST /v1/embeddings?x=1 HTTP/1.1\r\nHost: evil.example\r\nAuthorization: Bearer sk-123\r\n"
        b"Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n"
        b"Proxy-Authorization: Basic eA==\r\nX-Custom: kept\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    head = c.recv(65536)
    c.close()
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"X-Upstream: day" in head and b"Set-Cookie: a=b" in head
    seen = door.day.seen[-1]
    assert seen.path == "/v1/embeddings?x=1"
    names = {k.lower() for k, _ in seen.headers}
    assert door.day.header(-1, "Authorization") == ["Bearer sk-123"]
    assert door.day.header(-1, "X-Custom") == ["kept"]
    assert door.day.header(-1, "Host") == [f"127.0.0.1:{door.day.port}"]
    assert not names & {"x-hop", "keep-alive", "te", "proxy-authorization"}
    assert "user-agent" not in names and "accept-encoding" not in names  # nothing added by the client library
    assert seen.body == body


def test_an_alias_is_rewritten_to_the_backends_model(door_factory) -> None:
    door = door_factory()
    r = post(door, "/v1/chat/completions", {"model": "default", "messages": []})
    assert r.status == 200 and json.loads(r.read())["model"] == DAY
    assert json.loads(door.day.seen[-1].body)["model"] == DAY
    door.update(active="night")
    r = post(door, "/v1/chat/completions", {"model": "default", "messages": []})
    assert r.status == 200 and json.loads(r.read())["model"] == NIGHT
    assert json.loads(door.night.seen[-1].body) == {"model": NIGHT, "messages": []}


def test_native_routes_follow_the_serving_kind(door_factory) -> None:
    door = door_factory()
    door.update(active="night")  # llama-server: /completion, /tokenize, ...
    r = post(door, "/tokenize", {"content": "hi"})
    assert r.status == 200 and json.loads(r.read())["backend"] == "night"
    r = post(door, "/slots", {})
    assert r.status == 404 and "not forwarded here" in json.loads(r.read())["error"]["message"]
    door.update(active="day")  # vLLM has /tokenize too, but not /completion
    r = post(door, "/completion", {"prompt": "x"})
    assert r.status == 404 and json.loads(r.read())["error"]["code"] == "not_found"
    assert all(s.path != "/completion" for s in door.day.seen)


def test_v1_models_answers_here_what_serves_and_every_model(door_factory) -> None:
    door = door_factory()
    c = http.client.HTTPConnection("127.0.0.1", door.port, timeout=DEADLINE_S)
    c.request("GET", "/v1/models")
    doc = json.loads(c.getresponse().read())
    assert [m["id"] for m in doc["data"]] == [DAY, "default"]
    assert {m["id"]: m["gpushift"]["backend"] for m in doc["gpushift"]["models"]} == {
        DAY: "day",
        NIGHT: "night",
    }
    c.request("GET", f"/v1/models/{DAY}")
    assert json.loads(c.getresponse().read())["id"] == DAY
    c.request("GET", f"/v1/models/{NIGHT}")
    assert c.getresponse().status == 404
    assert not door.day.seen  # never asked the backend


def test_open_proxy_attempts_reach_only_the_configured_backend(door_factory) -> None:
    door = door_factory()
    evil = f"127.0.0.1:{door.evil.port}"
    attempts = [
        f"GET http://{evil}/v1/models/x HTTP/1.1\r\nHost: {evil}\r\n\r\n",
        f"GET http://{evil}/v1/whatever HTTP/1.1\r\nHost: {evil}\r\n\r\n",
        f"GET /v1/whatever HTTP/1.1\r\nHost: {evil}\r\n\r\n",
        f"GET /v1/whatever HTTP/1.1\r\nHost: {evil}\r\nX-Forwarded-Host: {evil}\r\nForwarded: host={evil}\r\n\r\n",
        f"CONNECT {evil} HTTP/1.1\r\nHost: {evil}\r\n\r\n",
        f"GET //{evil}/v1/x HTTP/1.1\r\nHost: x\r\n\r\n",
        "GET /v1/%2e%2e/slots HTTP/1.1\r\nHost: x\r\n\r\n",
    ]
    statuses = []
    for a in attempts:
        with socket.create_connection(("127.0.0.1", door.port), timeout=DEADLINE_S) as c:
            c.sendall(a.encode())
            statuses.append(c.recv(65536).split(b"\r\n", 1)[0])
    assert door.evil.connections == 0 and not door.evil.seen
    assert [s.path for s in door.day.seen] == ["/v1/whatever", "/v1/whatever", "/v1/whatever"]
    assert all(door.day.header(i, "Host") == [f"127.0.0.1:{door.day.port}"] for i in range(3))
    assert statuses[0].startswith(b"HTTP/1.1 404")  # /v1/models/x: answered here, unknown
    assert statuses[4].startswith(b"HTTP/1.1 405") and statuses[5].startswith(b"HTTP/1.1 400")
    assert statuses[6].startswith(b"HTTP/1.1 400")


def test_a_redirect_is_passed_to_the_client_not_followed(door_factory) -> None:
    door = door_factory()
    door.day.redirect_to = f"http://127.0.0.1:{door.evil.port}/v1/x"
    r = post(door, "/v1/redirect", {"model": DAY})
    assert r.status == 302 and r.getheader("Location").endswith("/v1/x")
    assert door.evil.connections == 0


def test_a_backend_that_is_down_is_a_502(door_factory) -> None:
    door = door_factory()
    door.loop.call(door.day.server.close)  # type: ignore[union-attr]
    deadline = time.monotonic() + DEADLINE_S
    while True:
        r = post(door, "/v1/completions", {"model": DAY})
        if r.status == 502 or time.monotonic() > deadline:
            break
    doc = json.loads(r.read())
    assert (
        r.status == 502
        and doc["error"]["code"] == "upstream_error"
        and "backend day" in doc["error"]["message"]
    )
    assert door.loop.call(lambda: door.fd.in_flight("day")) == 0


def test_the_wire_rules_are_the_ones_applied() -> None:
    assert "transfer-encoding" in wire.HOP_BY_HOP and "connection" in wire.HOP_BY_HOP

"""The front door's own sockets and what people see of it: ``serve(None)`` binds ``[frontdoor]
listen`` (``[::]`` takes IPv4 too; an address it cannot bind leaves nothing open), ``stop()``
answers the held requests and closes the sockets, ``metrics_listen`` serves its Prometheus metrics,
and every request leaves one access line with its fields and never a body or a key."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

from gpushift.config.schema import parse
from gpushift.frontdoor.core import FrontDoor
from tests.support.frontdoor_rig import DAY, NIGHT, Door, answer, config_text, free_port, send, wait_for


@pytest.fixture
def bound(door_factory) -> Iterator[list[tuple[Door, FrontDoor]]]:
    """Front doors started with ``serve(None)`` beside a rig's door (its loop and backends)."""
    made: list[tuple[Door, FrontDoor]] = []
    yield made
    for door, fd in made:
        door.loop.run(fd.stop())


def start_bound(door: Door, made: list[tuple[Door, FrontDoor]], **frontdoor: object) -> FrontDoor:
    fd = FrontDoor(parse(config_text(door.day.port, door.night.port, **frontdoor)))
    made.append((door, fd))
    door.loop.run(fd.serve(None))
    door.loop.call(lambda: fd.update(door.fd.view))
    return fd


def get(host: str, port: int, path: str) -> tuple[int, bytes]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as c:
        c.settimeout(20)
        c.connect((host, port))
        c.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        got = b""
        while chunk := c.recv(65536):
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_serve_binds_listen_dual_stack_and_both_families(door_factory, bound) -> None:
    door = door_factory()
    p1, p2, p3 = free_port(), free_port(), free_port()
    fd = start_bound(door, bound, listen=[f"[::]:{p1}", f"127.0.0.1:{p2}", f"[::1]:{p3}"])
    assert door.loop.call(fd.status)["listen"] == [f"[::]:{p1}", f"127.0.0.1:{p2}", f"[::1]:{p3}"]
    for host, port in (("127.0.0.1", p1), ("::1", p1), ("127.0.0.1", p2), ("::1", p3)):
        status, body = get(host, port, "/v1/models")
        assert status == 200 and json.loads(body)["data"][0]["id"] == DAY, (host, port)


def test_an_address_it_cannot_bind_leaves_nothing_open(door_factory) -> None:
    door = door_factory()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    free = free_port()
    fd = FrontDoor(
        parse(
            config_text(
                door.day.port,
                door.night.port,
                listen=[f"127.0.0.1:{free}", f"127.0.0.1:{taken.getsockname()[1]}"],
            )
        )
    )
    with pytest.raises(OSError):
        door.loop.run(fd.serve(None))
    taken.close()
    again = socket.socket()
    again.bind(("127.0.0.1", free))  # the first address was closed again
    again.close()
    assert door.loop.call(fd.status)["listen"] == []


def test_stop_answers_the_held_requests_and_closes_the_sockets(door_factory) -> None:
    door = door_factory()
    door.update(active="day", switching=True, target="night")
    c = send(door, "POST", "/v1/chat/completions", {"model": NIGHT})
    wait_for(lambda: door.loop.call(door.fd.status)["held"] == 1, "held")
    door.loop.run(door.fd.stop())
    status, _, body = answer(c)
    assert status == 503 and json.loads(body)["error"]["code"] == "daemon_unavailable"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", door.port), timeout=5)


def test_metrics_listen_serves_the_front_doors_metrics(door_factory) -> None:
    mport = free_port()
    door = door_factory(metrics_listen=f"127.0.0.1:{mport}", hold_timeout_s=1)
    assert answer(send(door, "POST", "/v1/completions", {"model": DAY}))[0] == 200
    assert answer(send(door, "POST", "/v1/completions", {"model": "made-up-" + "x" * 50}))[0] == 404
    door.update(active="day", switching=True, target="night")
    assert answer(send(door, "POST", "/v1/completions", {"model": NIGHT}))[0] == 503  # held, then timed out
    door.update(active="night")
    door.loop.call(door.night.server.close)  # type: ignore[union-attr]  # nothing pooled to it yet
    assert answer(send(door, "POST", "/v1/completions", {"model": NIGHT}))[0] == 502
    page = urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=20).read().decode()
    assert 'gpushift_frontdoor_requests_total{backend="day",model="day-model",status="200"} 1.0' in page
    assert 'gpushift_frontdoor_requests_total{backend="",model="other",status="404"} 1.0' in page
    assert 'gpushift_frontdoor_requests_total{backend="",model="night-model",status="503"} 1.0' in page
    assert "gpushift_frontdoor_held_requests 0.0" in page
    assert "gpushift_frontdoor_held_seconds_count 1.0" in page
    assert 'gpushift_frontdoor_in_flight_requests{backend="day"} 0.0' in page
    assert (
        'gpushift_frontdoor_upstream_errors_total{backend="night",reason="connect: ECONNREFUSED"} 1.0' in page
    )
    assert "made-up" not in page  # a client cannot add label values


def test_one_access_line_per_request_with_its_fields_and_no_secret(door_factory) -> None:
    door = door_factory()
    with capture_logs() as logs:
        status, _, _ = answer(
            send(
                door,
                "POST",
                "/v1/completions?api_key=sk-in-query",
                {"model": DAY, "prompt": "secret prompt"},
                headers="Authorization: Bearer sk-live-123\r\n",
            )
        )
        assert status == 200
        wait_for(lambda: any(e["event"] == "frontdoor_request" for e in logs), "the access line")
    (line,) = [e for e in logs if e["event"] == "frontdoor_request"]
    assert {k: line[k] for k in ("method", "path", "status", "backend", "model")} == {
        "method": "POST",
        "path": "/v1/completions",
        "status": 200,
        "backend": "day",
        "model": DAY,
    }
    assert line["held_ms"] == 0.0 and line["duration_ms"] >= 0
    text = repr(logs)
    assert "sk-live-123" not in text and "sk-in-query" not in text and "secret prompt" not in text

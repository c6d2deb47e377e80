"""The /metrics listener's HTTP/1.x rules (gpushift.metrics.wire), from bytes to values: a head is
complete at its blank line (CRLF or bare LF), bounded in bytes and lines, and its body is given by
one Content-Length within the bound; a response always closes its connection."""

from __future__ import annotations

import pytest

from gpushift.metrics import wire


def test_a_head_is_read_up_to_its_blank_line_with_crlf_or_bare_lf() -> None:
    data = b"GET /metrics?name[]=a HTTP/1.1\r\nHost: x\r\nAccept:  text/plain \r\n\r\nleftover"
    req = wire.parse_head(data)
    assert isinstance(req, wire.Request)
    assert (req.method, req.path, req.query, req.version) == ("GET", "/metrics", "name[]=a", "HTTP/1.1")
    assert req.headers == (("host", "x"), ("accept", "text/plain"))
    assert req.header("ACCEPT") == "text/plain" and req.header("cookie") is None
    assert data[req.head_length :] == b"leftover" and req.body_length == 0
    bare = wire.parse_head(b"GET /m%20x HTTP/1.0\nHost: x\n\n")
    assert isinstance(bare, wire.Request) and bare.path == "/m x" and bare.version == "HTTP/1.0"
    absolute = wire.parse_head(b"GET http://h:9840/metrics?x=1 HTTP/1.1\r\n\r\n")
    assert isinstance(absolute, wire.Request) and (absolute.path, absolute.query) == ("/metrics", "x=1")


def test_an_incomplete_head_is_waited_for_until_it_passes_the_bound() -> None:
    assert wire.parse_head(b"GET /metrics HTTP/1.1\r\nHost: x\r\n") is None
    assert wire.head_end(b"GET / HTTP/1.1\r\n\r") is None
    data = b"GET / HTTP/1.1\r\n\r\n"
    assert wire.head_end(data, len(data) - 4 - 3) == len(data)  # looked at from where it stopped
    over = wire.parse_head(b"GET / HTTP/1.1\r\nX: " + b"y" * wire.MAX_HEAD_BYTES)
    assert isinstance(over, wire.Refusal) and over.status.startswith("431 ")
    lines = b"".join(b"X%d: y\r\n" % i for i in range(wire.MAX_HEADERS + 1))
    many = wire.parse_head(b"GET / HTTP/1.1\r\n" + lines + b"\r\n")
    assert isinstance(many, wire.Refusal) and many.status.startswith("431 ")


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"GET /\r\n\r\n", "400 "),
        (b"G(T / HTTP/1.1\r\n\r\n", "400 "),
        (b"GET metrics HTTP/1.1\r\n\r\n", "400 "),
        (b"GET / HTTP/1.1\r\n folded\r\n\r\n", "400 "),
        (b"GET / HTTP/1.1\r\nNo colon\r\n\r\n", "400 "),
        (b"GET / SPDY/3\r\n\r\n", "505 "),
        (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "400 "),
        (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", "400 "),
        (b"POST / HTTP/1.1\r\nContent-Length: 65537\r\n\r\n", "413 "),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", "501 "),
    ],
)
def test_a_head_that_cannot_be_served_is_refused(head: bytes, status: str) -> None:
    got = wire.parse_head(head)
    assert isinstance(got, wire.Refusal) and got.status.startswith(status), got


def test_a_body_within_the_bound_is_announced_by_its_length() -> None:
    req = wire.parse_head(b"POST / HTTP/1.1\r\nContent-Length: 65536\r\n\r\n")
    assert isinstance(req, wire.Request) and req.body_length == wire.MAX_BODY_BYTES


def test_a_response_states_its_length_and_closes_the_connection() -> None:
    out = wire.response(
        "200 OK", [("Content-Type", "text/plain"), ("Content-Length", "9"), ("Connection", "x")], b"abc"
    )
    assert (
        out
        == b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc"
    )
    assert wire.response("200 OK", [], b"abc", head_only=True).endswith(
        b"Content-Length: 3\r\nConnection: close\r\n\r\n"
    )
    refused = wire.refusal_response(wire.Refusal("400 Bad Request", "malformed request line"))
    assert refused.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert refused.endswith(b"\r\n\r\n400 Bad Request: malformed request line\n")

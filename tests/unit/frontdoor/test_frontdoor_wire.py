"""The HTTP rules of forwarding (gpushift/frontdoor/wire.py): hop-by-hop headers dropped both
ways (RFC 9110 §7.6.1), end-to-end ones (Authorization) kept; the routes forwarded; the model a
body names, a body that is not JSON, and a model that is not a string."""

from __future__ import annotations

import json

import pytest

from gpushift.backends import kinds
from gpushift.frontdoor import wire

CLIENT = [
    ("Host", "evil.example"),
    ("Authorization", "Bearer sk-secret"),
    ("Connection", "keep-alive, X-Drop-Me"),
    ("X-Drop-Me", "1"),
    ("Keep-Alive", "timeout=5"),
    ("Proxy-Authorization", "Basic abc"),
    ("Proxy-Connection", "keep-alive"),
    ("TE", "trailers"),
    ("Trailer", "X-Checksum"),
    ("Transfer-Encoding", "chunked"),
    ("Upgrade", "websocket"),
    ("Content-Length", "12"),
    ("Expect", "100-continue"),
    ("Content-Type", "application/json"),
    ("Accept", "text/event-stream"),
    ("X-Request-Id", "a"),
    ("X-Request-Id", "b"),
    ("OpenAI-Organization", "org"),
]


def test_request_headers_keep_end_to_end_ones_in_order() -> None:
    assert wire.request_headers(CLIENT) == [
        ("Authorization", "Bearer sk-secret"),
        ("Content-Type", "application/json"),
        ("Accept", "text/event-stream"),
        ("X-Request-Id", "a"),
        ("X-Request-Id", "b"),
        ("OpenAI-Organization", "org"),
    ]


def test_response_headers_drop_hop_by_hop_keep_length_and_type() -> None:
    upstream = [
        ("Content-Type", "text/event-stream"),
        ("Transfer-Encoding", "chunked"),
        ("Connection", "close"),
        ("Content-Length", "5"),
        ("Set-Cookie", "a=b"),
        ("Proxy-Authenticate", "Basic"),
        ("connection", "x-internal"),
        ("X-Internal", "1"),
    ]
    assert wire.response_headers(upstream) == [
        ("Content-Type", "text/event-stream"),
        ("Content-Length", "5"),
        ("Set-Cookie", "a=b"),
    ]


@pytest.mark.parametrize(
    ("raw", "ok"),
    [
        ("/v1/chat/completions", True),
        ("/v1/models?x=1", True),
        ("http://evil/v1/models", False),
        ("//evil/v1/models", False),
        ("*", False),
        ("evil:443", False),
        ("/v1/%2e%2e/slots", False),
        ("/v1/%2E%2E/slots", False),
        ("/v1/a%2Fb", False),
        ("/v1/a%5cb", False),
        ("/v1\\..\\slots", False),
        ("/v1/caf%C3%A9", True),
        ("/v1/../slow", False),
        ("/v1/./models", False),
        ("/v1/a/../../slots", False),
        ("/v1/..", False),
        ("/v1/a..b/c.d", True),
        ("/v1/x?next=../y", True),
    ],
)
def test_path_problem(raw: str, ok: bool) -> None:
    assert (wire.path_problem(raw) is None) is ok


def test_routes_forwarded_are_v1_and_the_kinds_own() -> None:
    llama = frozenset(kinds.kind_of("llama-server").native_routes)
    vllm = frozenset(kinds.kind_of("vllm").native_routes)
    assert {"/completion", "/tokenize", "/detokenize", "/embedding", "/infill"} <= llama
    assert "/slots" not in llama and "/props" not in llama and "/metrics" not in llama
    assert wire.forwarded("/v1/anything/else", frozenset())
    assert wire.forwarded("/completion", llama) and not wire.forwarded("/completion", vllm)
    assert wire.forwarded("/v2/rerank", vllm)
    assert not wire.forwarded("/slots", llama) and not wire.forwarded("/", llama)
    assert not wire.forwarded("/v1", llama)
    assert kinds.kind_of("generic").native_routes == ()


J = "application/json"


@pytest.mark.parametrize(
    ("body", "path", "ctype", "enc", "model", "problem"),
    [
        (b'{"model": "m", "messages": []}', "/v1/chat/completions", J, "", "m", ""),
        (b'{"model": "m"}', "/v1/chat/completions", "", "", "m", ""),  # no type: read as JSON
        (b'{"model": "m"}', "/v1/chat/completions", "application/json; charset=utf-8", "", "m", ""),
        (b'{"model": "m"}', "/v1/x", "application/vnd.api+json", "", "m", ""),
        (b'{"messages": []}', "/v1/chat/completions", J, "", None, ""),
        (b'{"model": null}', "/v1/chat/completions", J, "", None, ""),
        (b"", "/v1/chat/completions", J, "", None, ""),
        (b"[1, 2]", "/v1/chat/completions", J, "", None, ""),  # JSON but no object: passed on
        (b"{not json", "/v1/chat/completions", J, "", None, "not valid JSON"),
        (b"\xff\xfe{", "/v1/completions", J, "", None, "not valid JSON"),
        (b"[" * 100_000, "/v1/completions", J, "", None, "not valid JSON"),
        (b"{not json", "/tokenize", J, "", None, ""),  # a route that takes anything: passed on
        (b"{not json", "/v1/audio/transcriptions", J, "", None, ""),
        (b'{"model": "m"}', "/v1/chat/completions", "multipart/form-data; boundary=x", "", None, ""),
        (b'{"model": "m"}', "/v1/chat/completions", J, "gzip", None, ""),  # encoded: not read
        (b'{"model": "m"}', "/v1/chat/completions", J, "identity", "m", ""),
        (b'{"model": 7}', "/v1/chat/completions", J, "", None, "must be a string"),
        (b'{"model": ["a"]}', "/tokenize", J, "", None, "must be a string"),
    ],
)
def test_read_body(body: bytes, path: str, ctype: str, enc: str, model: str | None, problem: str) -> None:
    b = wire.read_body(body, path, ctype, enc)
    assert b.model == model
    assert (problem in b.problem) if problem else b.problem == ""


def test_a_non_string_model_is_kept_for_the_message() -> None:
    b = wire.read_body(b'{"model": {"a": 1}}', "/v1/completions", J, "")
    assert b.bad_model == {"a": 1} and b.code == "invalid_model"


def test_with_model_rewrites_only_the_model() -> None:
    b = wire.read_body(b'{"model": "default", "stream": true, "n": "\xc3\xa9"}', "/v1/completions", J, "")
    assert b.document is not None
    assert json.loads(wire.with_model(b.document, "real")) == {"model": "real", "stream": True, "n": "é"}


@pytest.mark.parametrize(
    ("url", "origin"),
    [
        ("http://127.0.0.1:8001/health", "http://127.0.0.1:8001"),
        ("http://127.3.4.5/health", "http://127.3.4.5:80"),
        ("https://localhost/h", "https://localhost:443"),
        ("http://[::1]:8081/health", "http://[::1]:8081"),
        ("http://user@127.0.0.1:8001/", "http://127.0.0.1:8001"),
    ],
)
def test_loopback_origin(url: str, origin: str) -> None:
    assert wire.loopback_origin(url).url == origin


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://10.0.0.5:8000/health", "not on a loopback address"),
        ("http://gpu-host:8000/health", "not on a loopback address"),
        ("http://0.0.0.0:8000/health", "not on a loopback address"),
        ("ftp://127.0.0.1/x", "not an http"),
        ("http://127.0.0.1:99999/x", "not a URL"),
        ("/health", "not an http"),
    ],
)
def test_not_a_loopback_origin(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        wire.loopback_origin(url)

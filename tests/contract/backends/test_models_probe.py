"""The probe's look at a backend's /v1/models (the warm-up's and `gpushift check`'s model-name
comparison) against a real local HTTP server that wants the backend's API key, as vLLM with
--api-key does."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpushift.backends.probe import HttpBackendProbe

ANSWER: dict[str, object] = {}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.headers.get("Authorization") != "Bearer k1":
            status, data = 401, b'{"error": "unauthorized"}'
        else:
            status, data = int(ANSWER.get("status", 200)), json.dumps(ANSWER.get("body")).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    ANSWER.clear()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1/models"
    finally:
        srv.shutdown()
        srv.server_close()


def test_models_lists_ids_and_aliases_with_the_key(server: str) -> None:
    probe = HttpBackendProbe()
    ANSWER["body"] = {"object": "list", "data": [{"id": "qwen", "aliases": ["q"]}, {"id": "b"}]}
    assert probe.models(server, {"Authorization": "Bearer k1"}) == (["qwen", "q", "b"], None)
    assert probe.models(server, {}) == (None, "HTTP 401")
    ANSWER["body"] = {"data": "nope"}
    assert probe.models(server, {"Authorization": "Bearer k1"}) == (None, "not a model list (no data[].id)")


def test_models_never_sends_a_header_that_would_split_the_request(server: str) -> None:
    names, error = HttpBackendProbe().models(server, {"Authorization": "Bearer k1\r\nX-Evil: 1"})
    assert names is None and error is not None and "would break the request" in error


def test_models_of_a_closed_port_reads_as_words() -> None:
    names, error = HttpBackendProbe().models("http://127.0.0.1:9/v1/models", {}, timeout_s=1.0)
    assert names is None and error == "no answer: connection refused"

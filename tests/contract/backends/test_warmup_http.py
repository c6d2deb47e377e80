"""The warm-up request against real local HTTP servers: streamed answers, errors, a trickle."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpushift.backends.warmup_http import run
from gpushift.values import WarmupRequest


class Server:
    """A backend that answers POSTs the way a test says (``mode``), recording what it got."""

    def __init__(self) -> None:
        self.mode = "vllm"
        self.got: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                body = json.dumps({"data": [{"id": "tiny-model"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                outer.got.append((self.path, json.loads(self.rfile.read(n)), dict(self.headers)))
                if outer.mode == "error":
                    self.send_response(500)
                    self.send_header("Content-Length", "4")
                    self.end_headers()
                    self.wfile.write(b"boom")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                if outer.mode == "trickle":
                    for _ in range(100):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(0.1)
                    return
                time.sleep(0.05)  # the first token takes a moment
                for i in range(3):
                    chunk = {"content": f"t{i}", "stop": outer.mode == "llama" and i == 2}
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
                    time.sleep(0.02)
                if outer.mode == "vllm":
                    self.wfile.write(b"data: [DONE]\n\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    try:
        yield s
    finally:
        s.httpd.shutdown()
        s.httpd.server_close()


def req(server: Server, **kw: Any) -> WarmupRequest:
    base: dict[str, Any] = {
        "url": server.url + "/v1/completions",
        "body": {"prompt": "x", "stream": True},
        "stream": True,
        "timeout_s": 5.0,
    }
    base.update(kw)
    return WarmupRequest(**base)


def test_warmup_vllm_stream_times_the_first_token_and_asks_the_served_model(server: Server) -> None:
    r = run(req(server, models_url=server.url + "/v1/models", headers={"Authorization": "Bearer k"}))
    assert r.ok and r.status == 200 and r.chunks == 3, r
    assert r.ttft_s is not None and r.total_s is not None and 0.04 < r.ttft_s <= r.total_s
    path, body, headers = server.got[0]
    assert body["model"] == "tiny-model" and headers["Authorization"] == "Bearer k"


def test_warmup_llama_stream_ends_at_the_stop_chunk(server: Server) -> None:
    server.mode = "llama"
    r = run(req(server))
    assert r.ok and r.chunks == 3


def test_warmup_error_status_fails_with_the_answer(server: Server) -> None:
    server.mode = "error"
    r = run(req(server))
    assert not r.ok and r.status == 500 and "boom" in r.detail


def test_warmup_trickling_answer_gives_up_at_its_one_deadline(server: Server) -> None:
    server.mode = "trickle"  # one byte every 0.1 s: a per-read timeout would never expire
    t0 = time.monotonic()
    r = run(req(server, timeout_s=1.0))
    assert not r.ok and "in time" in r.detail
    assert time.monotonic() - t0 < 2.0


def test_warmup_refused_connection_fails_cleanly() -> None:
    r = run(WarmupRequest("http://127.0.0.1:9/v1/completions", {}, True, timeout_s=2.0))
    assert not r.ok and r.status is None and r.detail

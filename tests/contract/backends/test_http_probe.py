"""The HTTP probe against real local HTTP servers: health, version, in-flight requests."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpushift.backends.probe import HttpBackendProbe, parse_inflight, parse_slots
from gpushift.config.schema import parse

ROUTES: dict[str, tuple[int, str]] = {}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        status, body = ROUTES.get(self.path, (404, "not found"))
        data = body.encode()
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
    ROUTES.clear()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


VLLM_METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="tiny"} 2.0
vllm:num_requests_waiting{model_name="tiny"} 1.0
vllm:gpu_cache_usage_perc{model_name="tiny"} 0.5
"""


def test_http_probe_health_states(server: str) -> None:
    p = HttpBackendProbe()
    ROUTES["/health"] = (503, '{"error":{"message":"Loading model"}}')
    h = p.health(server + "/health")
    assert not h.ok and h.status == 503 and "Loading model" in h.detail
    ROUTES["/health"] = (200, '{"status":"ok"}')
    assert p.health(server + "/health").ok
    refused = p.health("http://127.0.0.1:9/health", 0.5)  # discard port: nothing listens
    assert not refused.ok and refused.status is None and "no answer" in refused.detail


def test_http_probe_version_from_vllm_and_llama_server_props(server: str) -> None:
    p = HttpBackendProbe()
    ROUTES["/version"] = (200, json.dumps({"version": "0.32.0"}))
    assert p.version(server + "/version", None).version == "0.32.0"
    ROUTES["/props"] = (200, json.dumps({"build_info": "b6143-0e55e3a1", "model_path": "/m.gguf"}))
    v = p.version(server + "/props", None)
    assert v.version == "b6143-0e55e3a1" and v.source == "url"
    assert p.version(server + "/nothing", None).version is None


def test_http_probe_version_runs_the_version_command_when_there_is_no_url() -> None:
    # The command itself is tested in test_version_command.py.
    p = HttpBackendProbe()
    cmd = ["sh", "-c", "echo 'load_backend: loaded CPU backend' >&2; echo 'version: 6143 (0e55e3a1)' >&2"]
    v = p.version(None, cmd)
    assert v.version == "6143 (0e55e3a1)" and v.source == "command"
    assert p.version(None, ["/nonexistent/llama-server", "--version"]).version is None


def test_http_probe_in_flight_from_vllm_metrics_and_llama_slots(server: str) -> None:
    ROUTES["/metrics"] = (200, VLLM_METRICS)
    ROUTES["/slots"] = (
        200,
        json.dumps(
            [
                {"id": 0, "is_processing": True},
                {"id": 1, "is_processing": False},
                {"id": 2, "is_processing": True},
            ]
        ),
    )
    cfg = parse(f"""
[backends.day]
kind = "vllm"
unit = "d.service"
health_url = "{server}/health"
[backends.night]
kind = "llama-server"
unit = "n.service"
health_url = "{server}/health"
[backends.other]
unit = "o.service"
health_url = "{server}/health"
""")
    p = HttpBackendProbe()
    assert p.in_flight(cfg.backends["day"]) == 3  # running + waiting
    assert p.in_flight(cfg.backends["night"]) == 2  # slots processing
    assert p.in_flight(cfg.backends["other"]) is None  # generic: no probe, cannot tell
    ROUTES["/metrics"] = (500, "boom")
    assert p.in_flight(cfg.backends["day"]) is None


def test_config_kinds_bring_their_endpoints() -> None:
    cfg = parse("""
[backends.day]
kind = "vllm"
unit = "d.service"
health_url = "http://127.0.0.1:8000/health"
[backends.night]
kind = "llama-server"
unit = "n.service"
health_url = "http://127.0.0.1:8080/health"
version_command = ["llama-server", "--version"]
""")
    day, night = cfg.backends["day"], cfg.backends["night"]
    assert (
        day.version_url == "http://127.0.0.1:8000/version"
        and day.metrics_url == "http://127.0.0.1:8000/metrics"
    )
    assert night.version_url is None and night.metrics_url == "http://127.0.0.1:8080/slots"


def test_parsers_ignore_comments_and_bad_values() -> None:
    assert parse_inflight("# vllm:num_requests_running 9\nother 1\n") is None
    assert parse_inflight(VLLM_METRICS) == 3
    assert parse_slots("not json") is None and parse_slots("{}") is None


def test_http_probe_health_of_a_closed_port_reads_as_words_not_python() -> None:
    """What `gpushift switch` shows while a backend loads: no ``[Errno 111]`` (issue 25)."""
    import socket

    from gpushift.backends.probe import HttpBackendProbe

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    h = HttpBackendProbe().health(f"http://127.0.0.1:{port}/health", 2.0)
    assert not h.ok and h.detail == "no answer: connection refused", h

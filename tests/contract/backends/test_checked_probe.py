"""The checked probe against real local HTTP servers: a refused connection is never sent a request.

``FakePeers`` (tests/support/fakes.py) scripts who holds each server port; the last test runs the
real peer check (gpushift/host/peer.py) against a server of this very process, whose cgroup is the
test's own.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpushift.backends.probe import HttpBackendProbe
from gpushift.config.schema import parse
from gpushift.host.peer import PeerFinder, cgroup_of
from gpushift.values import WarmupRequest
from tests.support.fakes import FakePeers

UNIT_CG = "/system.slice/gpushift-vllm.service"


class Server:
    """Answers 200 to everything; remembers every request it was sent."""

    def __init__(self) -> None:
        self.got: list[tuple[str, str, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _answer(self, body: bytes) -> None:
                outer.got.append((self.command, self.path, dict(self.headers)))
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer(
                    b'{"version": "6.6.6"}' if self.path == "/version" else b"vllm:num_requests_running 4\n"
                )

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer(json.dumps({"choices": [{"text": "x"}]}).encode())

        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.srv.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    t = threading.Thread(target=s.srv.serve_forever, daemon=True)
    t.start()
    try:
        yield s
    finally:
        s.srv.shutdown()
        s.srv.server_close()


def backend(url: str) -> Any:
    cfg = parse(f'[backends.b]\nunit = "b.service"\nkind = "vllm"\nhealth_url = "{url}/health"\n', "/x.toml")
    return cfg.backends["b"]


def test_an_answer_from_the_unit_counts_and_each_connection_is_checked(server: Server) -> None:
    peers = FakePeers()
    p = HttpBackendProbe(peers)
    assert p.health(server.url + "/health", 2.0, UNIT_CG).ok
    v = p.version(server.url + "/version", None, 2.0, UNIT_CG)
    assert v.version == "6.6.6" and v.foreign is None
    assert p.in_flight(backend(server.url), UNIT_CG) == 4
    w = p.warmup(WarmupRequest(server.url + "/v1/completions", {"prompt": "hi"}, False), UNIT_CG)
    assert w.ok and w.foreign is None
    assert [m for m, _path, _h in server.got] == ["GET", "GET", "GET", "POST"]
    # The server end of each request's own connection was asked about (four connections).
    assert len({client for client, _s, _cg in peers.calls}) == 4
    assert all(s == ("127.0.0.1", server.port) and cg == UNIT_CG for _c, s, cg in peers.calls)


def test_a_foreign_holder_is_named_and_sent_nothing(server: Server) -> None:
    peers = FakePeers()
    peers.foreign(server.port, pid=4242, user="nobody", cgroup="/user.slice/x.scope")
    p = HttpBackendProbe(peers)
    h = p.health(server.url + "/health", 2.0, UNIT_CG)
    assert not h.ok and h.status is None and h.foreign is not None
    assert "PID 4242" in h.detail and "user nobody" in h.detail and h.foreign["peers"][0]["pid"] == 4242
    v = p.version(server.url + "/version", None, 2.0, UNIT_CG)
    assert v.version is None and v.foreign is not None and "PID 4242" in v.raw
    assert p.in_flight(backend(server.url), UNIT_CG) is None
    key = {"Authorization": "Bearer secret"}
    w = p.warmup(WarmupRequest(server.url + "/v1/completions", {"prompt": "hi"}, True, headers=key), UNIT_CG)
    assert not w.ok and w.foreign is not None and w.to_dict()["foreign"]["peers"][0]["user"] == "nobody"
    assert server.got == []  # not one request (nor the API key) reached the impostor


def test_who_holds_it_unknown_is_not_an_answer_either(server: Server) -> None:
    peers = FakePeers()
    peers.unknown(server.port)
    h = HttpBackendProbe(peers).health(server.url + "/health", 2.0, UNIT_CG)
    assert not h.ok and h.foreign is None and "cannot tell who answers" in h.detail
    assert server.got == []


def test_a_checked_request_without_a_peer_check_is_refused_and_an_unchecked_one_is_as_before(
    server: Server,
) -> None:
    p = HttpBackendProbe()  # no peers
    h = p.health(server.url + "/health", 2.0, UNIT_CG)
    assert not h.ok and "no peer check is configured" in h.detail and server.got == []
    assert p.health(server.url + "/health", 2.0).ok  # expect_cgroup None: unchecked, as before
    assert len(server.got) == 1


def test_the_real_peer_check_takes_this_process_s_server_for_its_own_cgroup(server: Server) -> None:
    finder = PeerFinder()
    mine = cgroup_of(os.getpid())
    p = HttpBackendProbe(finder)
    assert p.health(server.url + "/health", 2.0, mine).ok
    other = p.health(server.url + "/health", 2.0, "/gpushift-test-nowhere.slice/b.service")
    assert not other.ok and other.foreign is not None and len(server.got) == 1

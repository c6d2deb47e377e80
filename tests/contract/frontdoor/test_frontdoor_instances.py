"""A backend of several instances behind the front door (issue 23 item 4): a real
:class:`FrontDoor` on a loopback socket in front of two stand-in backends, each its own process
(``tests/support/standin.py``) that the test starts, kills by its PID and starts again.

Concurrent requests spread over both instances; a connect refused is tried again at once on the
other instance; a request in flight on an instance that is killed gets a 502 and is counted for
that instance; after the instance is marked down (its health missed, or its request broke) every
request goes to the other one and none fails; once it answers its health again it gets requests
again; the drain's count covers every instance.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from gpushift.config.schema import parse
from gpushift.config.types import InstanceConfig
from gpushift.frontdoor import instances
from gpushift.frontdoor.core import FrontDoor
from gpushift.frontdoor.view import DaemonView
from tests.support.frontdoor_rig import DAY, DEADLINE_S, Loop, config_text, free_port, wait_for

REPO = Path(__file__).resolve().parents[3]
UNITS = ("day@0.service", "day@1.service")

#: A backend that streams with HTTP/1.1's chunked coding, as llama-server and vLLM do (the
#: stand-in speaks HTTP/1.0, where a body that ends with the connection cannot be told from one
#: broken off): its health answers 200, a streamed completion never ends, any other is JSON.
CHUNKED = """
import asyncio, json, sys
from aiohttp import web
port = sys.argv[1]
async def health(request):
    return web.json_response({"status": "ok"})
async def complete(request):
    doc = json.loads(await request.read() or b"{}")
    if not doc.get("stream"):
        return web.json_response({"choices": [{"text": "x"}]}, headers={"x-standin-port": port})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-standin-port": port})
    await resp.prepare(request)
    while True:
        await resp.write(b'data: {"choices": [{"text": "x"}]}\\n\\n')
        await asyncio.sleep(0.05)
app = web.Application()
app.router.add_get("/health", health)
app.router.add_post("/v1/completions", complete)
web.run_app(app, host="127.0.0.1", port=int(port), print=None)
"""


@dataclass
class Standin:
    """One stand-in backend process on a loopback port."""

    port: int
    chunked: bool = False  # the server of CHUNKED instead of the stand-in
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = (
            ["-c", CHUNKED, str(self.port)]
            if self.chunked
            else ["-m", "tests.support.standin", "--port", str(self.port), "--served-model-name", DAY]
        )
        self.proc = subprocess.Popen(
            [sys.executable, *argv],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self.healthy, f"the stand-in on port {self.port} answers its health")

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL, by the PID this test started, and wait for it."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(DEADLINE_S)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.kill()


@dataclass
class Pair:
    """The front door and the two instances of its backend ``day``."""

    loop: Loop
    fd: FrontDoor
    port: int
    standins: list[Standin] = field(default_factory=list)

    def post(self, doc: dict[str, object]) -> tuple[int, str, dict[str, object]]:
        """(status, the port of the instance that answered, the body) of one request."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=DEADLINE_S * 3)
        try:
            c.request("POST", "/v1/completions", json.dumps(doc), {"Content-Type": "application/json"})
            r = c.getresponse()
            return r.status, r.getheader("x-standin-port") or "", json.loads(r.read() or b"{}")
        finally:
            c.close()

    def many(self, n: int, sleep_s: float) -> list[tuple[int, str, dict[str, object]]]:
        """``n`` requests at once, each taking ``sleep_s`` at its instance."""
        with ThreadPoolExecutor(n) as pool:
            return list(
                pool.map(lambda _: self.post({"model": DAY, "prompt": "x", "sleep": sleep_s}), range(n))
            )

    def status(self) -> dict[str, object]:
        return self.loop.call(self.fd.status)

    def instance(self, i: int) -> dict[str, object]:
        got = self.status()["instances"]
        assert isinstance(got, dict)
        return dict(got["day"][i])

    def metrics(self) -> str:
        return self.fd.observer.page().decode()


@pytest.fixture
def pair() -> Iterator[Pair]:
    yield from _pair(chunked=False)


@pytest.fixture
def chunked_pair() -> Iterator[Pair]:
    yield from _pair(chunked=True)


def _pair(chunked: bool) -> Iterator[Pair]:
    standins = [Standin(free_port(), chunked), Standin(free_port(), chunked)]
    loop = Loop()
    fd: FrontDoor | None = None
    try:
        for s in standins:
            s.start()
        base = parse(config_text(free_port(), free_port()))
        members = tuple(
            InstanceConfig(unit, f"http://127.0.0.1:{s.port}/health", (i,))
            for i, (unit, s) in enumerate(zip(UNITS, standins, strict=True))
        )
        day = replace(base.backends["day"], health_url="", instances=members)
        fd = FrontDoor(replace(base, backends={**base.backends, "day": day}))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        port = sock.getsockname()[1]
        loop.run(fd.serve([sock]))
        yield Pair(loop, fd, port, standins)
    finally:
        if fd is not None:
            loop.run(fd.stop())
        loop.stop()
        for s in standins:
            s.stop()


def serve_day(p: Pair) -> None:
    view = DaemonView(connected=True, active="day", models={"night": ("night-model",)})
    p.loop.call(lambda: p.fd.update(view))


def test_concurrent_requests_spread_over_both_instances(pair: Pair) -> None:
    serve_day(pair)
    got = pair.many(32, 0.5)
    assert [status for status, _, _ in got] == [200] * 32
    ports = [port for _, port, _ in got]
    counts = {str(s.port): ports.count(str(s.port)) for s in pair.standins}
    assert all(n > 0 for n in counts.values()), counts  # each instance got some
    assert sum(counts.values()) == 32
    page = pair.metrics()
    for unit, s in zip(UNITS, pair.standins, strict=True):
        line = f'gpushift_frontdoor_instance_requests_total{{backend="day",instance="{unit}"}} {float(counts[str(s.port)])}'
        assert line in page
    assert pair.instance(0) == {"instance": UNITS[0], "up": True, "in_flight": 0}


def test_a_refused_connect_is_tried_again_at_once_on_the_other_instance(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(instances, "PROBE_PERIOD_S", 3600.0)  # no health probe comes first
    pair.standins[0].kill()  # its port now refuses every connect
    serve_day(pair)
    got = [pair.post({"model": DAY, "prompt": "x"}) for _ in range(4)]
    assert [(status, port) for status, port, _ in got] == [(200, str(pair.standins[1].port))] * 4
    assert pair.instance(0)["up"] is False
    page = pair.metrics()
    assert f'gpushift_frontdoor_instance_retried_total{{backend="day",instance="{UNITS[0]}"}} 1.0' in page
    assert "gpushift_frontdoor_upstream_errors_total{" not in page  # no client saw an error


def test_a_killed_instance_fails_its_request_in_flight_and_then_gets_none(pair: Pair) -> None:
    serve_day(pair)
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(pair.post, {"model": DAY, "prompt": "x", "sleep": 600})
        wait_for(lambda: pair.status()["in_flight"] == {"day": 1, "night": 0}, "the slow request in flight")
        busy = next(i for i in (0, 1) if pair.instance(i)["in_flight"] == 1)
        pair.standins[busy].kill()
        status, _, body = slow.result(DEADLINE_S)
    assert status == 502
    assert body["error"]["code"] == "upstream_error"  # type: ignore[index]
    failed = re.findall(
        rf'gpushift_frontdoor_instance_failed_total{{backend="day",instance="{re.escape(UNITS[busy])}",reason="[^"]+"}} (\S+)',
        pair.metrics(),
    )
    assert failed == ["1.0"]  # counted for the instance that died (reason: how the connection ended)
    wait_for(lambda: pair.instance(busy)["up"] is False, "the killed instance marked down")
    other = str(pair.standins[1 - busy].port)
    for _ in range(2):  # also after health probes of the dead one
        got = pair.many(32, 0.1)
        assert [(status, port) for status, port, _ in got] == [(200, other)] * 32
    assert f'gpushift_frontdoor_instance_retried_total{{backend="day",instance="{UNITS[busy]}"}} 0.0' in (
        pair.metrics()
    )
    pair.standins[busy].start()  # the same port again: its health answers, it gets requests again
    wait_for(lambda: pair.instance(busy)["up"] is True, "the restarted instance marked up")
    ports = {port for _, port, _ in pair.many(16, 0.3)}
    assert ports == {str(s.port) for s in pair.standins}


def test_an_instance_whose_health_fails_gets_no_requests(pair: Pair) -> None:
    serve_day(pair)
    sick = pair.standins[0]
    urllib.request.urlopen(
        urllib.request.Request(
            f"http://127.0.0.1:{sick.port}/_standin/health",
            data=b'{"mode": "fail"}',
            headers={"Content-Type": "application/json"},
        ),
        timeout=DEADLINE_S,
    ).close()
    wait_for(lambda: pair.instance(0)["up"] is False, "the instance with a failing health marked down")
    got = pair.many(16, 0.1)
    assert [(status, port) for status, port, _ in got] == [(200, str(pair.standins[1].port))] * 16
    assert f'gpushift_frontdoor_instance_up{{backend="day",instance="{UNITS[0]}"}} 0.0' in pair.metrics()


def test_the_drain_counts_the_requests_of_every_instance(pair: Pair) -> None:
    serve_day(pair)
    with ThreadPoolExecutor(2) as pool:
        slow = [pool.submit(pair.post, {"model": DAY, "prompt": "x", "sleep": 2}) for _ in range(2)]
        wait_for(lambda: pair.status()["in_flight"] == {"day": 2, "night": 0}, "two requests in flight")
        assert [pair.instance(i)["in_flight"] for i in (0, 1)] == [1, 1]
        assert pair.loop.run(pair.fd.close("day")) == 2
        assert pair.loop.call(lambda: pair.fd.in_flight("day")) == 2
        assert [f.result(DEADLINE_S)[0] for f in slow] == [200, 200]
    assert pair.loop.call(lambda: pair.fd.in_flight("day")) == 0


def test_a_stream_broken_by_a_killed_instance_breaks_off_and_is_counted(chunked_pair: Pair) -> None:
    pair = chunked_pair
    serve_day(pair)
    c = http.client.HTTPConnection("127.0.0.1", pair.port, timeout=DEADLINE_S)
    body = {"model": DAY, "prompt": "x", "stream": True}
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    busy = [str(s.port) for s in pair.standins].index(r.getheader("x-standin-port") or "")
    assert r.read1().startswith(b"data: ")  # the stream has begun
    pair.standins[busy].kill()
    with pytest.raises((http.client.IncompleteRead, ConnectionError)):
        while r.read1():  # never a complete-looking answer
            pass
    c.close()
    failed = re.findall(
        rf'gpushift_frontdoor_instance_failed_total{{backend="day",instance="{re.escape(UNITS[busy])}",reason="[^"]+"}} (\S+)',
        pair.metrics(),
    )
    assert failed == ["1.0"]
    got = pair.many(8, 0.0)
    assert [(status, port) for status, port, _ in got] == [(200, str(pair.standins[1 - busy].port))] * 8


def test_with_the_daemon_lost_it_forwards_while_any_instance_answers_its_health(pair: Pair) -> None:
    serve_day(pair)
    pair.loop.call(lambda: pair.fd.update(DaemonView(connected=False)))
    pair.standins[0].kill()
    wait_for(lambda: pair.instance(0)["up"] is False, "the killed instance marked down")
    got = pair.many(8, 0.0)
    assert [(status, port) for status, port, _ in got] == [(200, str(pair.standins[1].port))] * 8
    pair.standins[1].kill()  # no instance answers: the daemon's word is needed again

    def lost() -> bool:
        status, _, body = pair.post({"model": DAY, "prompt": "x"})
        return status == 503 and body["error"]["code"] == "daemon_unavailable"  # type: ignore[index]

    wait_for(lost, "503 once no instance's health answers")

"""The front door's test rig: a real :class:`FrontDoor` on a loopback socket,
in front of real HTTP servers (aiohttp) on loopback ports, all on one event loop in a thread of
the test process, and clients on the test's own thread (raw sockets, http.client, the official
``openai`` package).  Everything a test starts is stopped after it, also when it fails.

The upstream servers stand for the backends: each records every request it got (method, path,
headers, body), answers ``/v1/chat/completions`` as server-sent events (``"chunks"`` in the body;
``"gate": true`` waits for the test's go between the first chunk and the rest), ``/slow`` after a
long while (noting when its client went away), ``/health`` 200 (or 503 once told), anything else
with a JSON echo.  A third server, ``evil``, stands for every address a client might name: no
test may ever make the front door reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

from gpushift.config.schema import parse
from gpushift.frontdoor.core import FrontDoor
from gpushift.frontdoor.view import DaemonView

T = TypeVar("T")

DAY, NIGHT = "day-model", "night-model"

#: The deadline of every wait for an event in these tests (the machine is busy: generous).
DEADLINE_S = 20.0


class Loop:
    """An asyncio event loop running in a thread; ``run(coro)`` waits for a coroutine's result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="frontdoor-test-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = DEADLINE_S) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], T]) -> T:
        async def wrap() -> T:
            return fn()

        return self.run(wrap())

    def call_threadsafe_close(self, server: asyncio.AbstractServer) -> None:
        self.loop.call_soon_threadsafe(server.close)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@dataclass
class Seen:
    method: str
    path: str  # with the query
    headers: list[tuple[str, str]]
    body: bytes


@dataclass
class Upstream:
    """One backend's stand-in on a loopback port."""

    name: str
    loop: Loop
    port: int = 0
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    healthy: bool = True
    gate: asyncio.Event | None = None
    client_gone: threading.Event = field(default_factory=threading.Event)
    last_sent: threading.Event = field(default_factory=threading.Event)
    server: asyncio.AbstractServer | None = None
    redirect_to: str = ""  # set: every /v1/redirect answers 302 with this Location

    def go(self) -> None:
        """Let a gated stream send the rest of its chunks."""
        assert self.gate is not None
        self.loop.loop.call_soon_threadsafe(self.gate.set)

    def header(self, i: int, name: str) -> list[str]:
        return [v for k, v in self.seen[i].headers if k.lower() == name.lower()]

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(Seen(request.method, request.path_qs, list(request.headers.items()), body))
        if request.path == "/v1/redirect":
            return web.Response(status=302, headers={"Location": self.redirect_to})
        if request.path == "/health":
            return web.Response(status=200 if self.healthy else 503, text="ok")
        if request.path in ("/slow", "/v1/slow"):
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.client_gone.set()
                raise
        if request.path == "/v1/chat/completions":
            return await self._stream(request, json.loads(body or b"{}"))
        doc = {"backend": self.name, "path": request.path_qs, "body": body.decode("utf-8", "replace")}
        return web.json_response(doc, headers={"X-Upstream": self.name, "Set-Cookie": "a=b"})

    async def _stream(self, request: web.BaseRequest, doc: dict[str, Any]) -> web.StreamResponse:
        if not doc.get("stream"):
            return web.json_response(_completion(self.name, doc.get("model", "")))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        n = int(doc.get("chunks", 3))
        try:
            for i in range(n):
                await resp.write(_sse(self.name, doc.get("model", ""), i))
                if i == 0 and doc.get("gate"):
                    self.gate = self.gate or asyncio.Event()
                    await self.gate.wait()
                await asyncio.sleep(float(doc.get("interval", 0.0)))
            self.last_sent.set()
            await resp.write(b"data: [DONE]\n\n")
        except asyncio.CancelledError:
            self.client_gone.set()
            raise
        return resp


def _completion(backend: str, model: str) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"from {backend}"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    }


def _sse(backend: str, model: str, i: int) -> bytes:
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": {"content": f"{backend}-{i} "}, "finish_reason": None}],
    }
    return f"data: {json.dumps(chunk)}\n\n".encode()


async def _start_upstream(up: Upstream) -> None:
    def count() -> web.RequestHandler:
        up.connections += 1
        return server()

    server = web.Server(up.handle, handler_cancellation=True, access_log=None)
    loop = asyncio.get_running_loop()
    up.server = await loop.create_server(count, "127.0.0.1", 0)
    up.port = up.server.sockets[0].getsockname()[1]


def config_text(day_port: int, night_port: int, **frontdoor: Any) -> str:
    keys = {"listen": ["127.0.0.1:18999"], **frontdoor}
    table = "\n".join(f"{k} = {json.dumps(v)}" for k, v in keys.items())
    return f"""
[frontdoor]
{table}

[backends.day]
kind = "vllm"
unit = "day.service"
health_url = "http://127.0.0.1:{day_port}/health"
models = ["{DAY}"]
aliases = ["default"]
start_timeout_s = 30

[backends.night]
kind = "llama-server"
unit = "night.service"
health_url = "http://127.0.0.1:{night_port}/health"
aliases = ["default"]
"""


@dataclass
class Door:
    """A started front door and the servers around it."""

    loop: Loop
    fd: FrontDoor
    port: int
    day: Upstream
    night: Upstream
    evil: Upstream

    def update(self, **view: Any) -> None:
        v = DaemonView(**{"connected": True, "models": {"night": (NIGHT,)}, **view})
        self.loop.call(lambda: self.fd.update(v))

    def connect(self, timeout: float = DEADLINE_S) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def wait_for(cond: Callable[[], object], what: str, deadline_s: float = DEADLINE_S) -> None:
    end = time.monotonic() + deadline_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"not within {deadline_s} s: {what}")
        time.sleep(0.01)


def send(door: Door, method: str, path: str, doc: object = None, headers: str = "") -> socket.socket:
    """A request sent on a new connection; its answer is read later with :func:`answer`."""
    body = b"" if doc is None else json.dumps(doc).encode()
    c = door.connect()
    c.sendall(
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    return c


def answer(c: socket.socket) -> tuple[int, http.client.HTTPMessage, bytes]:
    """(status, headers, body) of the answer on ``c``; closes ``c``."""
    r = http.client.HTTPResponse(c)
    try:
        r.begin()
        return r.status, r.headers, r.read()
    finally:
        r.close()
        c.close()


def nothing_yet(c: socket.socket, for_s: float = 0.3) -> bool:
    """Nothing has arrived on ``c`` (no status line, no header) for ``for_s``."""
    c.settimeout(for_s)
    try:
        c.recv(1, socket.MSG_PEEK)
    except TimeoutError:
        return True
    finally:
        c.settimeout(DEADLINE_S)
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Rig:
    """Makes doors for one test and stops everything they started afterwards (:meth:`close`)."""

    def __init__(self) -> None:
        self.made: list[tuple[Loop, Door | None, list[Upstream]]] = []

    def door(self, clock: Callable[[], float] | None = None, **frontdoor: Any) -> Door:
        """A front door serving a loopback socket in front of ``day`` (vllm, ``day-model``) and
        ``night`` (llama-server, ``night-model`` from the daemon's Models), both also taking the
        alias ``default``; the view says ``day`` serves."""
        loop = Loop()
        ups = [Upstream("day", loop), Upstream("night", loop), Upstream("evil", loop)]
        self.made.append((loop, None, ups))
        for u in ups:
            loop.run(_start_upstream(u))
        config = parse(config_text(ups[0].port, ups[1].port, **frontdoor))
        fd = FrontDoor(config, clock) if clock is not None else FrontDoor(config)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        port = sock.getsockname()[1]
        loop.run(fd.serve([sock]))
        door = Door(loop, fd, port, *ups)
        self.made[-1] = (loop, door, ups)
        door.update(active="day")
        return door

    def close(self) -> None:
        for loop, door, ups in self.made:
            with contextlib.suppress(Exception):
                if door is not None:
                    loop.run(door.fd.stop())
            for u in ups:
                if u.server is not None:
                    loop.call_threadsafe_close(u.server)
            loop.stop()

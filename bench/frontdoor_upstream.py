"""The upstream of the front door benchmarks: a fast OpenAI-shaped HTTP/1.1 server on raw asyncio.

Not a benchmark itself: bench/frontdoor_speed.py, frontdoor_stream.py and frontdoor_switch.py start it
as a process of its own (so that its CPU is not the proxy's) and put the front door, nginx, or nothing
(the direct baseline) in front of it::

    .venv/bin/python bench/frontdoor_upstream.py --port 18001 [--port 18002 ...] [--name a --name b]

Each ``--port`` is one listening address (127.0.0.1) and one backend; ``--name`` names them in order
(default ``a``, ``b``, ...), and its models are ``bench-NAME``.  It speaks keep-alive HTTP/1.1 with
``Content-Length`` request bodies, and answers:

    GET  /health                 200 ``{"status": "ok"}``
    GET  /v1/models              the backend's one model, OpenAI-shaped
    POST /v1/chat/completions    a small chat completion (about 300 bytes of JSON); with
    POST /v1/completions         ``"stream": true`` server-sent events instead (``Transfer-Encoding:
                                 chunked``, one HTTP chunk per event, like vLLM behind uvicorn):
                                 ``bench_chunks`` events (default 16) at ``bench_rate`` per second
                                 (default 50), then ``data: [DONE]``.  Every event carries ``"t"``,
                                 ``time.monotonic_ns()`` when it was handed to the socket, and ``"i"``,
                                 its index: a client on the same host subtracts it from its own
                                 monotonic clock (CLOCK_MONOTONIC, one clock for every process) to get
                                 the delay of that chunk.
    anything else                404

Each answer names the backend that gave it in ``x-bench-backend`` (the switch benchmark checks that a
held request went to the new backend).  The request body is parsed as JSON only on the streaming
routes; the body's ``model`` is not checked (the front door's rewrite of an alias is).

It prints ``ready`` on stdout once every port listens, and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import signal
import time

_REASON = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}


def _head(status: int, ctype: bytes, length: int | None, backend: bytes) -> bytes:
    framing = b"Content-Length: %d\r\n" % length if length is not None else b"Transfer-Encoding: chunked\r\n"
    return b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\n%sx-bench-backend: %s\r\n\r\n" % (
        status,
        _REASON.get(status, b"Status"),
        ctype,
        framing,
        backend,
    )


class Backend:
    """What one port answers: its name, its model, and the fixed bodies."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.bname = name.encode()
        self.model = f"bench-{name}"
        created = int(time.time())
        completion = {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "The quick brown fox jumps over the lazy dog.",
                    },
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 10, "total_tokens": 22},
        }
        self.small = self._full(200, json.dumps(completion).encode())
        self.health = self._full(200, b'{"status": "ok"}')
        models = {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "bench"}]}
        self.models = self._full(200, json.dumps(models).encode())
        self.not_found = self._full(404, b'{"error": {"message": "no such route", "type": "not_found"}}')
        self.bad = self._full(400, b'{"error": {"message": "bad request body", "type": "invalid_request"}}')
        self.sse_head = _head(200, b"text/event-stream", None, self.bname)
        self.sse_prefix = b'data: {"object":"chat.completion.chunk","model":"%s","i":' % self.model.encode()

    def _full(self, status: int, body: bytes) -> bytes:
        return _head(status, b"application/json", len(body), self.bname) + body


class Conn(asyncio.Protocol):
    """One client connection: requests in order, one at a time (no pipelining needed)."""

    def __init__(self, backend: Backend) -> None:
        self.b = backend
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.streaming = False
        self.pending: asyncio.Handle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while not self.streaming:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v.strip())
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4 : end + 4 + length])
            del self.buf[: end + 4 + length]
            self.answer(head.split(b" ", 2), body)

    def answer(self, line: list[bytes], body: bytes) -> None:
        assert self.transport is not None
        method, path = line[0], line[1] if len(line) > 1 else b""
        b = self.b
        if method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions"):
            if b'"stream"' in body:
                try:
                    req = json.loads(body)
                except ValueError:
                    self.transport.write(b.bad)
                    return
                if req.get("stream") is True:
                    self.stream(int(req.get("bench_chunks", 16)), float(req.get("bench_rate", 50)))
                    return
            self.transport.write(b.small)
        elif method == b"GET" and path == b"/health":
            self.transport.write(b.health)
        elif method == b"GET" and path == b"/v1/models":
            self.transport.write(b.models)
        else:
            self.transport.write(b.not_found)

    def stream(self, chunks: int, rate: float) -> None:
        """Send ``chunks`` events at ``rate``/s on a timer each (``call_at``, chained: no task per
        stream, one timer pending per stream); event i is due at start + i / rate."""
        assert self.transport is not None
        self.streaming = True
        self.transport.write(self.b.sse_head)
        loop = asyncio.get_running_loop()
        self.pending = loop.call_soon(self.send_chunk, loop, loop.time(), 0, chunks, rate)

    def send_chunk(
        self, loop: asyncio.AbstractEventLoop, t0: float, i: int, chunks: int, rate: float
    ) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        event = self.b.sse_prefix + b'%d,"t":%d,"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n' % (
            i,
            time.monotonic_ns(),
        )
        tail = b""
        if i == chunks - 1:
            tail = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
            self.streaming = False
            self.pending = None
        else:
            self.pending = loop.call_at(t0 + (i + 1) / rate, self.send_chunk, loop, t0, i + 1, chunks, rate)
        t.write(b"%x\r\n%s\r\n%s" % (len(event), event, tail))
        if tail and self.buf:
            self.data_received(b"")  # a request that came while streaming


async def serve(ports: list[int], names: list[str]) -> None:
    loop = asyncio.get_running_loop()
    servers = []
    for port, name in zip(ports, names, strict=True):
        b = Backend(name)
        servers.append(await loop.create_server(lambda b=b: Conn(b), "127.0.0.1", port, backlog=4096))
    print("ready", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for s in servers:
        s.close()


def raise_nofile() -> None:
    """As many open files as the hard limit allows (1,000 held requests are 1,000 sockets)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--port", type=int, action="append", required=True, help="a port on 127.0.0.1 (repeatable)"
    )
    ap.add_argument("--name", action="append", default=[], help="the backend's name for each port, in order")
    args = ap.parse_args()
    names = args.name or [chr(ord("a") + i) for i in range(len(args.port))]
    if len(names) != len(args.port):
        ap.error(f"{len(args.port)} --port but {len(names)} --name")
    raise_nofile()
    asyncio.run(serve(args.port, names))


if __name__ == "__main__":
    main()

"""The load generator of the front door benchmarks: a keep-alive HTTP/1.1 client on raw asyncio.

Not a benchmark itself (bench/frontdoor_speed.py and the others use it).  One
:class:`asyncio.Protocol` per connection, one request at a time on it, the response parsed as it
arrives (``Content-Length``, ``Transfer-Encoding: chunked``, or until the server closes): a few
microseconds of Python per request, so that one process drives well over 2,000 requests/s on one
core.  Every benchmark also runs the same load against the upstream directly, and that baseline's
rate shows the generator's own ceiling in the same run.

For a stream of server-sent events it reads the ``"t"`` stamp of each event (see
bench/frontdoor_upstream.py) and records ``monotonic_ns()`` at arrival − ``t``: the chunk's delay.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

_STAMP = re.compile(rb'"i":(\d+),"t":(\d+)')


class ConnError(Exception):
    """The connection failed or closed before the response was complete."""


@dataclass
class Response:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


class Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to ``host:port``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.fut: asyncio.Future[Response] | None = None
        self.on_data: Callable[[bytes, int], None] | None = None
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[bytes, bytes] = {}
        self.mode = ""  # "" head, "len" Content-Length, "chunk" chunked, "eof" until close
        self.left = 0
        self.body = bytearray()

    @classmethod
    async def open(cls, host: str, port: int) -> Conn:
        loop = asyncio.get_running_loop()
        _t, c = await loop.create_connection(cls, host, port)
        return c

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.fut is not None and not self.fut.done():
            if self.mode == "eof":
                self._finish()
            else:
                self.fut.set_exception(ConnError(f"connection closed ({exc or 'by the server'})"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def request(
        self, data: bytes, on_data: Callable[[bytes, int], None] | None = None
    ) -> asyncio.Future[Response]:
        """Send one request (its bytes, head and body); the future gets the response once complete.
        ``on_data(piece, arrival_ns)`` sees the body as it comes (the body is then not kept)."""
        if self.closed or self.transport is None:
            raise ConnError("connection closed")
        self._reset()
        self.on_data = on_data
        self.fut = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.fut

    def _finish(self) -> None:
        fut, self.fut = self.fut, None
        if fut is not None and not fut.done():
            fut.set_result(Response(self.status, self.headers, bytes(self.body)))
        if self.headers.get(b"connection", b"").lower() == b"close" and self.transport is not None:
            self.transport.close()

    def _body(self, piece: bytes, now: int) -> None:
        if self.on_data is not None:
            self.on_data(piece, now)
        else:
            self.body += piece

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        self.buf += data
        while self.buf and self.fut is not None:
            if not self._step(now):
                return

    def _step(self, now: int) -> bool:
        """Parse what the buffer holds; False when more bytes are needed."""
        buf = self.buf
        if self.mode == "":
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return False
            lines = bytes(buf[:end]).split(b"\r\n")
            del buf[: end + 4]
            self.status = int(lines[0].split(b" ", 2)[1])
            for line in lines[1:]:
                k, _, v = line.partition(b":")
                self.headers[k.strip().lower()] = v.strip()
            if b"chunked" in self.headers.get(b"transfer-encoding", b"").lower():
                self.mode, self.left = "chunk", -1
            elif b"content-length" in self.headers:
                self.mode, self.left = "len", int(self.headers[b"content-length"])
                if self.left == 0:
                    self._finish()
            else:
                self.mode = "eof"
            return True
        if self.mode == "len":
            take = bytes(buf[: self.left])
            del buf[: len(take)]
            self.left -= len(take)
            self._body(take, now)
            if self.left == 0:
                self._finish()
            return True
        if self.mode == "chunk":
            return self._chunk(now)
        self._body(bytes(buf), now)  # "eof"
        buf.clear()
        return False

    def _chunk(self, now: int) -> bool:
        buf = self.buf
        if self.left == -1:  # a size line
            end = buf.find(b"\r\n")
            if end < 0:
                return False
            size = int(bytes(buf[:end]).split(b";", 1)[0], 16)
            del buf[: end + 2]
            self.left = size if size else -2
            return True
        if self.left == -2:  # the last chunk: trailers end with an empty line
            end = buf.find(b"\r\n")
            if end < 0:
                return False
            del buf[: end + 2]
            if end == 0:
                self._finish()
            return True
        if len(buf) < self.left + 2:
            if len(buf) > 0 and self.left > len(buf):
                piece = bytes(buf)
                self.left -= len(piece)
                buf.clear()
                self._body(piece, now)
            return False
        self._body(bytes(buf[: self.left]), now)
        del buf[: self.left + 2]
        self.left = -1
        return True


def post(port: int, path: str, body: bytes, host: str = "127.0.0.1") -> bytes:
    """The bytes of a POST with a JSON body, as an OpenAI client sends it (with a bearer token)."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Accept: application/json\r\nAuthorization: Bearer sk-bench\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def chat(port: int, model: str, host: str = "127.0.0.1") -> bytes:
    body = b'{"model":"%s","messages":[{"role":"user","content":"Say something."}],"max_tokens":10}' % (
        model.encode()
    )
    return post(port, "/v1/chat/completions", body, host)


def chat_stream(port: int, model: str, chunks: int, rate: float, host: str = "127.0.0.1") -> bytes:
    body = (
        b'{"model":"%s","messages":[{"role":"user","content":"Say something."}],"stream":true,'
        b'"bench_chunks":%d,"bench_rate":%g}' % (model.encode(), chunks, rate)
    )
    return post(port, "/v1/chat/completions", body, host)


@dataclass
class Load:
    """What a closed-loop run measured."""

    latencies_ns: list[int] = field(default_factory=list)
    ok: int = 0
    failed: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def fail(self, why: str) -> None:
        self.failed += 1
        self.failures[why] = self.failures.get(why, 0) + 1

    @property
    def rate(self) -> float:
        return self.ok / self.elapsed_s if self.elapsed_s else 0.0


async def _client(
    port: int,
    req: bytes,
    deadline: float,
    out: Load,
    check: Callable[[Response], str | None] | None,
    interval_s: float = 0.0,
    phase_s: float = 0.0,
) -> None:
    conn: Conn | None = None
    due = time.monotonic() + phase_s
    while time.monotonic() < deadline:
        if interval_s:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            due += interval_s
        try:
            if conn is None or conn.closed:
                conn = await Conn.open("127.0.0.1", port)
            t0 = time.perf_counter_ns()
            r = await conn.request(req)
            dt = time.perf_counter_ns() - t0
        except (OSError, ConnError) as e:
            out.fail(type(e).__name__)
            conn = None
            await asyncio.sleep(0.01)
            continue
        why = f"HTTP {r.status}" if r.status != 200 else (check(r) if check else None)
        if why:
            out.fail(why)
        else:
            out.ok += 1
            out.latencies_ns.append(dt)
    if conn is not None:
        conn.close()


async def closed_loop(
    port: int,
    req: bytes,
    clients: int,
    duration_s: float,
    check: Callable[[Response], str | None] | None = None,
    rate_per_client: float = 0.0,
) -> Load:
    """``clients`` connections, each sending ``req`` again as soon as its answer is complete, for
    ``duration_s``: the latency of each request and the rate.  With ``rate_per_client``, paced
    instead: each client sends every 1/rate s (its first at a random phase), or as soon as its
    previous answer came when that was later (one request at a time per connection)."""
    out = Load()
    t0 = time.monotonic()
    interval = 1.0 / rate_per_client if rate_per_client else 0.0
    rnd = random.Random(16)
    await asyncio.gather(
        *(
            _client(port, req, t0 + duration_s, out, check, interval, rnd.uniform(0, interval))
            for _ in range(clients)
        )
    )
    out.elapsed_s = time.monotonic() - t0
    return out


@dataclass
class Streams:
    """What a run of concurrent streams measured."""

    delays_ns: list[int] = field(default_factory=list)
    expected: int = 0
    received: int = 0
    complete: int = 0  # streams that ended with [DONE] and every chunk in order
    failed: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0


async def _stream(port: int, req: bytes, chunks: int, start_in: float, out: Streams) -> None:
    await asyncio.sleep(start_in)
    seen = 0
    done = disorder = False
    tail = bytearray()
    delays = out.delays_ns

    def on_data(piece: bytes, now: int) -> None:
        nonlocal seen, done, disorder
        tail.extend(piece)
        cut = tail.rfind(b"\n\n")
        if cut < 0:
            return
        events = bytes(tail[: cut + 2])
        del tail[: cut + 2]
        for m in _STAMP.finditer(events):
            delays.append(now - int(m.group(2)))
            if int(m.group(1)) != seen:
                disorder = True
            seen += 1
        if b"data: [DONE]" in events:
            done = True

    try:
        conn = await Conn.open("127.0.0.1", port)
        r = await conn.request(req, on_data)
        conn.close()
    except (OSError, ConnError) as e:
        out.failed += 1
        out.failures[type(e).__name__] = out.failures.get(type(e).__name__, 0) + 1
        out.received += seen
        return
    out.received += seen
    if r.status == 200 and seen == chunks and done and not disorder:
        out.complete += 1
    else:
        why = f"HTTP {r.status}" if r.status != 200 else f"{seen} of {chunks} chunks"
        if disorder:
            why += ", out of order"
        out.failed += 1
        out.failures[why] = out.failures.get(why, 0) + 1


async def streams(port: int, model: str, n: int, rate: float, duration_s: float) -> Streams:
    """``n`` concurrent streams of ``rate`` chunks/s for ``duration_s`` (each one request of
    ``rate × duration_s`` chunks), their starts spread over one chunk interval (streams do not tick
    together)."""
    chunks = max(1, round(rate * duration_s))
    req = chat_stream(port, model, chunks, rate)
    out = Streams(expected=n * chunks)
    rnd = random.Random(19)
    t0 = time.monotonic()
    await asyncio.gather(*(_stream(port, req, chunks, rnd.uniform(0, 1 / rate), out) for _ in range(n)))
    out.elapsed_s = time.monotonic() - t0
    return out


def quantile(xs: list[int] | list[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``xs``; nan when empty."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return float(s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))])

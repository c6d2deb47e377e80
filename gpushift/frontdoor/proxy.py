"""One client request through the front door: read it (bounded), ask the core where it goes, hold
it, answer it, or forward it to a backend's loopback origin and stream the answer back.

Built on aiohttp's client (:class:`Upstream`): one session for every backend, which never follows a
redirect, never reads the environment's proxy settings, keeps no cookies between clients, adds no
header of its own (``User-Agent``, ``Accept``, ``Accept-Encoding``, ``Content-Type``) and never
decodes a body, so what the backend sends is what the client gets.  The URL is always the
backend's origin joined with the request's path: a Host header or an absolute request target
cannot change where it goes.

A response streams chunk by chunk as the backend writes it (server-sent events included); the
request body is read whole first (it is bounded by ``max_body_bytes``, and its ``model`` decides
where it goes).  A client that goes away cancels its handler (aiohttp's handler cancellation), and
that closes the connection to the backend: the backend sees its client gone and stops generating.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from gpushift.config.types import FrontDoorConfig
from gpushift.frontdoor import answers, routing, wire
from gpushift.frontdoor.answers import Answer
from gpushift.frontdoor.holding import Outcome
from gpushift.frontdoor.instances import PROBE_TIMEOUT_S, Probe
from gpushift.frontdoor.state import Backend, DoorState

log = structlog.get_logger("gpushift.frontdoor")

#: A health probe of the last serving backend while the daemon is lost (seconds).
HEALTH_TIMEOUT_S = 2.0

#: Methods never forwarded: CONNECT would make a tunnel, TRACE echoes the request.
REFUSED_METHODS = frozenset({"CONNECT", "TRACE"})

#: Read from the client in pieces of at most this many bytes.
READ_CHUNK = 64 * 1024

#: An answer with a Content-Length up to this is read whole and sent with its head in one write;
#: anything else (a stream, server-sent events) passes chunk by chunk as it comes.
WHOLE_MAX = 64 * 1024

#: The status an access line shows for a client that went away before its answer (nginx's 499).
CLIENT_GONE = 499

#: A connect that failed before any byte of the request was sent: safe to try on another instance.
CONNECT_FAILED = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)


class Upstream:
    """The aiohttp client session every forwarded request uses."""

    def __init__(self, settings: FrontDoorConfig) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=None, connect=settings.upstream_connect_timeout_s),
            auto_decompress=False,
            trust_env=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            requote_redirect_url=False,
        )

    async def healthy(self, backend: Backend) -> bool:
        """Whether ``backend``'s health URL answers 200 now (with instances: any instance's)."""
        if backend.instances:
            got = await asyncio.gather(
                *(self._health(i.origin, i.health_url, HEALTH_TIMEOUT_S) for i in backend.instances)
            )
            return 200 in got
        return await self._health(backend.origin, backend.health_url, HEALTH_TIMEOUT_S) == 200

    def instance_probe(self, backends: Mapping[str, Backend]) -> Probe:
        """The health probe of one instance of a backend of several: 2xx within the deadline."""

        async def probe(backend: str, i: int) -> bool:
            inst = backends[backend].instances[i]
            status = await self._health(inst.origin, inst.health_url, PROBE_TIMEOUT_S)
            return status is not None and 200 <= status < 300

        return probe

    async def _health(self, origin: wire.Origin, health_url: str, timeout_s: float) -> int | None:
        """The status the health URL answers at ``origin`` (None: no answer in ``timeout_s``)."""
        url = URL(origin.url).with_path(URL(health_url).path or "/")
        try:
            async with self.session.get(
                url, allow_redirects=False, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as r:
                return r.status
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return None

    async def close(self) -> None:
        await self.session.close()


class Exchange:
    """What the access line of one request says."""

    __slots__ = ("backend", "model", "held_s", "started")

    def __init__(self) -> None:
        self.backend = ""
        self.model: str | None = None
        self.held_s = 0.0
        self.started = time.monotonic()


def error_response(a: Answer, close: bool = False) -> web.Response:
    resp = web.Response(status=a.status, body=a.body_bytes(), headers=CIMultiDict(a.headers()))
    if close:
        resp.force_close()
    return resp


async def handle(fd: DoorState, upstream: Upstream, request: web.BaseRequest) -> web.StreamResponse:
    """The handler of every request the front door serves."""
    ex = Exchange()
    status = CLIENT_GONE
    try:
        resp = await _handle(fd, upstream, request, ex)
        status = resp.status
        return resp
    except (asyncio.CancelledError, ConnectionError):
        raise  # the client went away
    except Exception as e:  # never a crash: the client gets a 500 and the log says why
        log.exception("frontdoor_request_failed", path=request.rel_url.path[:256], error=str(e))
        if request.writer.output_size > 0:
            raise
        status = 500
        return error_response(answers.internal(type(e).__name__), close=True)
    finally:
        fd.observer.done(
            request.method,
            request.rel_url.path,
            status,
            ex.backend,
            ex.model,
            ex.held_s,
            time.monotonic() - ex.started,
        )


async def _handle(
    fd: DoorState, upstream: Upstream, request: web.BaseRequest, ex: Exchange
) -> web.StreamResponse:
    if request.method in REFUSED_METHODS:
        return error_response(answers.bad_method(request.method), close=True)
    problem = wire.path_problem(request.rel_url.raw_path)
    if problem is not None:
        return error_response(answers.bad_request(problem, "invalid_path"))
    path = request.rel_url.path
    if (path == "/v1/models" or path.startswith("/v1/models/")) and request.method in ("GET", "HEAD"):
        return _models(fd, path)
    if not wire.forwarded(path, fd.native_routes()):
        return error_response(answers.no_route(path, fd.native_routes()))
    body = await read_body(fd.settings, request)
    if isinstance(body, Answer):
        return error_response(body, close=True)
    parsed = wire.read_body(
        body, path, request.headers.get("Content-Type", ""), request.headers.get("Content-Encoding", "")
    )
    if parsed.code == "invalid_model":
        return error_response(answers.not_a_string(parsed.bad_model))
    if parsed.problem:
        return error_response(answers.bad_request(parsed.problem, parsed.code))
    ex.model = parsed.model
    outcome = await _decide(fd, parsed.model, ex)
    if isinstance(outcome, Answer):
        return error_response(outcome)
    d = outcome.decision
    if d.action != routing.FORWARD:
        return error_response(fd.answer(d, parsed.model, outcome.released_from))
    ex.backend = d.backend
    try:
        backend = fd.backends[d.backend]
        if not wire.forwarded(path, backend.native):
            return error_response(answers.no_route(path, backend.native))
        if d.rewrite is not None and parsed.document is not None:
            body = wire.with_model(parsed.document, d.rewrite)
        return await forward(fd, upstream, backend, request, body)
    finally:
        fd.finished(d.backend)


async def _decide(fd: DoorState, model: str | None, ex: Exchange) -> Outcome | Answer:
    d = fd.admit(model)
    if d.action != routing.HOLD:
        return Outcome(d)
    outcome, ex.held_s = await fd.hold(model, d.backend)
    return outcome


def _models(fd: DoorState, path: str) -> web.Response:
    s = fd.situation()
    serving = s.fallback if not s.view.connected else (s.view.active if s.view.active in fd.backends else "")
    doc = answers.models_list(fd.names, fd.view, serving, {b.name: b.kind for b in fd.backends.values()})
    if path == "/v1/models":
        return web.json_response(doc)
    wanted = path[len("/v1/models/") :]
    for m in doc["data"]:
        if m["id"] == wanted:
            return web.json_response(m)
    return error_response(answers.unknown_model(fd.names, wanted))


async def read_body(settings: FrontDoorConfig, request: web.BaseRequest) -> bytes | Answer:
    """The whole request body, or the 413 / 408 that ends the request (``max_body_bytes``,
    ``body_timeout_s``)."""
    limit = settings.max_body_bytes
    length = request.content_length
    if length is not None and length > limit:
        return answers.too_large(limit)
    if not request.body_exists:
        return b""
    if length is not None and request.content.is_eof():
        # The whole body came with the head (the usual small request): no deadline task to run.
        return await request.content.read()
    if request.headers.get("Expect", "").lower() == "100-continue" and request.version >= (1, 1):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    try:
        return await asyncio.wait_for(_read_bounded(request, limit), settings.body_timeout_s)
    except asyncio.TimeoutError:
        return answers.timed_out("body", settings.body_timeout_s)
    except _TooLarge:
        return answers.too_large(limit)


class _TooLarge(Exception):
    pass


async def _read_bounded(request: web.BaseRequest, limit: int) -> bytes:
    if not request.body_exists:
        return b""
    parts: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.read(READ_CHUNK)
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        parts.append(chunk)


async def forward(
    fd: DoorState, upstream: Upstream, backend: Backend, request: web.BaseRequest, body: bytes
) -> web.StreamResponse:
    """Send the request to ``backend``'s origin (with instances: to one of them) and stream its
    answer back."""
    if backend.name in fd.pools:
        return await _forward_balanced(fd, upstream, backend, request, body)
    url = _url(backend.origin, request.rel_url)
    headers = CIMultiDict(wire.request_headers(request.headers.items()))
    try:
        up = await upstream.session.request(
            request.method, url, headers=headers, data=body if body else None, allow_redirects=False
        )
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
        fd.observer.upstream_errors.labels(backend.name, _reason(e)).inc()
        log.warning("frontdoor_upstream_failed", backend=backend.name, error=_reason(e))
        return error_response(answers.upstream_failed(backend.name, _reason(e)))
    try:
        return await _relay(fd, backend, request, up)
    finally:
        up.close()


def _url(o: wire.Origin, rel: URL) -> URL:
    """``rel``'s path and query at the origin ``o``: nothing of the request can name another host."""
    return URL.build(
        scheme=o.scheme,
        host=o.host,
        port=o.port,
        path=rel.raw_path,
        query_string=rel.raw_query_string,
        encoded=True,
    )


async def _forward_balanced(
    fd: DoorState, upstream: Upstream, backend: Backend, request: web.BaseRequest, body: bytes
) -> web.StreamResponse:
    """A backend of several instances: to the one the picker names; a connect refused (nothing
    sent yet) is tried again at once on another; a request that failed after it was sent is a 502
    (or a broken stream), counted for its instance (``instances.py``)."""
    pools, name = fd.pools, backend.name
    headers = CIMultiDict(wire.request_headers(request.headers.items()))
    tried: set[int] = set()
    reason = "no instance"
    while (i := pools.pick(name, tried)) is not None:
        inst = backend.instances[i]
        pools.begin(name, i)
        try:
            try:
                up = await upstream.session.request(
                    request.method,
                    _url(inst.origin, request.rel_url),
                    headers=headers,
                    data=body if body else None,
                    allow_redirects=False,
                )
            except CONNECT_FAILED as e:
                reason = _reason(e)
                pools.refused(name, i, reason)
                log.warning("frontdoor_instance_refused", backend=name, instance=inst.name, error=reason)
                tried.add(i)
                continue
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
                reason = _reason(e)
                pools.broke(name, i, reason)
                fd.observer.upstream_errors.labels(name, reason).inc()
                log.warning("frontdoor_upstream_failed", backend=name, instance=inst.name, error=reason)
                return error_response(answers.upstream_failed(name, reason))
            try:
                return await _relay(fd, backend, request, up, functools.partial(pools.broke, name, i))
            finally:
                up.close()
        finally:
            pools.end(name, i)
    fd.observer.upstream_errors.labels(name, reason).inc()
    log.warning("frontdoor_upstream_failed", backend=name, error=reason)
    return error_response(answers.upstream_failed(name, reason))


async def _relay(
    fd: DoorState,
    backend: Backend,
    request: web.BaseRequest,
    up: aiohttp.ClientResponse,
    broke: Callable[[str], None] | None = None,
) -> web.StreamResponse:
    pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in up.raw_headers]
    headers = CIMultiDict(wire.response_headers(pairs))
    length = up.content_length
    if (
        length is not None
        and length <= WHOLE_MAX
        and request.method != "HEAD"
        and up.status not in (204, 304)
    ):
        try:  # a small answer of known length: sent in one piece with its head
            body = await up.content.readexactly(length)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
            fd.observer.upstream_errors.labels(backend.name, _reason(e)).inc()
            if broke is not None:
                broke(_reason(e))
            return error_response(answers.upstream_failed(backend.name, _reason(e)))
        return web.Response(status=up.status, reason=up.reason, body=body, headers=headers)
    resp = web.StreamResponse(status=up.status, reason=up.reason, headers=headers)
    await resp.prepare(request)
    while True:
        try:
            chunk = await up.content.readany()
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            fd.observer.upstream_errors.labels(backend.name, _reason(e)).inc()
            log.warning("frontdoor_upstream_broke", backend=backend.name, error=_reason(e))
            if broke is not None:
                broke(_reason(e))
            _abort(request)  # the client must see a broken answer, not a complete one
            return resp
        if not chunk:
            break
        await resp.write(chunk)  # a client gone raises here (a ConnectionError): nothing to answer
    await resp.write_eof()
    return resp


def _abort(request: web.BaseRequest) -> None:
    protocol: Any = request.protocol
    protocol.force_close()


def _reason(e: BaseException) -> str:
    if isinstance(e, asyncio.TimeoutError):
        return "timeout"
    if isinstance(e, aiohttp.ClientConnectorError):  # a label value: the errno's name, never an address
        code = e.os_error.errno
        name = errno.errorcode.get(code) if code is not None else None
        return f"connect: {name or type(e.os_error).__name__}"
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return "disconnected"
    return type(e).__name__

"""The front door's sockets: aiohttp's low-level HTTP server behind our own accept loop.

* **Sockets.** Given sockets (systemd's, socket activation) are served as they are; without them
  each ``[frontdoor] listen`` address is bound (``[::]`` dual-stack: IPv4 too).
* **Connections.** At most ``max_connections`` at once: the accept loop takes the next connection
  only when one is free, so the others wait in the kernel's backlog instead of being refused.
* **Deadlines per phase.** A request's head (line and headers) must arrive within
  ``header_timeout_s`` of the connection's start or of its first byte (a 408, then the connection
  closes); its body within ``body_timeout_s`` (``proxy.read_body``); a kept-alive connection with no
  request is closed after ``idle_timeout_s`` (aiohttp's ``keepalive_timeout``).  aiohttp's own
  limits bound the head's size (a line or field over 8190 bytes, or over 128 fields, is a 400).
* **Metrics.** ``metrics_listen``, when set, serves ``/metrics`` from the front door's registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import Callable
from typing import Any

import structlog
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gpushift.config.types import split_listen
from gpushift.frontdoor import answers
from gpushift.frontdoor.observe import CONTENT_TYPE
from gpushift.frontdoor.proxy import Upstream, handle
from gpushift.frontdoor.state import DoorState

log = structlog.get_logger("gpushift.frontdoor")

#: The listen() backlog of the sockets the front door binds itself.
BACKLOG = 1024

#: How long stop() lets the requests in flight finish before it ends their connections.
SHUTDOWN_S = 5.0

#: After an answer to a request whose body was not read (a 413, a 408), unread bytes are read and
#: dropped for at most this long before the connection closes, so that the close does not reset
#: the connection under the client before it read the answer (aiohttp's lingering close; its
#: default of 10 s would keep a hostile client's connection open that long).
LINGER_S = 2.0

#: After accept() failed (out of file descriptors, ...), wait this long before the next try.
ACCEPT_PAUSE_S = 0.1

#: At a stop, how long a connection accepted just before may take to deliver its first request:
#: its client sent it to a socket that was listening, so it is answered, not reset (closing a
#: connection with its request unread makes the kernel send a reset; a restart under socket
#: activation must lose no request).
FIRST_REQUEST_GRACE_S = 2.0


def bind(address: str) -> socket.socket:
    """A listening socket on ``HOST:PORT`` (``[::]`` takes IPv4 too)."""
    host, port = split_listen(address)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if family == socket.AF_INET and not host.replace(".", "").isdigit():
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, host = infos[0][0], str(infos[0][4][0])
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def shown_address(sock: socket.socket) -> str:
    name = sock.getsockname()
    host, port = str(name[0]), int(name[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _timeout_answer(limit_s: float) -> bytes:
    a = answers.timed_out("head (request line and headers)", limit_s)
    body = a.body_bytes()
    return (
        b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nConnection: close\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


class FrontProtocol(RequestHandler):
    """aiohttp's connection handler with the head deadline and the connection slot."""

    def __init__(self, manager: Any, *, network: Network, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._network = network
        self._head_timer: asyncio.TimerHandle | None = None
        self._busy = False
        self._heads = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self._busy and self._head_timer is None:
            self._arm()
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        try:
            super().connection_lost(exc)
        finally:
            self._network.connection_gone()

    def head_arrived(self) -> None:
        self._busy = True
        self._heads += 1
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def request_done(self) -> None:
        self._busy = False

    def awaiting_first_request(self) -> bool:
        """Accepted, open, and no request's head has arrived on it yet."""
        return self._heads == 0 and not self._busy and self.transport is not None

    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        """A request aiohttp could not parse (or a handler's bug): an OpenAI-format error, a log line
        without a traceback for a client's mistake, and the connection closed after it."""
        if request.writer.output_size > 0:
            raise ConnectionError("the answer was started already: the connection is ended instead")
        text = message or (str(exc) if exc is not None else "") or "bad request"
        if status >= 500:
            log.error("frontdoor_http_error", status=status, error=repr(exc))
            a = answers.internal(type(exc).__name__ if exc is not None else "unknown")
        else:
            log.info("frontdoor_bad_http", status=status, error=text[:200])
            a = answers.bad_http(status, text[:200])
        self._network.fd.observer.done("-", "-", a.status, "", None, 0.0, 0.0)
        resp = web.Response(status=a.status, body=a.body_bytes(), headers=dict(a.headers()))
        resp.force_close()
        return resp

    def _arm(self) -> None:
        limit = self._network.fd.settings.header_timeout_s
        self._head_timer = self._loop.call_later(limit, self._head_late, self._heads)

    def _head_late(self, heads_then: int) -> None:
        self._head_timer = None
        if self._busy or self._heads != heads_then or self.transport is None:
            return
        with contextlib.suppress(Exception):
            self.transport.write(_timeout_answer(self._network.fd.settings.header_timeout_s))
        self.force_close()


class _Server(web.Server):
    """aiohttp's low-level server making our connection handler."""

    def __init__(self, handler: Any, network: Network, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._network = network

    def __call__(self) -> RequestHandler:
        return FrontProtocol(self, network=self._network, loop=self._loop, **self._kwargs)


class Network:
    """The listening sockets, their accept loops, the HTTP server and the upstream client."""

    def __init__(self, fd: DoorState) -> None:
        self.fd = fd
        s = fd.settings
        self.upstream = Upstream(s)
        self.server = _Server(
            self._handle,
            self,
            handler_cancellation=True,
            keepalive_timeout=s.idle_timeout_s,
            auto_decompress=False,
            access_log=None,
            lingering_time=LINGER_S,
        )
        self._slots = asyncio.Semaphore(s.max_connections)
        self._sockets: list[socket.socket] = []
        self._accepting: list[asyncio.Task[None]] = []
        self._closing = asyncio.Event()
        self._metrics: asyncio.AbstractServer | None = None
        self.addresses: list[str] = []

    async def start(self, sockets: list[socket.socket] | None) -> None:
        if sockets is None:
            sockets = []
            try:
                for a in self.fd.settings.listen:
                    sockets.append(bind(a))
            except OSError:
                for sock in sockets:
                    sock.close()
                raise
        loop = asyncio.get_running_loop()
        for sock in sockets:
            sock.setblocking(False)
            self._sockets.append(sock)
            self.addresses.append(shown_address(sock))
            self._accepting.append(loop.create_task(self._accept(sock)))
        if self.fd.settings.metrics_listen:
            self._metrics = await loop.create_server(
                web.Server(self._metrics_page, keepalive_timeout=15, access_log=None),
                sock=bind(self.fd.settings.metrics_listen),
            )
        log.info(
            "frontdoor_listening", listen=self.addresses, metrics=self.fd.settings.metrics_listen or None
        )

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        protocol: Any = request.protocol
        protocol.head_arrived()
        try:
            page = getattr(self.fd, "status_page", None)  # /gpushift/: frontdoor/page.py
            if page is not None and page.wants(request.rel_url.path):
                answer: web.StreamResponse = await page.handle(request)
                return answer
            return await handle(self.fd, self.upstream, request)
        finally:
            protocol.request_done()

    async def _metrics_page(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.rel_url.path != "/metrics":
            return web.Response(status=404, text="only /metrics here\n")
        return web.Response(body=self.fd.observer.page(), headers={"Content-Type": CONTENT_TYPE})

    async def _accept(self, sock: socket.socket) -> None:
        """Accept until :meth:`stop`.  The stop is an event, not a cancel: a task cancelled just as
        its accept() completed would lose that connection (reset, its request unread)."""
        loop = asyncio.get_running_loop()
        factory: Callable[[], asyncio.Protocol] = self.server
        while not self._closing.is_set():
            await self._slots.acquire()  # a cancel here (stop() with every slot taken) accepted nothing
            accepting = asyncio.ensure_future(loop.sock_accept(sock))
            closing = asyncio.ensure_future(self._closing.wait())
            await asyncio.wait({accepting, closing}, return_when=asyncio.FIRST_COMPLETED)
            closing.cancel()
            if not accepting.done():  # stop() came first: nothing was accepted
                accepting.cancel()
                self._slots.release()
                with contextlib.suppress(asyncio.CancelledError, OSError):
                    await accepting
                return
            try:
                conn, _ = accepting.result()
            except OSError as e:
                self._slots.release()
                if e.errno in (errno.EBADF, errno.EINVAL, errno.ENOTSOCK):
                    return  # the socket was closed (stop)
                log.warning("frontdoor_accept_failed", error=e.strerror or str(e))
                await asyncio.sleep(ACCEPT_PAUSE_S)
                continue
            try:
                if conn.family in (socket.AF_INET, socket.AF_INET6):
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.connect_accepted_socket(factory, conn)
            except (OSError, RuntimeError) as e:
                log.warning("frontdoor_connection_failed", error=str(e))
                conn.close()
                self._slots.release()

    def connection_gone(self) -> None:
        self._slots.release()

    async def _first_requests(self, grace_s: float) -> None:
        """Wait, at most ``grace_s``, until no connection is still to deliver its first request."""
        loop = asyncio.get_running_loop()
        end = loop.time() + grace_s
        while loop.time() < end and any(
            isinstance(c, FrontProtocol) and c.awaiting_first_request() for c in self.server.connections
        ):
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self._closing.set()
        if self._accepting:
            _done, stuck = await asyncio.wait(self._accepting, timeout=1.0)
            for t in stuck:  # waiting for a free slot: nothing accepted, a cancel loses nothing
                t.cancel()
            for t in self._accepting:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        for sock in self._sockets:
            sock.close()
        if self._metrics is not None:
            self._metrics.close()
        await self._first_requests(FIRST_REQUEST_GRACE_S)
        self.server.pre_shutdown()  # idle keep-alive connections close now, busy ones after their answer
        await self.server.shutdown(SHUTDOWN_S)
        await self.upstream.close()

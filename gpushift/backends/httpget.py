"""One HTTP GET under a TOTAL deadline and a bound on what is read — the only way gpushift
asks a backend's HTTP endpoints (health, version, in-flight requests).

``urllib``'s ``timeout`` bounds each socket operation, not the request: a server that trickles one
byte every second holds a caller with a 2 s timeout for as long as it likes (reading the status
line and the headers alone is one ``recv`` per byte).  Here every step — connect, TLS handshake,
send, each ``recv`` — runs with the socket's timeout set to the time LEFT until one deadline taken
at the start, so the whole request ends by ``timeout_s`` whatever the server does.  (Since Python
3.5, ``sendall`` and the TLS handshake treat the timeout as their total duration.)  Reading stops
at ``limit_bytes`` of body.

Not under the deadline: resolving the host name (``getaddrinfo`` has no timeout); health URLs name
an address or ``localhost``, which resolve locally.

HTTP/1.1 with ``Connection: close``: the body ends at ``Content-Length``, at the last chunk of a
chunked answer, or when the server closes.  User information in the URL
(``http://user:pass@host/``) is sent as Basic authentication, never as part of the request line.
"""

from __future__ import annotations

import base64
import socket
import ssl
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

#: Most bytes of status line and headers accepted.
HEADER_LIMIT_BYTES = 64 * 1024
_RECV_BYTES = 65536


@dataclass(frozen=True)
class Response:
    """An HTTP answer: status, body (at most the limit), and whether the body was cut there."""

    status: int
    body: bytes
    truncated: bool = False


class DeadlineExceeded(TimeoutError):
    """No complete answer before the deadline."""


def get(
    url: str, timeout_s: float, limit_bytes: int = 1 << 20, headers: Mapping[str, str] | None = None
) -> Response:
    """GET ``url``; the whole exchange ends within ``timeout_s`` seconds.  ``headers``: more
    request headers (a backend's ``Authorization``); a name or value with a line break is refused.

    Raises:
        DeadlineExceeded: no complete answer (status, headers and body up to the limit) in time.
        OSError: no connection (refused, unreachable, name not known), or it broke.
        ValueError: not an http(s) URL, or what came back is not HTTP.
    """
    deadline = time.monotonic() + timeout_s
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {parts.scheme or '?'}://{parts.hostname or '?'}")
    port = parts.port or (443 if parts.scheme == "https" else 80)  # ValueError for a bad port
    sock = _connect(parts.hostname, port, deadline, timeout_s)
    try:
        if parts.scheme == "https":
            ctx = ssl.create_default_context()
            _left(sock, deadline, timeout_s)
            sock = ctx.wrap_socket(sock, server_hostname=parts.hostname)
        _left(sock, deadline, timeout_s)
        sock.sendall(_request(parts, port, headers or {}))
        return _read(sock, deadline, timeout_s, limit_bytes)
    except TimeoutError:
        raise DeadlineExceeded(f"no complete answer within {timeout_s:g} s") from None
    finally:
        sock.close()


def _left(sock: socket.socket, deadline: float, timeout_s: float) -> None:
    """Set the socket's timeout to the time left; raise when none is."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise DeadlineExceeded(f"no complete answer within {timeout_s:g} s")
    sock.settimeout(left)


def _connect(host: str, port: int, deadline: float, timeout_s: float) -> socket.socket:
    last: OSError | None = None
    for family, kind, proto, _name, addr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            _left(sock, deadline, timeout_s)
            sock.connect(addr)
            return sock
        except TimeoutError:  # DeadlineExceeded too: it is a TimeoutError
            sock.close()
            raise DeadlineExceeded(f"no connection within {timeout_s:g} s") from None
        except OSError as e:  # refused, unreachable: the next address may answer
            sock.close()
            last = e
    raise last or OSError(f"{host}: no address")


def _request(parts: urllib.parse.SplitResult, port: int, headers: Mapping[str, str]) -> bytes:
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    default = 443 if parts.scheme == "https" else 80
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {host}" + ("" if port == default else f":{port}"),
        "User-Agent: gpushift",
        "Accept: */*",
        "Accept-Encoding: identity",
        "Connection: close",
    ]
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        lines.append(f"Authorization: Basic {token}")
    for name, value in headers.items():
        if any(c in name + value for c in "\r\n\0") or not name or ":" in name:
            raise ValueError(f"request header {name!r}: a name or value that would break the request")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "strict")


def _read(sock: socket.socket, deadline: float, timeout_s: float, limit: int) -> Response:
    raw = b""
    head: tuple[int, dict[str, str]] | None = None
    start = 0
    while True:
        if head is None:
            end = raw.find(b"\r\n\r\n")
            if end >= 0:
                head, start = _parse_head(raw[:end]), end + 4
            elif len(raw) > HEADER_LIMIT_BYTES:
                raise ValueError(f"HTTP headers longer than {HEADER_LIMIT_BYTES} bytes")
        if head is not None:
            body, complete = _body(head, raw[start:], limit)
            if complete or len(body) >= limit:
                return Response(head[0], body[:limit], truncated=len(body) >= limit and not complete)
        _left(sock, deadline, timeout_s)
        chunk = sock.recv(_RECV_BYTES)
        if not chunk:  # the server closed: what came is the answer
            if head is None:
                raise ValueError("the connection closed before an HTTP status line")
            body, _complete = _body(head, raw[start:], limit, closed=True)
            return Response(head[0], body[:limit], truncated=len(body) > limit)
        raw += chunk


def _parse_head(data: bytes) -> tuple[int, dict[str, str]]:
    lines = data.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/") or not code.isdigit():
        raise ValueError(f"not an HTTP status line: {lines[0][:60]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(code), headers


def _body(
    head: tuple[int, dict[str, str]], data: bytes, limit: int, closed: bool = False
) -> tuple[bytes, bool]:
    """(body so far, whether it is complete) from the bytes after the headers."""
    status, headers = head
    if status in (204, 304) or 100 <= status < 200:
        return b"", True
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _dechunk(data)
    length = headers.get("content-length")
    if length is not None and length.strip().isdigit():
        n = int(length)
        return data[:n], len(data) >= n
    return data, closed  # the body ends when the server closes


def _dechunk(data: bytes) -> tuple[bytes, bool]:
    """A chunked body decoded as far as it has arrived; True once the last chunk (size 0) did."""
    out = bytearray()
    i = 0
    while True:
        eol = data.find(b"\r\n", i)
        if eol < 0:
            return bytes(out), False
        size_text = data[i:eol].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ValueError(f"bad chunk size {size_text[:20]!r}") from None
        if size == 0:
            return bytes(out), True
        begin = eol + 2
        piece = data[begin : begin + size]
        out += piece
        if len(piece) < size or len(data) < begin + size + 2:
            return bytes(out), False
        i = begin + size + 2

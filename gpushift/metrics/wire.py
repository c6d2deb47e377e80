"""HTTP/1.x on the wire for the ``/metrics`` listener: a request's head read from bytes, a response
made into bytes.

Pure: no socket here (:mod:`gpushift.metrics.listener` owns them).  The head is bounded
(:data:`MAX_HEAD_BYTES`, :data:`MAX_HEADERS`), and so is a body (:data:`MAX_BODY_BYTES`, given by
``Content-Length`` only: a chunked body is refused); every response closes its connection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

#: The most bytes a request's head (request line, headers, the blank line) may take.
MAX_HEAD_BYTES = 16 * 1024
#: The most header lines a request may have.
MAX_HEADERS = 100
#: The most bytes of a request's body (a scrape has none; it is read and ignored).
MAX_BODY_BYTES = 64 * 1024

_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


@dataclass(frozen=True)
class Request:
    """A request's head, as read: ``headers`` with their names in lower case, in their order."""

    method: str
    path: str  # percent-decoded (latin-1), as WSGI's PATH_INFO
    query: str
    version: str
    headers: tuple[tuple[str, str], ...]
    head_length: int  # the head's bytes, the blank line included: the body starts there
    body_length: int

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)


@dataclass(frozen=True)
class Refusal:
    """A request that is answered with an error and not passed on: its status and why."""

    status: str
    reason: str


def head_end(data: bytes | bytearray, start: int = 0) -> int | None:
    """Where the head ends in ``data`` (the index after its blank line), or None while it has not;
    ``start``: where to look from (bytes already looked at, less the 3 a blank line may span)."""
    ends = [i + n for i, n in ((data.find(b"\r\n\r\n", start), 4), (data.find(b"\n\n", start), 2)) if i >= 0]
    return min(ends) if ends else None


def parse_head(data: bytes) -> Request | Refusal | None:
    """The request whose head ``data`` starts with; None while the head is not complete (and
    still within :data:`MAX_HEAD_BYTES`); a :class:`Refusal` for a head that cannot be served."""
    end = head_end(data)
    if (end is None and len(data) > MAX_HEAD_BYTES) or (end is not None and end > MAX_HEAD_BYTES):
        return Refusal("431 Request Header Fields Too Large", f"head over {MAX_HEAD_BYTES} bytes")
    if end is None:
        return None
    lines = data[:end].decode("latin-1").split("\n")
    lines = [line[:-1] if line.endswith("\r") else line for line in lines][:-2]
    parts = lines[0].split(" ") if lines else []
    if len(parts) != 3 or not parts[0] or not set(parts[0]) <= _TOKEN:
        return Refusal("400 Bad Request", "malformed request line")
    method, target, version = parts
    if not version.startswith("HTTP/1."):
        return Refusal("505 HTTP Version Not Supported", f"version {version[:20]!r}")
    headers = _headers(lines[1:])
    if isinstance(headers, Refusal):
        return headers
    length = _body_length(dict(headers), [v for k, v in headers if k == "content-length"])
    if isinstance(length, Refusal):
        return length
    split = urlsplit(target)
    if not split.path.startswith("/") and target != "*":
        return Refusal("400 Bad Request", "malformed request target")
    return Request(method, unquote(split.path, "latin-1"), split.query, version, headers, end, length)


def _headers(lines: Sequence[str]) -> tuple[tuple[str, str], ...] | Refusal:
    if len(lines) > MAX_HEADERS:
        return Refusal("431 Request Header Fields Too Large", f"over {MAX_HEADERS} headers")
    out = []
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name or not set(name) <= _TOKEN:  # also an obsolete folded line
            return Refusal("400 Bad Request", "malformed header line")
        out.append((name.lower(), value.strip(" \t")))
    return tuple(out)


def _body_length(headers: dict[str, str], lengths: Sequence[str]) -> int | Refusal:
    if "transfer-encoding" in headers:
        return Refusal("501 Not Implemented", "a request body must come with Content-Length")
    if not lengths:
        return 0
    if len(set(lengths)) != 1 or not lengths[0].isdigit() or not lengths[0].isascii():
        return Refusal("400 Bad Request", "malformed Content-Length")
    length = int(lengths[0])
    if length > MAX_BODY_BYTES:
        return Refusal("413 Content Too Large", f"body over {MAX_BODY_BYTES} bytes")
    return length


def response(status: str, headers: Sequence[tuple[str, str]], body: bytes, head_only: bool = False) -> bytes:
    """The bytes of a response that closes its connection (``head_only``: without the body, as
    the answer to HEAD)."""
    lines = [f"HTTP/1.1 {status}"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() not in ("content-length", "connection")]
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + (b"" if head_only else body)


def refusal_response(refusal: Refusal) -> bytes:
    """The answer to a refused request: its status, and why in a line of text."""
    body = f"{refusal.status}: {refusal.reason}\n".encode("latin-1", "replace")
    return response(refusal.status, [("Content-Type", "text/plain; charset=utf-8")], body)

"""The HTTP rules of forwarding, as plain functions: which headers pass, which routes are
forwarded, and how a request body names its model.

Pure.  Headers:

* hop-by-hop fields are dropped both ways (RFC 9110 §7.6.1: ``Connection`` and every field it
  names, ``Keep-Alive``, ``Proxy-Connection``, ``TE``, ``Transfer-Encoding``, ``Upgrade``; also
  ``Trailer`` and ``Proxy-*``, which answer to this hop only); everything else, ``Authorization``
  included, passes;
* toward a backend also ``Host`` (the backend's own origin is sent), ``Content-Length`` (the body
  is sent whole, its length computed again) and ``Expect`` (the front door answered it).

Routes: the OpenAI routes (``/v1/...``) of every kind, and a kind's own routes
(:attr:`gpushift.backends.kind.Kind.native_routes`, e.g. llama-server's ``/completion``).

Bodies: a JSON object's ``model``; a body that is not JSON is passed on unchanged as naming no model,
except on the routes whose body must be a JSON object (:data:`JSON_ROUTES`: 400 naming the
problem); a ``model`` that is not a string is a 400.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

#: Hop-by-hop fields (lower case).
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"}
)
#: Dropped toward a backend besides the hop-by-hop ones.
NOT_FORWARDED = frozenset({"host", "content-length", "expect"})

#: The OpenAI routes whose body must be a JSON object naming the model.
JSON_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/moderations",
        "/v1/rerank",
        "/v1/score",
    }
)

#: Encoded characters a forwarded path may not hold: an encoded ``.``, ``/`` or ``\`` could be
#: decoded by a backend into a route outside the ones forwarded.
_ENCODED_SEPARATORS = ("%2e", "%2f", "%5c")


def _named_by_connection(headers: Iterable[tuple[str, str]]) -> set[str]:
    named: set[str] = set()
    for k, v in headers:
        if k.lower() == "connection":
            named.update(t.strip().lower() for t in v.split(",") if t.strip())
    return named


def end_to_end(
    headers: Iterable[tuple[str, str]], also: frozenset[str] = frozenset()
) -> list[tuple[str, str]]:
    """``headers`` less the hop-by-hop ones (and ``also``, lower-case names), order kept."""
    pairs = list(headers)
    drop = HOP_BY_HOP | _named_by_connection(pairs) | also
    return [(k, v) for k, v in pairs if (lk := k.lower()) not in drop and not lk.startswith("proxy-")]


def request_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """A client's request headers as sent to the backend."""
    return end_to_end(headers, NOT_FORWARDED)


def response_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """A backend's response headers as sent to the client."""
    return end_to_end(headers)


def path_problem(raw_path: str) -> str | None:
    """Why a request's path is not forwarded as it is (None: it may be)."""
    if not raw_path.startswith("/") or raw_path.startswith("//"):
        return "the request target must be a path starting with a single '/'"
    low = raw_path.lower()
    if any(e in low for e in _ENCODED_SEPARATORS) or "\\" in raw_path:
        return "an encoded '.', '/' or '\\' in the path is not forwarded"
    if any(seg in (".", "..") for seg in raw_path.split("?", 1)[0].split("/")):
        return "a '.' or '..' segment in the path is not forwarded"
    return None


def forwarded(path: str, native: frozenset[str]) -> bool:
    """Whether ``path`` (decoded, normalised) is a route the front door forwards."""
    return path.startswith("/v1/") or path in native


@dataclass(frozen=True)
class Body:
    """What a request body says about its model."""

    model: str | None = None  # the model it names (None: none, or none readable)
    document: dict[str, Any] | None = None  # the JSON object, when it is one
    problem: str = ""  # a 400's message ("" when the body may be forwarded)
    bad_model: Any = None  # the non-string model, for the 400
    code: str = ""  # the 400's code


def _json_type(content_type: str) -> bool:
    mime = content_type.split(";", 1)[0].strip().lower()
    return mime in ("", "application/json") or mime.endswith("+json")


def read_body(body: bytes, path: str, content_type: str, content_encoding: str) -> Body:
    """The model a body names.

    Args:
        body: the whole request body (already bounded by ``max_body_bytes``).
        path: the route (decides whether a body that is not JSON is a 400).
        content_type: its ``Content-Type`` ("" when none).
        content_encoding: its ``Content-Encoding`` ("" when none): an encoded body is not read.
    """
    required = path in JSON_ROUTES
    if not body or content_encoding.strip().lower() not in ("", "identity") or not _json_type(content_type):
        return Body()
    try:
        doc = json.loads(body)
    except RecursionError:
        return _not_json(required, "it is nested too deeply")
    except ValueError as e:
        return _not_json(required, str(e))
    if not isinstance(doc, dict):
        return Body()
    model = doc.get("model")
    if model is None or isinstance(model, str):
        return Body(model, doc)
    return Body(None, doc, "'model' must be a string", model, "invalid_model")


def _not_json(required: bool, why: str) -> Body:
    if not required:
        return Body()
    return Body(problem=f"the request body is not valid JSON: {why}", code="invalid_json")


def with_model(document: dict[str, Any], model: str) -> bytes:
    """The body again with ``model`` set (an alias rewritten to the backend's name)."""
    return json.dumps({**document, "model": model}, ensure_ascii=False).encode()


@dataclass(frozen=True)
class Origin:
    """Where a backend is reached: the scheme, host and port of its ``health_url``."""

    scheme: str
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def loopback_origin(url: str) -> Origin:
    """The origin of a backend's ``health_url``: the only place the front door sends its requests.

    Raises:
        ValueError: naming the URL, when it is not ``http(s)://`` on a loopback address
            (127.0.0.0/8, ``::1`` or ``localhost``).
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise ValueError(f"{url!r} is not a URL: {e}") from None
    host = parts.hostname or ""
    if parts.scheme not in ("http", "https") or not host:
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    if host != "localhost":
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(
                f"{url!r} is not on a loopback address: the front door forwards only to 127.0.0.1, ::1 or localhost"
            )
    return Origin(parts.scheme, host, port or (443 if parts.scheme == "https" else 80))

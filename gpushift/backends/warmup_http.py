"""Send the warm-up request (:mod:`gpushift.backends.warmup`) and time it.

Plain ``http.client`` with ONE deadline for the whole exchange (connect, each read): a backend
that trickles bytes cannot hold the switch longer than the request's ``timeout_s``.  A streamed
answer is read as server-sent events (``data: ...`` lines): the time to the first chunk that is
not empty is the time to the first token, and the exchange ends at vLLM's ``data: [DONE]``,
llama-server's chunk with ``"stop": true``, or the end of the body.

Checked (``expect_cgroup``): each connection is checked once open and before the request (and its
headers, which may carry the backend's API key) is sent, as :mod:`gpushift.backends.httpget` does.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from gpushift.backends.httpget import check_peer
from gpushift.backends.served import PeerCheck, RefusedAnswer, RefusedForeign
from gpushift.values import WarmupRequest, WarmupResult

#: The most of an answer that is read (a few tokens are a few hundred bytes).
MAX_BODY = 1 << 20


class _Deadline:
    def __init__(
        self, timeout_s: float, expect_cgroup: str | None = None, peers: PeerCheck | None = None
    ) -> None:
        self.t0 = time.monotonic()
        self.end = self.t0 + timeout_s
        self.expect_cgroup = expect_cgroup  # the exchange's peer check travels with its deadline
        self.peers = peers

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the warm-up request did not finish in time")
        return left

    def since(self) -> float:
        return round(time.monotonic() - self.t0, 4)


def _connection(url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return cls(parts.hostname or "localhost", parts.port, timeout=timeout_s), path


def _exchange(
    method: str, url: str, body: bytes | None, headers: dict[str, str], deadline: _Deadline
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    conn, path = _connection(url, deadline.left())
    if deadline.expect_cgroup is not None:
        try:
            conn.connect()
            assert conn.sock is not None
            check_peer(conn.sock, deadline.expect_cgroup, deadline.peers, deadline.end)
        except BaseException:
            conn.close()
            raise
    conn.request(method, path, body=body, headers=headers)
    if conn.sock is not None:
        conn.sock.settimeout(deadline.left())
    return conn, conn.getresponse()


def _served_model(req: WarmupRequest, deadline: _Deadline) -> str:
    assert req.models_url is not None
    conn, resp = _exchange("GET", req.models_url, None, req.headers, deadline)
    try:
        data = json.loads(resp.read(MAX_BODY) or b"{}")
    finally:
        conn.close()
    models = data.get("data") if isinstance(data, dict) else None
    if resp.status != 200 or not models or not isinstance(models[0], dict) or not models[0].get("id"):
        raise ValueError(f"{req.models_url} answered {resp.status} without a model")
    return str(models[0]["id"])


def _last_chunk(line: bytes) -> bool:
    payload = line[5:].strip()
    try:
        chunk = json.loads(payload)
    except ValueError:
        return False
    return isinstance(chunk, dict) and chunk.get("stop") is True


def run(req: WarmupRequest, expect_cgroup: str | None = None, peers: PeerCheck | None = None) -> WarmupResult:
    """Send ``req`` and time it; every failure is a result with ``ok`` False and a reason.

    ``expect_cgroup``/``peers``: only to the backend unit's own process (a refused connection is a
    failed warm-up whose ``foreign`` names what answered)."""
    deadline = _Deadline(req.timeout_s, expect_cgroup, peers)
    body: dict[str, Any] = dict(req.body)
    status: int | None = None
    try:
        if req.models_url is not None:
            body["model"] = _served_model(req, deadline)
        conn, resp = _exchange("POST", req.url, json.dumps(body).encode(), req.headers, deadline)
        try:
            status = resp.status
            if status != req.expect_status:
                text = resp.read(2000).decode("utf-8", "replace")
                return WarmupResult(
                    False, status, f"HTTP {status} (expected {req.expect_status}): {text[:300]}"
                )
            if not req.stream:
                resp.read(MAX_BODY)
                t = deadline.since()
                return WarmupResult(True, status, "answered", t, t, 1)
            return _read_stream(resp, conn, deadline, status)
        finally:
            conn.close()
    except RefusedAnswer as e:
        foreign = e.verdict.to_dict() if isinstance(e.verdict, RefusedForeign) else None
        return WarmupResult(False, None, str(e)[:300], total_s=deadline.since(), foreign=foreign)
    except (OSError, TimeoutError, ValueError, http.client.HTTPException) as e:
        return WarmupResult(False, status, f"{type(e).__name__}: {e}"[:300], total_s=deadline.since())


def _lines(
    resp: http.client.HTTPResponse, conn: http.client.HTTPConnection, deadline: _Deadline
) -> Iterator[bytes]:
    """The answer's lines, each read under the one deadline (a trickle cannot stretch it)."""
    buf = b""
    read = 0
    while read < MAX_BODY:
        if conn.sock is not None:
            conn.sock.settimeout(deadline.left())
        data = resp.read1(4096)
        deadline.left()
        if not data:
            break
        read += len(data)
        buf += data
        *lines, buf = buf.split(b"\n")
        yield from lines
    if buf:
        yield buf


def _read_stream(
    resp: http.client.HTTPResponse, conn: http.client.HTTPConnection, deadline: _Deadline, status: int
) -> WarmupResult:
    ttft: float | None = None
    chunks = 0
    for line in _lines(resp, conn, deadline):
        if not line.startswith(b"data:") or not line[5:].strip():
            continue
        if line[5:].strip() == b"[DONE]":
            break
        chunks += 1
        if ttft is None:
            ttft = deadline.since()
        if _last_chunk(line):
            break
    total = deadline.since()
    if ttft is None:
        return WarmupResult(False, status, "the answer streamed no chunk", total_s=total)
    return WarmupResult(True, status, f"{chunks} chunk(s)", ttft, total, chunks)

"""The backends' HTTP endpoints — health, version, in-flight requests (for the drain).

A version command (instead of a version URL) runs in :mod:`gpushift.backends.version`.

One short request per poll, no connection kept, nothing at import.  Every request runs under a
TOTAL deadline and a bound on the bytes read (:mod:`gpushift.backends.httpget`): a backend that
trickles its answer cannot hold the switch, the sampler or the drain longer than the timeout.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gpushift.backends import gauges, httpget, models
from gpushift.backends.kinds import DEFAULT, any_in_flight, kind_of
from gpushift.backends.version import run_version_command
from gpushift.values import Health, VersionInfo, WarmupRequest, WarmupResult

#: A Prometheus page's in-flight requests, of whichever kind; llama-server's ``/slots``.
parse_inflight = any_in_flight
parse_slots = gauges.processing_slots

#: vLLM's /metrics took up to 2 s to answer while generating (measured): allow 5 in all.
IN_FLIGHT_TIMEOUT_S = 5.0
#: The most bytes of an answer's body read (a /metrics page of vLLM is some tens of KiB).
BODY_LIMIT_BYTES = 1 << 20


def _get(url: str, timeout_s: float, headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
    """(status, body) within ``timeout_s`` in all; raises OSError or ValueError (httpget.get)."""
    r = httpget.get(url, timeout_s, BODY_LIMIT_BYTES, headers)
    return r.status, r.body


def _reason(e: Exception) -> str:
    """An OS error as a person reads it (``connection refused``), not Python's ``[Errno 111] ...``."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror[0].lower() + e.strerror[1:]
    return str(e) or type(e).__name__


class HttpBackendProbe:
    """The :class:`gpushift.ports.BackendProbe` over HTTP."""

    def health(self, url: str, timeout_s: float = 2.0) -> Health:
        try:
            status, body = _get(url, timeout_s)
        except (OSError, ValueError) as e:
            return Health(False, None, f"no answer: {_reason(e)}")
        return Health(status == 200, status, body[:200].decode("utf-8", "replace").strip())

    def version(
        self, version_url: str | None, version_command: Sequence[str] | None, timeout_s: float = 5.0
    ) -> VersionInfo:
        if version_url:
            try:
                status, body = _get(version_url, timeout_s)
                if status == 200:
                    data: Any = json.loads(body.decode("utf-8", "replace"))  # never fatal: bytes from outside
                    v = None
                    if isinstance(data, dict):
                        # vLLM's /version: {"version": ...}; llama-server's /props: build_info
                        v = data.get("version") or data.get("build_info")
                    if v is not None:
                        return VersionInfo(str(v), "url", body[:500].decode("utf-8", "replace"))
                return VersionInfo(None, "url", f"HTTP {status}")
            except (OSError, ValueError) as e:
                return VersionInfo(None, "url", f"error: {e}")
        if version_command:
            # Under its own timeout (VERSION_COMMAND_TIMEOUT_S): timeout_s is the HTTP request's.
            return run_version_command(version_command)
        return VersionInfo(None, "none")

    def warmup(self, request: WarmupRequest) -> WarmupResult:
        from gpushift.backends.warmup_http import run

        return run(request)

    def in_flight(self, backend: Any) -> int | None:
        """Requests running or waiting, as the backend's kind reads its metrics page (a ``generic``
        one's as any kind's); None when unknown."""
        url = getattr(backend, "metrics_url", None)
        if not url:
            return None
        try:
            status, body = _get(url, IN_FLIGHT_TIMEOUT_S)
        except (OSError, ValueError):
            return None
        if status != 200:
            return None
        read = kind_of(getattr(backend, "kind", DEFAULT)).in_flight or any_in_flight
        return read(body.decode("utf-8", "replace"))

    def models(
        self, url: str, headers: Mapping[str, str], timeout_s: float = 5.0
    ) -> tuple[list[str] | None, str | None]:
        """The model names ``url`` (a backend's ``/v1/models``) lists, or None and why not."""
        try:
            status, body = _get(url, timeout_s, headers)
        except (OSError, ValueError) as e:
            return None, f"no answer: {_reason(e)}"
        if status != 200:
            return None, f"HTTP {status}"
        try:
            names = models.listed(json.loads(body.decode("utf-8", "replace")))
        except ValueError:
            names = None
        return (names, None) if names is not None else (None, "not a model list (no data[].id)")

"""The backends' HTTP endpoints — health, version, in-flight requests (for the drain).

A version command (instead of a version URL) runs in :mod:`gpushift.backends.version`.

One short request per poll, no connection kept, nothing at import.  Every request runs under a
TOTAL deadline and a bound on the bytes read (:mod:`gpushift.backends.httpget`): a backend that
trickles its answer cannot hold the switch, the sampler or the drain longer than the timeout.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from gpushift.backends import httpget
from gpushift.backends.version import run_version_command
from gpushift.values import Health, VersionInfo, WarmupRequest, WarmupResult

# Prometheus sample lines that count requests still being served or queued.
_INFLIGHT_METRICS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEInfa]+)")


#: vLLM's /metrics took up to 2 s to answer while generating (measured): allow 5 in all.
IN_FLIGHT_TIMEOUT_S = 5.0
#: The most bytes of an answer's body read (a /metrics page of vLLM is some tens of KiB).
BODY_LIMIT_BYTES = 1 << 20


def _get(url: str, timeout_s: float) -> tuple[int, bytes]:
    """(status, body) within ``timeout_s`` in all; raises OSError or ValueError (httpget.get)."""
    r = httpget.get(url, timeout_s, BODY_LIMIT_BYTES)
    return r.status, r.body


def parse_inflight(metrics_text: str, names: Sequence[str] = _INFLIGHT_METRICS) -> int | None:
    """Sum of the in-flight gauges found in a Prometheus text page; None when none is present."""
    total = 0.0
    seen = False
    for line in metrics_text.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) in names:
            try:
                total += float(m.group(3))
                seen = True
            except ValueError:
                continue
    return int(total) if seen else None


def parse_slots(text: str) -> int | None:
    """llama-server's ``/slots``: how many slots are processing a request."""
    try:
        slots = json.loads(text)
    except ValueError:
        return None
    if not isinstance(slots, list):
        return None
    return sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))


class HttpBackendProbe:
    """The :class:`gpushift.ports.BackendProbe` over HTTP."""

    def health(self, url: str, timeout_s: float = 2.0) -> Health:
        try:
            status, body = _get(url, timeout_s)
        except (OSError, ValueError) as e:
            return Health(False, None, f"no answer: {e}")
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
        """Requests running or waiting (vLLM and llama-server gauges); None when unknown."""
        url = getattr(backend, "metrics_url", None)
        if not url:
            return None
        try:
            status, body = _get(url, IN_FLIGHT_TIMEOUT_S)
        except (OSError, ValueError):
            return None
        if status != 200:
            return None
        text = body.decode("utf-8", "replace")
        if text.lstrip().startswith("["):  # llama-server's /slots
            return parse_slots(text)
        return parse_inflight(text)

"""The backends' HTTP endpoints — health, version, in-flight requests (for the drain).

A version command (instead of a version URL) runs in :mod:`gpushift.backends.version`.

One short request per poll, no connection kept, nothing at import.  Every request runs under a
TOTAL deadline and a bound on the bytes read (:mod:`gpushift.backends.httpget`): a backend that
trickles its answer cannot hold the switch, the sampler or the drain longer than the timeout.

Health, version and warm-up take ``expect_cgroup``, the backend unit's ``ControlGroup``: given it,
an answer counts only when the server end of its connection belongs to the unit
(:mod:`gpushift.backends.served`; the probe's ``peers`` tells who holds it).  A port answered by
anything else comes back not OK, with ``foreign`` naming what answered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gpushift.backends import gauges, httpget, models
from gpushift.backends.kinds import DEFAULT, any_in_flight, kind_of
from gpushift.backends.served import PeerCheck, RefusedAnswer, RefusedForeign
from gpushift.backends.version import run_version_command
from gpushift.values import Health, VersionInfo, WarmupRequest, WarmupResult

#: A Prometheus page's in-flight requests, of whichever kind; llama-server's ``/slots``.
parse_inflight = any_in_flight
parse_slots = gauges.processing_slots

#: vLLM's /metrics took up to 2 s to answer while generating (measured): allow 5 in all.
IN_FLIGHT_TIMEOUT_S = 5.0
#: The most bytes of an answer's body read (a /metrics page of vLLM is some tens of KiB).
BODY_LIMIT_BYTES = 1 << 20


def _get(
    url: str,
    timeout_s: float,
    headers: Mapping[str, str] | None = None,
    expect_cgroup: str | None = None,
    peers: PeerCheck | None = None,
) -> tuple[int, bytes]:
    """(status, body) within ``timeout_s`` in all; raises OSError, ValueError or RefusedAnswer."""
    r = httpget.get(url, timeout_s, BODY_LIMIT_BYTES, headers, expect_cgroup, peers)
    return r.status, r.body


def foreign_of(e: RefusedAnswer) -> dict[str, Any] | None:
    """What a refused answer's verdict says about the impostor (None: it could not be told)."""
    return e.verdict.to_dict() if isinstance(e.verdict, RefusedForeign) else None


def _reason(e: Exception) -> str:
    """An OS error as a person reads it (``connection refused``), not Python's ``[Errno 111] ...``."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror[0].lower() + e.strerror[1:]
    return str(e) or type(e).__name__


class HttpBackendProbe:
    """The :class:`gpushift.ports.BackendProbe` over HTTP.

    Args:
        peers: who holds the server end of a connection (:class:`gpushift.host.peer.PeerFinder`);
            without it a request asked to be checked is refused, never sent unchecked.
    """

    def __init__(self, peers: PeerCheck | None = None) -> None:
        self.peers = peers

    def _get(
        self,
        url: str,
        timeout_s: float,
        expect_cgroup: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """The module's ``_get``, checked with this probe's peers when ``expect_cgroup`` is given."""
        if expect_cgroup is None:
            return _get(url, timeout_s, headers)
        return _get(url, timeout_s, headers, expect_cgroup, self.peers)

    def health(self, url: str, timeout_s: float = 2.0, expect_cgroup: str | None = None) -> Health:
        try:
            status, body = self._get(url, timeout_s, expect_cgroup)
        except RefusedAnswer as e:
            return Health(False, None, str(e), foreign=foreign_of(e))
        except (OSError, ValueError) as e:
            return Health(False, None, f"no answer: {_reason(e)}")
        return Health(status == 200, status, body[:200].decode("utf-8", "replace").strip())

    def version(
        self,
        version_url: str | None,
        version_command: Sequence[str] | None,
        timeout_s: float = 5.0,
        expect_cgroup: str | None = None,
    ) -> VersionInfo:
        if version_url:
            try:
                status, body = self._get(version_url, timeout_s, expect_cgroup)
                if status == 200:
                    data: Any = json.loads(body.decode("utf-8", "replace"))  # never fatal: bytes from outside
                    v = None
                    if isinstance(data, dict):
                        # vLLM's /version: {"version": ...}; llama-server's /props: build_info
                        v = data.get("version") or data.get("build_info")
                    if v is not None:
                        return VersionInfo(str(v), "url", body[:500].decode("utf-8", "replace"))
                return VersionInfo(None, "url", f"HTTP {status}")
            except RefusedAnswer as e:
                return VersionInfo(None, "url", str(e), foreign=foreign_of(e))
            except (OSError, ValueError) as e:
                return VersionInfo(None, "url", f"error: {e}")
        if version_command:
            # Under its own timeout (VERSION_COMMAND_TIMEOUT_S): timeout_s is the HTTP request's.
            return run_version_command(version_command)
        return VersionInfo(None, "none")

    def warmup(self, request: WarmupRequest, expect_cgroup: str | None = None) -> WarmupResult:
        from gpushift.backends.warmup_http import run

        return run(request, expect_cgroup, self.peers)

    def in_flight(self, backend: Any, expect_cgroup: str | None = None) -> int | None:
        """Requests running or waiting, as the backend's kind reads its metrics page (a ``generic``
        one's as any kind's); None when unknown (and when another process answered)."""
        url = getattr(backend, "metrics_url", None)
        if not url:
            return None
        try:
            status, body = self._get(url, IN_FLIGHT_TIMEOUT_S, expect_cgroup)
        except (OSError, ValueError, RefusedAnswer):
            return None
        if status != 200:
            return None
        read = kind_of(getattr(backend, "kind", DEFAULT)).in_flight or any_in_flight
        return read(body.decode("utf-8", "replace"))

    def models(
        self,
        url: str,
        headers: Mapping[str, str],
        timeout_s: float = 5.0,
        expect_cgroup: str | None = None,
    ) -> tuple[list[str] | None, str | None]:
        """The model names ``url`` (a backend's ``/v1/models``) lists, or None and why not
        (checked against ``expect_cgroup`` like every request that carries its key)."""
        try:
            status, body = self._get(url, timeout_s, expect_cgroup, headers)
        except RefusedAnswer as e:
            return None, str(e)
        except (OSError, ValueError) as e:
            return None, f"no answer: {_reason(e)}"
        if status != 200:
            return None, f"HTTP {status}"
        try:
            names = models.listed(json.loads(body.decode("utf-8", "replace")))
        except ValueError:
            names = None
        return (names, None) if names is not None else (None, "not a model list (no data[].id)")

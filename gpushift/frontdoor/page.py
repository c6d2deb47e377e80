"""The status page at the front door: ``GET /gpushift/`` (HTML) and ``GET /gpushift/status.json``.

Its data is the daemon's redacted summary (``Switcher1.GetSummary``, ``docs/statuspage.md``),
fetched by :class:`SummarySource` **at most every** :data:`FETCH_EVERY_S` **seconds, whatever the
page's traffic**: a request finds the last answer, or waits for the one fetch in flight.  What the
front door knows sooner is laid over it (:func:`gpushift.statuspage.summary.with_live`, by the same
allowlist): who serves and the switch in flight from the daemon's properties (the daemon link's
view, which follows ``PropertiesChanged`` at once), the held and in-flight requests from the front
door itself.  When the daemon does not answer, the page shows what it said last and since when.

Read-only and without login: only ``GET`` and ``HEAD``; nothing in it needs hiding.  The answers
carry ``Cache-Control: no-store`` and a Content-Security-Policy that allows the page's own style
and script and nothing else.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

from aiohttp import web

from gpushift.statuspage import page, summary
from gpushift.statuspage.timeline import SCRIPT

PREFIX = "/gpushift"
#: The summary is fetched from the daemon at most this often.
FETCH_EVERY_S = 2.0
#: The page is rendered again at least this often (the front door's held and in-flight counts).
RENDER_EVERY_S = 1.0
UTC = timezone.utc

_SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{_SCRIPT_HASH}'; "
        "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
}


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SummarySource:
    """The daemon's summary as the front door last heard it.

    ``fetch`` returns the summary's JSON text (the daemon link's ``get_summary``) or raises.
    """

    def __init__(
        self,
        fetch: Callable[[], Awaitable[str]],
        every_s: float = FETCH_EVERY_S,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        log: Any = None,
    ) -> None:
        self._fetch = fetch
        self.every_s = every_s
        self._monotonic = monotonic
        self._wall = wall
        self._log = log
        self.summary: dict[str, Any] | None = None
        self.heard_at: float | None = None  # wall time of the last answer
        self.fetches = 0
        self._asked_at: float | None = None
        self._inflight: asyncio.Future[None] | None = None
        self._failing = False

    @property
    def stale_since(self) -> str | None:
        """None while the last fetch answered; else since when the daemon has not ("" never)."""
        if not self._failing and self.summary is not None:
            return None
        return _utc(self.heard_at) if self.heard_at is not None else ""

    async def get(self) -> dict[str, Any] | None:
        """The summary, fetched again when the last fetch began :attr:`every_s` ago or more."""
        now = self._monotonic()
        if self._inflight is not None:
            await asyncio.shield(self._inflight)
        elif self._asked_at is None or now - self._asked_at >= self.every_s:
            self._asked_at = now
            self._inflight = asyncio.ensure_future(self._refresh())
            try:
                await asyncio.shield(self._inflight)
            finally:
                self._inflight = None
        return self.summary

    async def _refresh(self) -> None:
        self.fetches += 1
        try:
            doc = json.loads(await self._fetch())
            if not isinstance(doc, dict) or doc.get("version") != summary.VERSION:
                raise ValueError(f"not a summary of version {summary.VERSION}")
        except Exception as e:  # noqa: BLE001 - a daemon that does not answer: the last summary stays
            if not self._failing and self._log is not None:
                self._log.warning("frontdoor_summary_failed", error=f"{type(e).__name__}: {e}"[:300])
            self._failing = True
            return
        if self._failing and self._log is not None:
            self._log.info("frontdoor_summary_back")
        self._failing = False
        self.summary = doc
        self.heard_at = self._wall()


class StatusPage:
    """The routes under :data:`PREFIX`; ``door`` is the front door (its ``view``, ``status()``,
    ``config``)."""

    def __init__(
        self, source: SummarySource, door: Any, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.source = source
        self.door = door
        self._monotonic = monotonic
        self.renders = 0
        # kind ("html", "json") -> (when, what it was made from, the text): a flood of requests
        # costs one rendering a second (the front door's counts), or one per change of who serves.
        self._made: dict[str, tuple[float, tuple[Any, ...], str]] = {}

    @staticmethod
    def wants(path: str) -> bool:
        return path == PREFIX or path.startswith(PREFIX + "/")

    async def data(self) -> tuple[dict[str, Any], str | None]:
        """The page's summary (with the front door's live values) and since when it is stale."""
        got = await self.source.get()
        if got is None:  # never heard: the configured names only, nothing known
            got = summary.build({}, [], None, list(self.door.config.backends), datetime.now(UTC))
        view = self.door.view
        live = view.connected
        merged = summary.with_live(
            got,
            active=view.active if live else None,
            switching=view.switching if live else None,
            target=view.target,
            phase=view.phase,
            frontdoor=self.door.status(),
        )
        return merged, self.source.stale_since

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.rel_url.path
        if request.method not in ("GET", "HEAD"):
            return _plain(405, "the status page is read-only: GET or HEAD\n", {"Allow": "GET, HEAD"})
        if path == PREFIX:
            return web.Response(status=308, headers={"Location": PREFIX + "/", **HEADERS})
        if path not in (PREFIX + "/", PREFIX + "/index.html", PREFIX + "/status.json"):
            return _plain(404, f"no such page: {PREFIX}/ and {PREFIX}/status.json are served here\n")
        kind = "json" if path.endswith("status.json") else "html"
        body = await self.text(kind)
        ctype = "application/json" if kind == "json" else "text/html"
        return web.Response(body=body.encode(), content_type=ctype, charset="utf-8", headers=HEADERS)

    async def text(self, kind: str) -> str:
        """The page (``html``) or ``status.json`` (``json``), made again when the summary, who
        serves or the switch changed, and at least every :data:`RENDER_EVERY_S` (the counts)."""
        await self.source.get()
        v = self.door.view
        key = (
            id(self.source.summary),
            self.source.stale_since,
            v.connected,
            v.active,
            v.switching,
            v.target,
            v.phase,
        )
        made = self._made.get(kind)
        now = self._monotonic()
        if made is not None and made[1] == key and now - made[0] < RENDER_EVERY_S:
            return made[2]
        doc, stale = await self.data()
        text = page.status_json(doc, stale) if kind == "json" else page.render(doc, stale)
        self.renders += 1
        self._made[kind] = (now, key, text)
        return text


def _plain(status: int, text: str, extra: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=text, headers={**HEADERS, **(extra or {})})

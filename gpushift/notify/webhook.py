"""The webhook — JSON documents POSTed to ``[notify] webhook_url``, off the switch's path.

:meth:`WebhookSender.enqueue` writes the document as a file under ``<state_dir>/webhook`` (atomic,
fsynced) and returns; the sender's own thread delivers the files oldest first, so a restart loses
nothing and keeps the order.

* 2xx: delivered, the file removed.
* A timeout, a refused connection, 408, 425, 429 or a 5xx: retried after 1 s, doubling up to
  5 minutes, or after what ``Retry-After`` says (seconds or an HTTP date, at most an hour).
* Any other status: dropped with a log line (the receiver said the document is wrong); so is a
  document still undelivered a day after it was queued.
* More than ``max_queued`` waiting: the oldest is dropped, with a log line.

``user:password@`` in the URL is sent as HTTP basic auth (and never shown).  The URL is shown
(logs, status) only as scheme and host (:func:`gpushift.safetext.redact.url_origin`), and every document is
passed through :func:`gpushift.safetext.redact.redact_tree` before it is queued.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import itertools
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from gpushift.config.hooks import NotifyConfig
from gpushift.safetext import redact
from gpushift.switch.runstore import write_atomic

#: Statuses worth another try (RFC 9110: 408 Request Timeout, 425 Too Early, 429 Too Many
#: Requests; a 5xx is the server's trouble).
RETRY_STATUSES = frozenset({408, 425, 429})
FIRST_DELAY_S = 1.0
MAX_DELAY_S = 300.0
MAX_RETRY_AFTER_S = 3600.0
#: A document still undelivered this long after it was queued is dropped.
MAX_AGE_S = 86400.0


class WebhookSender:
    """Args:
    config: the ``[notify]`` table in force (asked at every delivery: a reload applies).
    state_dir: ``[daemon] state_dir``; the queue is ``<state_dir>/webhook``.
    log: structlog logger.
    now: wall-clock seconds (a document's age, Retry-After dates).
    first_delay_s: the first retry's delay (tests make it short).
    """

    def __init__(
        self,
        config: Callable[[], NotifyConfig],
        state_dir: str,
        log: Any,
        now: Callable[[], float] = time.time,
        first_delay_s: float = FIRST_DELAY_S,
    ) -> None:
        self.config = config
        self.dir = os.path.join(state_dir, "webhook")
        self.log = log
        self.now = now
        self.first_delay_s = first_delay_s
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._seq = itertools.count()
        self.delivered = 0
        self.dropped = 0
        self.last_error: str | None = None
        self.last_delivered_at: str | None = None

    # ------------------------------------------------------------ the switch's side

    def enqueue(self, document: dict[str, Any]) -> None:
        """Queue ``document`` (redacted) for delivery; returns at once.  Never raises."""
        cfg = self.config()
        if not cfg.enabled:
            return
        entry = {"queued_at": self.now(), "attempts": 0, "next_at": 0.0, "doc": redact.redact_tree(document)}
        name = f"{time.time_ns():020d}-{next(self._seq):06d}.json"
        try:
            write_atomic(os.path.join(self.dir, name), json.dumps(entry, default=str).encode())
            self._trim(cfg.max_queued)
        except OSError as e:
            self.dropped += 1
            self.log.error("webhook_queue_failed", error=str(e), detail="the document is lost")
            return
        with self._wake:
            self._wake.notify_all()

    def _trim(self, max_queued: int) -> None:
        files = self._files()
        for name in files[: max(0, len(files) - max_queued)]:
            self._drop(name, f"the queue holds more than max_queued = {max_queued}: the oldest is dropped")

    # ------------------------------------------------------------ the thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="webhook", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            with self._wake:
                if self._stopping:
                    return
            try:
                wait = self._deliver_next()
            except Exception as e:  # the thread's edge: log, pause, go on
                self.log.exception("webhook_failed", error=repr(e))
                wait = 5.0
            with self._wake:
                if self._stopping:
                    return
                self._wake.wait(wait)

    def _deliver_next(self) -> float:
        """Try the oldest document if it is due; how long to wait before looking again."""
        cfg = self.config()
        files = self._files()
        if not files or not cfg.enabled:
            return 60.0
        name = files[0]
        path = os.path.join(self.dir, name)
        try:
            with open(path, "rb") as f:
                entry = json.loads(f.read())
        except (OSError, ValueError) as e:
            self._drop(name, f"unreadable queue file: {e}")
            return 0.0
        now = self.now()
        if now - float(entry.get("queued_at", now)) > MAX_AGE_S:
            self._drop(name, "undelivered for a day")
            return 0.0
        due = float(entry.get("next_at", 0.0))
        if due > now:
            return min(due - now, 60.0)
        status, error, retry_after = self._post(cfg, entry["doc"])
        if status is not None and 200 <= status < 300:
            os.unlink(path)
            self.delivered += 1
            self.last_delivered_at = datetime.now(timezone.utc).isoformat()
            self.log.info("webhook_delivered", url=redact.url_origin(cfg.webhook_url), status=status,
                          attempts=int(entry.get("attempts", 0)) + 1)  # fmt: skip
            return 0.0
        why = error or f"HTTP {status}"
        self.last_error = why
        if status is not None and status not in RETRY_STATUSES and status < 500:
            self._drop(name, f"the receiver answered {status}: not retried")
            return 0.0
        attempts = int(entry.get("attempts", 0)) + 1
        delay = min(MAX_DELAY_S, self.first_delay_s * 2 ** (attempts - 1))
        if retry_after is not None:
            delay = min(max(retry_after, 0.0), MAX_RETRY_AFTER_S)
        entry.update(attempts=attempts, next_at=now + delay)
        write_atomic(path, json.dumps(entry, default=str).encode())
        self.log.warning("webhook_retry", url=redact.url_origin(cfg.webhook_url), error=why,
                         attempts=attempts, retry_in_s=round(delay, 1))  # fmt: skip
        return float(delay)

    def _post(self, cfg: NotifyConfig, doc: Any) -> tuple[int | None, str | None, float | None]:
        """(status, error, Retry-After seconds): status None when no answer came."""
        url, auth = split_auth(cfg.webhook_url)
        req = urllib.request.Request(url, data=json.dumps(doc).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        req.add_header("User-Agent", "gpushift")
        if auth:
            req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
        try:
            with contextlib.closing(urllib.request.urlopen(req, timeout=cfg.timeout_s)) as resp:  # noqa: S310
                resp.read(65536)
                return int(resp.status), None, None
        except urllib.error.HTTPError as e:
            retry = self._retry_after(e.headers.get("Retry-After") if e.headers else None)
            e.close()
            return int(e.code), None, retry
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            # The reason names the failure (refused, timed out), never the URL.
            return None, f"no answer: {redact.redact_text(str(reason))}", None

    def _retry_after(self, value: str | None) -> float | None:
        if not value:
            return None
        value = value.strip()
        if value.isdigit():
            return float(value)
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return when.timestamp() - self.now()

    # ------------------------------------------------------------ the queue

    def _files(self) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self.dir) if n.endswith(".json") and not n.startswith("."))
        except FileNotFoundError:
            return []

    def _drop(self, name: str, why: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.dir, name))
        self.dropped += 1
        self.log.warning("webhook_dropped", url=redact.url_origin(self.config().webhook_url), why=why)

    def status(self) -> dict[str, Any]:
        """For ``status --json`` (the ``notices`` key)."""
        cfg = self.config()
        return {
            "url": redact.url_origin(cfg.webhook_url) if cfg.enabled else None,
            "queued": len(self._files()),
            "delivered": self.delivered,
            "dropped": self.dropped,
            "last_error": self.last_error,
            "last_delivered_at": self.last_delivered_at,
        }


def split_auth(url: str) -> tuple[str, str | None]:
    """``https://bot:pw@host/p`` → (``https://host/p``, ``bot:pw``): the credentials go into a
    basic-auth header, never onto the request line."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, None
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    auth = unquote(parts.username) + ":" + unquote(parts.password or "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)), auth

"""The webhook — JSON documents POSTed to ``[notify] webhook_url``, off the switch's path.

:meth:`WebhookSender.enqueue` writes the document as a file under ``<state_dir>/webhook`` (atomic,
fsynced) and returns; the sender's own thread delivers the files oldest first, so a restart loses
nothing and keeps the order.

* 2xx: delivered, the file removed.
* A timeout, a refused connection, a redirect (3xx), 408, 425, 429 or a 5xx: retried after 1 s,
  doubling up to 5 minutes, or after what ``Retry-After`` says (seconds or an HTTP date, at most an
  hour).  A redirect is never followed (:mod:`gpushift.notify.post`): the document and the
  credentials go to the configured URL only.  ``[notify] timeout_s`` covers the whole POST.
* Any other status: dropped with a log line (the receiver said the document is wrong); so is a
  document still undelivered a day after it was queued.
* More than ``max_queued`` waiting: the oldest is dropped, with a log line.
* A queue file that cannot be delivered — not a regular file (a FIFO, a symlink, a directory), too
  large, unreadable, not JSON or not the shape :meth:`WebhookSender.enqueue` writes — is read
  without blocking and bounded (:func:`read_entry`), moved into ``<state_dir>/webhook/bad/`` with
  its reason (the newest :data:`MAX_SET_ASIDE` kept), reported (``webhook_file_set_aside`` in the
  journal, ``set_aside`` and ``last_error`` in status), and the rest of the queue goes on.

``user:password@`` in the URL is sent as HTTP basic auth (and never shown).  The URL is shown
(logs, status) only as scheme and host (:func:`gpushift.safetext.redact.url_origin`), and every document is
passed through :func:`gpushift.safetext.redact.redact_tree` before it is queued.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import errno
import itertools
import json
import math
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from gpushift.config.hooks import NotifyConfig
from gpushift.host import safefile
from gpushift.notify import post
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
#: A queue file larger than this is set aside (a document is a few KiB).
MAX_FILE_BYTES = 1024 * 1024
#: Where queue files that cannot be delivered go (under the queue), and how many are kept there.
BAD_DIR = "bad"
MAX_SET_ASIDE = 50


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
        self.files_set_aside = 0
        self.last_set_aside: dict[str, Any] | None = None
        self._stuck: set[str] = set()  # set aside in place: could be neither moved nor removed

    # ------------------------------------------------------------ the switch's side

    def enqueue(self, document: dict[str, Any]) -> None:
        """Queue ``document`` (redacted) for delivery; returns at once.  Never raises."""
        cfg = self.config()
        if not cfg.enabled:
            return
        entry = {"queued_at": self.now(), "attempts": 0, "next_at": 0.0, "doc": redact.redact_tree(document)}
        name = f"{time.time_ns():020d}-{next(self._seq):06d}.json"
        data = json.dumps(entry, default=str).encode()
        if len(data) > MAX_FILE_BYTES:  # the reader would set it aside
            self.dropped += 1
            self.log.error("webhook_queue_failed", error=f"the document is larger than {MAX_FILE_BYTES} bytes",
                           detail="the document is lost")  # fmt: skip
            return
        try:
            write_atomic(os.path.join(self.dir, name), data)
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
        now = self.now()
        try:
            entry = read_entry(path)
        except FileNotFoundError:
            return 0.0  # gone meanwhile (the bound dropped it)
        except BadQueueFile as e:
            self._set_aside(name, e.reason)
            return 0.0
        if now - float(entry.get("queued_at", now)) > MAX_AGE_S:
            self._drop(name, "undelivered for a day")
            return 0.0
        due = float(entry.get("next_at", 0.0))
        if now < due <= now + MAX_RETRY_AFTER_S:  # further away: the clock went back; try now
            return min(due - now, 60.0)
        answer = self._post(cfg, entry["doc"])
        status = answer.status
        if status is not None and 200 <= status < 300:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            self.delivered += 1
            self.last_delivered_at = datetime.now(timezone.utc).isoformat()
            self.log.info("webhook_delivered", url=redact.url_origin(cfg.webhook_url), status=status,
                          attempts=int(entry.get("attempts", 0)) + 1)  # fmt: skip
            return 0.0
        why = _failure(answer)
        self.last_error = why
        if status is not None and status not in RETRY_STATUSES and status < 500 and not 300 <= status < 400:
            self._drop(name, f"the receiver answered {status}: not retried")
            return 0.0
        attempts = int(entry.get("attempts", 0)) + 1
        delay = min(MAX_DELAY_S, self.first_delay_s * 2 ** min(attempts - 1, 32))
        retry_after = self._retry_after(answer.headers.get("retry-after"))
        if retry_after is not None:
            delay = min(max(retry_after, 0.0), MAX_RETRY_AFTER_S)
        entry.update(attempts=attempts, next_at=now + delay)
        write_atomic(path, json.dumps(entry, default=str).encode())
        self.log.warning("webhook_retry", url=redact.url_origin(cfg.webhook_url), error=why,
                         attempts=attempts, retry_in_s=round(delay, 1))  # fmt: skip
        return float(delay)

    def _post(self, cfg: NotifyConfig, doc: Any) -> post.Answer:
        """One POST under ``timeout_s`` for all of it; a redirect is never followed."""
        url, auth = split_auth(cfg.webhook_url)
        headers = {"Content-Type": "application/json", "User-Agent": "gpushift"}
        if auth:
            headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
        return post.post(url, json.dumps(doc).encode(), headers, cfg.timeout_s)

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
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(
            n for n in names if n.endswith(".json") and not n.startswith(".") and n not in self._stuck
        )

    def _drop(self, name: str, why: str) -> None:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
            os.unlink(os.path.join(self.dir, name))  # not a file: the reader sets it aside
        self.dropped += 1
        self.log.warning("webhook_dropped", url=redact.url_origin(self.config().webhook_url), why=why)

    def _set_aside(self, name: str, why: str) -> None:
        """Move the queue file ``name`` that cannot be delivered (``why``) into ``bad/``, with its
        reason beside it, and report it; the rest of the queue goes on."""
        path = os.path.join(self.dir, name)
        moved = set_aside(self.dir, name, why, self.now())
        if moved is None:
            self._stuck.add(name)  # neither moved nor removed: skipped from now on
        self.files_set_aside += 1
        self.last_error = f"queue file {name} set aside: {why}"
        self.last_set_aside = {"file": path, "why": why, "moved_to": moved,
                               "at": datetime.now(timezone.utc).isoformat()}  # fmt: skip
        self.log.error("webhook_file_set_aside", file=path, why=why, moved_to=moved or "nowhere (skipped)")

    def status(self) -> dict[str, Any]:
        """For ``status --json`` (the ``notices`` key)."""
        cfg = self.config()
        return {
            "url": redact.url_origin(cfg.webhook_url) if cfg.enabled else None,
            "queued": len(self._files()),
            "delivered": self.delivered,
            "dropped": self.dropped,
            "set_aside": self.files_set_aside,
            "last_set_aside": self.last_set_aside,
            "last_error": self.last_error,
            "last_delivered_at": self.last_delivered_at,
        }


def _failure(answer: post.Answer) -> str:
    """A failed delivery in words: never the URL's path or credentials."""
    if answer.status is None:
        # The reason names the failure (refused, timed out), never the URL.
        return f"no answer: {redact.redact_text(answer.error or 'unknown')}"
    if 300 <= answer.status < 400:
        where = answer.headers.get("location")
        to = f" to {redact.url_origin(where)}" if where else ""
        return f"HTTP {answer.status}: a redirect{to}, not followed"
    return f"HTTP {answer.status}"


class BadQueueFile(Exception):
    """A queue file that cannot be delivered: ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_SYMLINK = "a symbolic link (not followed)"


def _check_regular(st: os.stat_result) -> None:
    """Raises :class:`BadQueueFile` unless ``st`` is a regular file of at most MAX_FILE_BYTES."""
    if stat.S_ISLNK(st.st_mode):
        raise BadQueueFile(_SYMLINK)
    reason = safefile.not_regular(st.st_mode)
    if reason is None and st.st_size > MAX_FILE_BYTES:
        reason = f"larger than {MAX_FILE_BYTES} bytes ({st.st_size})"
    if reason is not None:
        raise BadQueueFile(reason)


def read_entry(path: str) -> dict[str, Any]:
    """The queue entry in file ``path``, read without blocking and bounded: a file that is not
    regular is refused on its ``lstat`` before any open (a device's driver is never called, a
    symlink never followed); then it is opened with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO swapped in
    never waits for a writer), checked again on the open descriptor, at most
    :data:`MAX_FILE_BYTES` read.

    Raises:
        FileNotFoundError: it is gone.
        BadQueueFile: a symlink, FIFO, directory, device; too large; unreadable; not JSON; not
            the shape :meth:`WebhookSender.enqueue` writes.
    """
    try:
        _check_regular(os.lstat(path))
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise BadQueueFile(_SYMLINK) from None
        raise BadQueueFile(f"cannot be opened: {e.strerror or e}") from None
    try:
        _check_regular(os.fstat(fd))  # replaced between the lstat and the open
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise BadQueueFile(f"cannot be read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_FILE_BYTES:
        raise BadQueueFile(f"larger than {MAX_FILE_BYTES} bytes")
    try:
        entry = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise BadQueueFile(f"not JSON: {str(e)[:200]}") from None
    problem = entry_problem(entry)
    if problem is not None:
        raise BadQueueFile(f"not a queued document: {problem}")
    return dict(entry)


def entry_problem(entry: Any) -> str | None:
    """What is wrong with a parsed queue entry (the shape :meth:`WebhookSender.enqueue` writes:
    ``queued_at``, ``attempts``, ``next_at`` and the ``doc`` object); None when nothing is."""
    if not isinstance(entry, dict):
        return f"a JSON {type(entry).__name__}, not an object"
    if not isinstance(entry.get("doc"), dict):
        return "no document object under 'doc'"
    for key in ("queued_at", "next_at"):
        v = entry.get(key, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return f"{key!r} is not a finite number"
    attempts = entry.get("attempts", 0)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 0 <= attempts <= 10**6:
        return "'attempts' is not a count"
    return None


def set_aside(queue: str, name: str, why: str, now: float) -> str | None:
    """Move ``queue/name`` into ``queue/bad/`` (with ``<name>.why`` holding ``why``), keeping the
    newest :data:`MAX_SET_ASIDE` there; where it went, or None when it could be neither moved nor
    removed.  Never raises."""
    bad = os.path.join(queue, BAD_DIR)
    target = os.path.join(bad, f"{time.time_ns():020d}-{name}")
    try:
        os.makedirs(bad, mode=0o750, exist_ok=True)
        os.rename(os.path.join(queue, name), target)
    except OSError:
        return "removed" if _remove(os.path.join(queue, name)) else None
    reason = {"file": name, "why": why, "at": now}
    with contextlib.suppress(OSError):
        write_atomic(target + ".why", json.dumps(reason).encode(), durable=False)
    _prune(bad)
    return target


def _prune(bad: str) -> None:
    """At most :data:`MAX_SET_ASIDE` files (each with its ``.why``) in ``bad``: the oldest go."""
    with contextlib.suppress(OSError):
        kept = sorted(n for n in os.listdir(bad) if not n.endswith(".why") and not n.startswith("."))
        for n in kept[: max(0, len(kept) - MAX_SET_ASIDE)]:
            _remove(os.path.join(bad, n))
            _remove(os.path.join(bad, n + ".why"))


def _remove(path: str) -> bool:
    """Remove ``path`` whatever it is (a directory with what is in it; a symlink, not its target)."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


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

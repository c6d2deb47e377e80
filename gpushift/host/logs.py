"""Structured logging — into the journal's own fields under systemd, one JSON object per line elsewhere.

Shared by the two processes: the daemon (``SYSLOG_IDENTIFIER=gpushift``) and the front door
(``gpushift-frontdoor``), which imports nothing of the daemon's; ``gpushift.daemon.logs`` names
this module for the daemon's code.

Every log call is ``log.info("event_name", key=value, ...)`` (structlog).  Where it goes:

* stdout or stderr is the journal stream systemd gave the daemon (``$JOURNAL_STREAM``, see
  :func:`gpushift.host.journal.connected`): each line becomes one journal entry with its keys as
  fields (:func:`journal_fields`), so ``journalctl -u gpushift GPUSHIFT_TICKET=…`` shows one switch;
* otherwise (a terminal, a file, a pipe): one JSON object per line on stdout, as before.

An entry the journal does not take (journald stopped, its queue full for too long, an encoding bug)
is written as its JSON line to stderr instead, and so are the lines of the next
:data:`RETRY_AFTER_S`: a line is never lost and logging never raises.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

import structlog

from gpushift.host import journal
from gpushift.safetext import redact

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

#: syslog priorities (syslog(3)) of structlog's level names; journalctl colours and filters by them.
PRIORITY = {
    "debug": 7,
    "info": 6,
    "notice": 5,
    "warning": 4,
    "warn": 4,
    "error": 3,
    "exception": 3,
    "critical": 2,
    "fatal": 2,
}

IDENTIFIER = "gpushift"
PREFIX = "GPUSHIFT_"

#: A value longer than this (in UTF-8 bytes) is cut, and says so: a runaway value (a huge argv, a
#: traceback in a loop) must not make every entry a memfd.  A ledger record (the last resort when the
#: database cannot be written) is a few KiB, far below it.
VALUE_MAX_BYTES = 64 * 1024

#: After the journal failed to take a line, how long every line goes to the fallback stream instead.
RETRY_AFTER_S = 10.0

#: Keys that name the backend a line is about, first found wins: ``GPUSHIFT_BACKEND``.
_BACKEND_KEYS = ("backend", "to", "target")

#: Keys the pipeline adds that the journal records in its own way (GPUSHIFT_EVENT, PRIORITY, the
#: entry's timestamp).
_NOT_FIELDS = frozenset({"event", "level", "timestamp"})


def set_level(level: str) -> None:
    """Log from ``level`` up from now on (a reload's ``[daemon] log_level``), keeping the rest of
    the configuration :func:`setup` made."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)))


def setup(
    level: str = "info",
    stream: TextIO | None = None,
    journal_socket: str | None = None,
    identifier: str = IDENTIFIER,
) -> Any:
    """Configure structlog for the process and return its logger.

    Args:
        level: the lowest level logged (``[daemon] log_level``).
        stream: JSON lines go here (default stdout); in journal mode, the fallback (default stderr).
        journal_socket: log to this journald socket.  None: to the system's journal when stdout or
            stderr is connected to it (and no ``stream`` is given), else JSON lines.
        identifier: the journal's ``SYSLOG_IDENTIFIER`` of every line.
    """
    if journal_socket is None and stream is None and journal.connected():
        journal_socket = journal.SOCKET_PATH
    chain: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        redact_event,
    ]
    if journal_socket is not None:
        out = JournalLogger(journal.JournalSocket(journal_socket), stream, identifier=identifier)
        chain.append(_hand_over)
        factory: Any = _Factory(out)
    else:
        chain.append(structlog.processors.JSONRenderer(sort_keys=False, default=str))
        factory = structlog.PrintLoggerFactory(file=stream or sys.stdout)
    structlog.configure(
        processors=chain,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=factory,
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h, _JournalHandler)]:
        root.removeHandler(h)
    if journal_socket is not None:
        handler: logging.Handler = _JournalHandler(out)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.WARNING)
    else:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
    for each in root.handlers:
        if not any(isinstance(f, RedactingFilter) for f in each.filters):
            each.addFilter(RedactingFilter())
    return structlog.get_logger("gpushift")


# ---------------------------------------------------------------- credentials never logged


def redact_event(_logger: Any, _method: str, event_dict: Any) -> Any:
    """structlog processor: every credential in a line masked (gpushift/safetext/redact.py) — a backend's
    ``--api-key`` in an argv, ``HF_TOKEN=`` in an environment, a URL's password, a ``Bearer`` token,
    in any value or traceback.  A value that is not JSON-like is made its ``str()`` first (what
    both renderers would print), so nothing escapes through an object's text."""
    plain = (str, int, float, bool, type(None), dict, list, tuple)
    return redact.redact_tree({k: v if isinstance(v, plain) else _text(v) for k, v in event_dict.items()})


def _text(value: Any) -> str:
    try:
        return str(value)
    except Exception as e:  # noqa: BLE001 - a __str__ that raises must not cost the line
        return f"<unrenderable {type(value).__name__}: {type(e).__name__}>"


class RedactingFilter(logging.Filter):
    """The same for the standard library's loggers: the message and its traceback, masked."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redact.redact_text(record.getMessage())
        record.args = None
        if record.exc_info:
            record.exc_text = redact.redact_text(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


# ---------------------------------------------------------------- the journal's fields


def bounded(text: str | bytes, limit: int = VALUE_MAX_BYTES) -> str | bytes:
    """``text`` cut to ``limit`` UTF-8 bytes (on a character boundary), ending in a note of its size."""
    raw = text.encode("utf-8", "replace") if isinstance(text, str) else text
    if len(raw) <= limit:
        return text
    note = f" …[cut: {len(raw)} bytes in all]".encode()
    head = raw[: max(0, limit - len(note))]
    if isinstance(text, bytes):
        return head + note
    return (head.decode("utf-8", "ignore").encode() + note).decode()


def render(value: Any) -> str | bytes:
    """A structured value as a journal value: strings and bytes as they are, numbers and booleans as
    JSON writes them, containers as compact JSON, anything else as ``str()``."""
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, default=str, separators=(",", ":"))
    return str(value)


def message(event_dict: Mapping[str, Any]) -> str:
    """The human line (``MESSAGE``): the event, then ``key=value`` for every key (a string quoted when
    it has spaces or quotes, a container as compact JSON), then a traceback on the lines below; what
    ``journalctl -u gpushift`` shows."""
    parts = [str(event_dict.get("event", ""))]
    for key, value in event_dict.items():
        if key in _NOT_FIELDS or key == "exception" or value is None:
            continue
        text = render(value)
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        plain = not isinstance(value, (dict, list, tuple, bool, int, float))
        if plain and (not text or any(c in text for c in " \t\n\"'=\\")):
            text = json.dumps(text, ensure_ascii=False)
        parts.append(f"{key}={text}")
    line = " ".join(parts)
    exc = event_dict.get("exception")
    return f"{line}\n{exc}" if exc else line


def journal_fields(
    event_dict: Mapping[str, Any], identifier: str = IDENTIFIER
) -> list[tuple[str, str | bytes]]:
    """One log line's journal fields.

    ``MESSAGE`` (:func:`message`), ``PRIORITY`` (by level), ``SYSLOG_IDENTIFIER`` (``gpushift``),
    ``GPUSHIFT_EVENT`` (the event name), ``GPUSHIFT_BACKEND`` (from ``backend``, ``to`` or
    ``target``) and every other key as ``GPUSHIFT_<KEY>`` (``ticket`` → ``GPUSHIFT_TICKET``,
    ``phase``, ``outcome`` ...; a traceback as ``GPUSHIFT_EXCEPTION``).  None values are left out;
    every value is cut to :data:`VALUE_MAX_BYTES`.
    """
    level = str(event_dict.get("level", "info")).lower()
    fields: list[tuple[str, str | bytes]] = [
        ("MESSAGE", bounded(message(event_dict))),
        ("PRIORITY", str(PRIORITY.get(level, 6))),
        ("SYSLOG_IDENTIFIER", identifier),
        (PREFIX + "EVENT", bounded(str(event_dict.get("event", "")))),
    ]
    backend = next((event_dict[k] for k in _BACKEND_KEYS if event_dict.get(k) is not None), None)
    if backend is not None and "backend" not in event_dict:
        fields.append((PREFIX + "BACKEND", bounded(render(backend))))
    for key, value in event_dict.items():
        if value is None or key in _NOT_FIELDS:
            continue
        fields.append((journal.field_name(str(key), PREFIX), bounded(render(value))))
    return fields


def json_line(event_dict: Mapping[str, Any]) -> str:
    """The line as JSON mode writes it (the fallback keeps the format a reader of stdout expects)."""
    try:
        return json.dumps(dict(event_dict), default=str)
    except Exception as e:  # noqa: BLE001 - a key that is not a string, a cycle, a __str__ that raises
        event = event_dict.get("event")
        return json.dumps(
            {"event": event if isinstance(event, str) else "?", "unrenderable": f"{type(e).__name__}: {e}"}
        )


# ---------------------------------------------------------------- structlog's end of the chain


def _hand_over(_logger: Any, _method: str, event_dict: Any) -> Any:
    """Last processor in journal mode: hand the event dict itself to :class:`JournalLogger`."""
    return ((event_dict,), {})


class JournalLogger:
    """structlog's "logger" in journal mode: sends each event dict to journald, or writes its JSON
    line to the fallback stream when that fails.  Never raises.

    After a failed send the journal is left alone for :data:`RETRY_AFTER_S` (every line goes to the
    fallback meanwhile): a stalled journald makes each send wait for its timeout, and a burst of
    such waits on the main loop would starve the watchdog.
    """

    def __init__(
        self,
        sock: journal.JournalSocket,
        fallback: TextIO | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        identifier: str = IDENTIFIER,
    ) -> None:
        self.sock = sock
        self.identifier = identifier
        self._fallback = fallback
        self._monotonic = monotonic
        self._failed: tuple[float, str] | None = None  # (when, why) the last send failed

    def msg(self, event_dict: Mapping[str, Any]) -> None:
        try:
            fields = journal_fields(event_dict, self.identifier)
        except Exception as e:  # noqa: BLE001 - a value that cannot be rendered: the JSON line still goes
            self.fallback(event_dict, e)
            return
        self.send_fields(fields, event_dict)

    def send_fields(self, fields: list[tuple[str, str | bytes]], line: Mapping[str, Any]) -> None:
        """Send prepared ``fields``; on failure write ``line`` as JSON to the fallback stream."""
        failed = self._failed
        if failed is not None and self._monotonic() - failed[0] < RETRY_AFTER_S:
            self.fallback(
                line, f"not tried: the journal failed {self._monotonic() - failed[0]:.1f}s ago ({failed[1]})"
            )
            return
        try:
            self.sock.send(fields)
        except Exception as e:  # noqa: BLE001 - the journal's failure must cost neither the line nor the daemon
            self._failed = (self._monotonic(), f"{type(e).__name__}: {e}")
            self.fallback(line, self._failed[1])
            return
        self._failed = None

    def fallback(self, event_dict: Mapping[str, Any], error: BaseException | str) -> None:
        """``event_dict`` as a JSON line, with ``journal_error`` saying why, on the fallback stream."""
        try:
            out = self._fallback or sys.stderr
            why = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
            out.write(json_line({**event_dict, "journal_error": why}) + "\n")
            out.flush()
        except Exception:  # noqa: BLE001 - nowhere left to write: never raise from a log call
            pass

    debug = info = warning = warn = error = exception = critical = fatal = log = msg


class _Factory:
    """``logger_factory`` returning the one shared :class:`JournalLogger`."""

    def __init__(self, out: JournalLogger) -> None:
        self.out = out

    def __call__(self, *_args: Any) -> JournalLogger:
        return self.out


class _JournalHandler(logging.Handler):
    """The standard library's loggers (the NVML and /proc adapters use them) into the same journal:
    ``GPUSHIFT_LOGGER`` names the logger, ``GPUSHIFT_EVENT`` is the message's first word."""

    def __init__(self, out: JournalLogger) -> None:
        super().__init__()
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            first = record.getMessage().split(" ", 1)[0]
            level = record.levelname.lower()
            line = {"event": first, "level": level, "logger": record.name, "message": text}
            fields: list[tuple[str, str | bytes]] = [
                ("MESSAGE", bounded(text)),
                ("PRIORITY", str(PRIORITY.get(level, 6))),
                ("SYSLOG_IDENTIFIER", self.out.identifier),
                (PREFIX + "EVENT", bounded(first)),
                (PREFIX + "LOGGER", record.name),
            ]
        except Exception:  # noqa: BLE001 - logging's own convention
            self.handleError(record)
            return
        self.out.send_fields(fields, line)

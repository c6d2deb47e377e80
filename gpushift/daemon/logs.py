"""The daemon's logging: :mod:`gpushift.host.logs`, which the front door shares (it imports nothing of
the daemon's process).  Kept under this name for the daemon's code and its tests."""

from gpushift.host.logs import (
    IDENTIFIER,
    PREFIX,
    PRIORITY,
    RETRY_AFTER_S,
    VALUE_MAX_BYTES,
    JournalLogger,
    RedactingFilter,
    bounded,
    journal_fields,
    json_line,
    message,
    redact_event,
    render,
    set_level,
    setup,
)

__all__ = [
    "IDENTIFIER",
    "PREFIX",
    "PRIORITY",
    "RETRY_AFTER_S",
    "VALUE_MAX_BYTES",
    "JournalLogger",
    "RedactingFilter",
    "bounded",
    "journal_fields",
    "json_line",
    "message",
    "redact_event",
    "render",
    "set_level",
    "setup",
]

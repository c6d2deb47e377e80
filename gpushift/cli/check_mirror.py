"""``gpushift check``'s mirror section: one connection to the central database (``[mirror]``).

Connects as the daemon's mirror does (``fleet/db.py``: ``connect_timeout_s``, ``statement_timeout_s``,
the password from its file or credential, handed to the driver only), reads the schema's version
without a lock and without creating anything, and closes again.  The facts go to the rule in
:mod:`gpushift.doctor.mirror`; the report's ``mirror`` part names the server as ``USER@HOST:PORT/DB``
and, when it is not reachable, the driver's first line with the password masked — never the password.
"""

from __future__ import annotations

import os
import time
from typing import Any

from gpushift.config.schema import Config
from gpushift.doctor import mirror as rules
from gpushift.errors import FleetError


def probe(cfg: Config) -> rules.MirrorFacts:
    """Connect once, read the schema's version, close (every failure is a value)."""
    from gpushift.fleet import db, schema, secret

    m = cfg.mirror
    where = db.where(m.url)
    if m.password_credential and not os.environ.get(secret.CREDENTIALS_ENV):
        why = (f"the password is the systemd credential {m.password_credential!r}, which only the "
               f"service it is loaded into can read (${secret.CREDENTIALS_ENV} is not set here)")  # fmt: skip
        return rules.MirrorFacts(where, False, error=why, connect_timeout_s=m.connect_timeout_s,
                                 credential=m.password_credential)  # fmt: skip
    t0 = time.monotonic()
    try:
        conn = db.connect(m, application="gpushift-check")
    except FleetError as e:
        return rules.MirrorFacts(where, False, error=_reason(str(e), where), elapsed_s=_since(t0),
                                 connect_timeout_s=m.connect_timeout_s)  # fmt: skip
    try:
        version = schema.version(conn)
    except db.DatabaseError as e:  # a statement timeout, a lost connection
        return rules.MirrorFacts(where, False, error=db.one_line(e), elapsed_s=_since(t0),
                                 connect_timeout_s=m.connect_timeout_s)  # fmt: skip
    finally:
        conn.close()
    return rules.MirrorFacts(where, True, schema_version=version, elapsed_s=_since(t0),
                             connect_timeout_s=m.connect_timeout_s)  # fmt: skip


def _since(t0: float) -> float:
    return round(time.monotonic() - t0, 3)


def _reason(message: str, where: str) -> str:
    """The error without the "cannot reach the central database WHERE:" that the report says itself."""
    prefix = f"cannot reach the central database {where}: "
    return message[len(prefix) :] if message.startswith(prefix) else message


def collect(cfg: Config) -> dict[str, Any] | None:
    """The ``mirror`` part of the report (None without ``[mirror] url``)."""
    if not cfg.mirror.enabled:
        return None
    from gpushift.fleet.schema import SCHEMA_VERSION

    facts = probe(cfg)
    found = rules.findings(facts)
    return {
        "where": facts.where,
        "reachable": facts.reachable,
        "schema_version": facts.schema_version,
        "code_schema_version": SCHEMA_VERSION,
        "error": facts.error,
        "elapsed_s": facts.elapsed_s,
        "connect_timeout_s": facts.connect_timeout_s,
        "summary": rules.summary(facts, SCHEMA_VERSION),
        "findings": [f.to_dict() for f in found],
        "errors": sum(1 for f in found if f.is_error),
        "warnings": sum(1 for f in found if not f.is_error),
    }


def render(mr: dict[str, Any] | None) -> list[str]:
    """The report's mirror lines (none without ``[mirror] url``)."""
    if not mr:
        return []
    lines = [f"mirror    {mr['summary']}"]
    for f in mr.get("findings") or []:
        tag = "ERROR  " if f["severity"] == "error" else "warning"
        lines.append(f"  {tag} [{f['code']}] {f['message']}")
        if f.get("hint"):
            lines.append(f"          hint: {f['hint']}")
    return lines

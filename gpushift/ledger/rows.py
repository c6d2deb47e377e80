"""A :class:`SwitchRecord` as the values of a ledger row, and back.

A row holds queryable columns beside the full record as JSON (``record``, the ``to_dict()`` form,
which is what users see).  Timestamps in columns are sortable UTC text; every text column is valid
UTF-8 whatever the record held.

Credentials never reach a row: :func:`row_values` stores the record with every secret replaced by
its digest (``--api-key``'s value, ``HF_TOKEN``'s, a URL's user and password: :mod:`gpushift.safetext.redact`),
so ``ledger diff`` still shows that one changed.  Rows written before that keep their text (the
hash chain covers it; rewriting it would break ``verify``); :func:`record_from_dict` applies the
same redaction when a row is read, so no output shows them either.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from gpushift.safetext import redact
from gpushift.values import Outcome, SwitchRecord


def utc_text(value: Any) -> str | None:
    """A timestamp as sortable UTC text (``2025-01-31T07:00:00.000000Z``); naive means UTC."""
    if value is None:
        return None
    dt = value if isinstance(value, datetime) else parse_dt(str(value))
    if dt is None:
        return text(value)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_dt(value: str | None) -> datetime | None:
    """An ISO timestamp (``Z`` accepted), or None when there is none or it does not parse."""
    if not value:
        return None
    t = value.strip()
    if t.endswith("Z"):  # fromisoformat on 3.10 does not take "Z"
        t = t[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(t)
    except ValueError:
        return None


def record_json(d: Mapping[str, Any]) -> str:
    """The record as stored: compact JSON that SQLite accepts as text."""
    # default=str: a stray value in ``extra`` must not cost the row.  Keys keep their order (the
    # phases in ``durations_s`` are in the order they ran); the hash is over the stored text.
    out = json.dumps(d, ensure_ascii=False, separators=(",", ":"), default=str)
    try:
        out.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (an argv decoded with surrogateescape) is not UTF-8 and SQLite would
        # refuse the row: escaped, JSON keeps it exactly.
        out = json.dumps(d, ensure_ascii=True, separators=(",", ":"), default=str)
    return out


def text(v: Any) -> str | None:
    """A column value as valid UTF-8 text (None stays None)."""
    if v is None:
        return None
    return str(v).encode("utf-8", "replace").decode("utf-8")


def row_values(d: Mapping[str, Any], row_id: int, key: str, prev_hash: str) -> dict[str, Any]:
    """Every chained column of the row for record ``d`` (its ``to_dict()`` form); no ``hash`` yet."""
    rec = redacted(d)
    rec["id"] = row_id
    uid = rec.get("uid")
    if not isinstance(uid, int) or isinstance(uid, bool) or not -(2**63) <= uid < 2**63:
        uid = None
    return {
        "id": row_id,
        "uuid": key,
        "ticket": text(rec.get("ticket") or ""),
        "started_at": utc_text(rec.get("started_at")) or "",
        "finished_at": utc_text(rec.get("finished_at")),
        "trigger": text(rec.get("trigger") or ""),
        "requested_by": text(rec.get("requested_by") or ""),
        "uid": uid,
        "reason": text(rec.get("reason") or ""),
        "from_backend": text(rec.get("from")),
        "to_backend": text(rec.get("to") or ""),
        "outcome": text(rec.get("outcome") or Outcome.PENDING.value),
        "failed_phase": text(rec.get("failed_phase")),
        "message": text(rec.get("message")),
        "unit": text(rec.get("unit")),
        "backend_version": text(rec.get("backend_version")),
        "gpushift_version": text(rec.get("gpushift_version")),
        "record": record_json(rec),
        "prev_hash": prev_hash,
    }


def redacted(d: Mapping[str, Any]) -> dict[str, Any]:
    """Record ``d`` with every credential replaced by its digest (unchanged, and not walked, when its
    JSON text holds nothing that could be one: most records)."""
    if not redact.may_hold_secret(json.dumps(d, ensure_ascii=False, default=str)):
        return dict(d)
    out: dict[str, Any] = redact.redact_tree(d, "digest")
    return out


def record_from_dict(d: Mapping[str, Any], row_id: int | None = None) -> SwitchRecord:
    """Rebuild a :class:`SwitchRecord` from its ``to_dict()`` form (the ``record`` column), with
    every credential in it replaced by its digest (a row written before rows were redacted)."""
    return rebuild(redacted(d), row_id)


def rebuild(d: Mapping[str, Any], row_id: int | None = None) -> SwitchRecord:
    """A :class:`SwitchRecord` from a ``to_dict()`` form as it is (see :func:`record_from_dict`)."""

    def strs(v: Any) -> list[str]:
        return [str(x) for x in v] if isinstance(v, (list, tuple)) else []

    def dct(v: Any) -> dict[str, Any]:
        return dict(v) if isinstance(v, dict) else {}

    uid = d.get("uid")
    return SwitchRecord(
        trigger=str(d.get("trigger") or ""),
        requested_by=str(d.get("requested_by") or ""),
        reason=str(d.get("reason") or ""),
        from_backend=d.get("from"),
        to_backend=str(d.get("to") or ""),
        started_at=parse_dt(d.get("started_at")) or datetime.fromtimestamp(0, timezone.utc),
        ticket=str(d.get("ticket") or ""),
        uid=uid if isinstance(uid, int) else None,
        id=row_id if row_id is not None else d.get("id"),
        finished_at=parse_dt(d.get("finished_at")),
        outcome=str(d.get("outcome") or Outcome.PENDING.value),
        failed_phase=d.get("failed_phase"),
        message=d.get("message"),
        unit=d.get("unit"),
        unit_path=d.get("unit_path"),
        unit_sha256=d.get("unit_sha256"),
        argv_configured=strs(d.get("argv_configured")),
        argv_running=strs(d.get("argv_running")),
        systemd_result=d.get("systemd_result"),
        backend_version=d.get("backend_version"),
        version_source=d.get("version_source"),
        gpushift_version=str(d.get("gpushift_version") or ""),
        gpu_facts=dct(d.get("gpu_facts")),
        vram=dct(d.get("vram")),
        durations_s=dct(d.get("durations_s")),
        extra=dct(d.get("extra")),
    )


#: Why ``mark_interrupted`` closed a row.
INTERRUPTED_MESSAGE = "the daemon stopped before this switch finished (found unfinished at the next start)"


def interrupted(d: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """Record ``d`` closed as ``interrupted`` at ``now`` (found unfinished at the daemon's start)."""
    out = dict(d)
    out["outcome"] = Outcome.INTERRUPTED.value
    out["finished_at"] = now.isoformat()
    msg = INTERRUPTED_MESSAGE
    out["message"] = f"{out['message']}; {msg}" if out.get("message") else msg
    return out


def new_key() -> str:
    """A record's idempotency key (the ``uuid`` column)."""
    import uuid

    return uuid.uuid4().hex


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()

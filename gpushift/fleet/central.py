"""A host's ledger row as the central table holds it, and back (pure).

The central row is keyed by (host, chain, id).  ``chain`` names one hash chain of the host's
ledger: the key (``uuid``) of its first row, so a chain break (``ledger/breaks.py``), whose new
chain's ids begin again at 1, starts a new central chain.  Beside the queryable columns it keeps
``chain_row``, every chained column of the local row exactly as it was hashed (JSON, ASCII: it
survives any text a row holds), so the central copy can be verified on its own (``verify.py``), and
``record``, the record as ``jsonb`` as it is, for queries: new fields of later rows need no
migration.  (``jsonb`` refuses NUL and unpaired surrogates: those characters become U+FFFD in
``record`` alone; ``chain_row`` keeps them exactly.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpushift.ledger.chain import ROW_COLUMNS, row_hash
from gpushift.ledger.rows import parse_dt

#: ``started_at`` of a row whose own cannot be read (the column is NOT NULL: it orders the listing).
EPOCH = "1970-01-01T00:00:00Z"


def canon(values: Mapping[str, Any]) -> dict[str, Any]:
    """Every column of a row by name, as JSON keeps it (a BLOB as ``blob:<hex>``, as the hash has it)."""
    out: dict[str, Any] = {}
    for c in ROW_COLUMNS:
        v = values.get(c)
        if isinstance(v, (bytes, bytearray, memoryview)):
            v = "blob:" + bytes(v).hex()
        out[c] = v
    return out


def chain_row_text(values: Mapping[str, Any]) -> str:
    """The ``chain_row`` column: every column of the local row, exact, as ASCII JSON."""
    return json.dumps(canon(values), ensure_ascii=True, sort_keys=True, separators=(",", ":"))


def _clean(v: Any) -> Any:
    """A JSON value that ``jsonb`` takes: strings without NUL or lone surrogates."""
    if isinstance(v, str):
        if "\x00" in v or any(0xD800 <= ord(c) <= 0xDFFF for c in v):
            return "".join("\ufffd" if c == "\x00" or 0xD800 <= ord(c) <= 0xDFFF else c for c in v)
        return v
    if isinstance(v, list):
        return [_clean(x) for x in v]
    if isinstance(v, dict):
        return {str(_clean(k)): _clean(x) for k, x in v.items()}
    return v


def record_value(record_text: Any) -> Any:
    """The ``record`` column's value: the record parsed (a text that is no JSON is kept as a string)."""
    try:
        parsed = json.loads(str(record_text))
    except ValueError:
        parsed = {"unparsed": str(record_text)}
    return _clean(parsed)


def timestamp(text: Any) -> str | None:
    """A row's UTC timestamp text as PostgreSQL takes it, or None when it is not one."""
    dt = parse_dt(str(text)) if text else None
    return dt.isoformat() if dt is not None and dt.tzinfo is not None else None


def central_values(host: str, chain: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """What the mirror writes for one local row (every chained column by name in ``values``)."""
    v = canon(values)
    return {
        "host": host,
        "chain": chain,
        "id": v["id"],
        "uuid": v["uuid"],
        "prev_hash": str(v["prev_hash"]),
        "hash": str(v["hash"]),
        "started_at": timestamp(v["started_at"]) or EPOCH,
        "finished_at": timestamp(v["finished_at"]),
        "trigger": _clean(v["trigger"]),
        "requested_by": _clean(v["requested_by"]),
        "from_backend": _clean(v["from_backend"]),
        "to_backend": _clean(v["to_backend"]),
        "outcome": _clean(v["outcome"]),
        "gpushift_version": _clean(v["gpushift_version"]),
        "record": json.dumps(record_value(v["record"]), ensure_ascii=False),
        "chain_row": chain_row_text(values),
    }


#: The queryable columns, which must say what ``chain_row`` says (verify compares them).
QUERY_COLUMNS = (
    "uuid",
    "outcome",
    "to_backend",
    "from_backend",
    "trigger",
    "requested_by",
    "gpushift_version",
)


def self_check(
    chain_row: str, hash_col: str, prev_col: str, id_col: int, record: Any, columns: Mapping[str, Any]
) -> str | None:
    """Why a central row is not what the host wrote (its content edited centrally), or None.

    ``record`` is the ``record`` column as parsed JSON, ``columns`` the queryable columns by name.
    """
    try:
        row = json.loads(chain_row)
    except ValueError:
        return "its chain_row is not JSON"
    if not isinstance(row, dict) or set(row) != set(ROW_COLUMNS):
        return "its chain_row does not hold the row's columns"
    if row_hash(row) != row.get("hash"):
        return "its content does not match its hash"
    if row.get("hash") != hash_col or row.get("prev_hash") != prev_col or row.get("id") != id_col:
        return "its id, hash or prev_hash column differs from the row it holds"
    if record != record_value(row.get("record")):
        return "its record differs from the record the host hashed"
    for c in QUERY_COLUMNS:
        want = _clean(row.get(c))
        if columns.get(c, want) != want:
            return f"its {c} column differs from the row it holds"
    return None

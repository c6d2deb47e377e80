"""A unit's last log lines, from the journal — the evidence a failed row carries.

When a start fails at 08:00 the admin reads the ledger at 09:00, and the journal may have rotated
by then: the row keeps the last lines of the unit's log (``journalctl``'s own matches for a unit,
system and user manager alike, newest last), bounded in lines and bytes, with secrets masked and
control characters escaped.  A host without a journal says so in the row, never an empty list.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import datetime, timezone
from typing import Any

from gpushift.safetext import redact

LINES = 50
MAX_BYTES = 16 * 1024
TIMEOUT_S = 3.0


def _message(entry: dict[str, Any]) -> str:
    m = entry.get("MESSAGE", "")
    if isinstance(m, list):  # a message that is not valid UTF-8 comes as its bytes
        return bytes(int(b) & 0xFF for b in m).decode("utf-8", "replace")
    return str(m)


def _clean(text: str) -> str:
    """Secrets masked (as on a command line), control characters escaped."""
    masked = " ".join(redact.redact_argv(text.split(" ")))
    return "".join(c if c.isprintable() or c == "\t" else f"\\x{ord(c):02x}" for c in masked)


def _when(entry: dict[str, Any]) -> str:
    try:
        us = int(entry["__REALTIME_TIMESTAMP"])
    except (KeyError, ValueError):
        return "?"
    return datetime.fromtimestamp(us / 1e6, timezone.utc).strftime("%H:%M:%S")


def unit_log(unit: str, lines: int = LINES, max_bytes: int = MAX_BYTES) -> dict[str, Any]:
    """``{"source": "journal", "lines": [...]}`` or ``{"source": "none", "error": ..., "lines": []}``."""
    journalctl = shutil.which("journalctl")
    if journalctl is None:
        return {"source": "none", "error": "no journal on this host (journalctl not found)", "lines": []}
    matches = [
        f"_SYSTEMD_UNIT={unit}",
        "+",
        f"UNIT={unit}",
        "+",
        f"_SYSTEMD_USER_UNIT={unit}",
        "+",
        f"USER_UNIT={unit}",
    ]
    cmd = [journalctl, "--no-pager", "--quiet", "-o", "json", "-n", str(lines), *matches]
    try:
        p = subprocess.run(cmd, capture_output=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"source": "none", "error": f"journalctl failed: {e}", "lines": []}
    if p.returncode != 0:
        why = p.stderr.decode("utf-8", "replace").strip()[:300] or f"exit status {p.returncode}"
        return {"source": "none", "error": f"journalctl: {why}", "lines": []}
    out: list[str] = []
    for raw in p.stdout.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        out.append(f"{_when(entry)} {_clean(_message(entry))}")
    kept: list[str] = []
    size = 0
    for line in reversed(out):  # the newest lines are the evidence: keep them within the bound
        size += len(line.encode()) + 1
        if size > max_bytes:
            break
        kept.append(line)
    kept.reverse()
    result: dict[str, Any] = {"source": "journal", "lines": kept}
    if not kept:
        result["note"] = "the journal has no line of this unit"
    if len(kept) < len(out):
        result["truncated"] = len(out) - len(kept)
    return result

"""How ledger values read for a person: times, durations, sizes, hashes, command lines, table cells.

Every value in a record came from outside at some point (a reason typed by a caller, a version a
backend printed, a holder's command line): :func:`for_terminal` escapes them all before a report lays
them out (gpushift/safetext/terminal.py), so no terminal obeys what a row holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from gpushift.backends import cmdline
from gpushift.ledger.rows import rebuild
from gpushift.safetext import terminal
from gpushift.safetext.redact import redact_argv
from gpushift.values import SwitchRecord


def for_terminal(rec: SwitchRecord) -> SwitchRecord:
    """``rec`` with every string in it escaped for a terminal (its credentials already digested by
    the reader)."""
    d = rec.to_dict()
    if not terminal.needs_escape(json.dumps(d, ensure_ascii=False, default=str)):
        return rec
    return rebuild(terminal.escape_tree(d), rec.id)


def local_time(dt: datetime | None, seconds: bool = False) -> str:
    """Local time without its offset, for a terminal (``2025-03-02 08:00``)."""
    if dt is None:
        return "-"
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone().strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def stamp(dt: datetime | None) -> str:
    """Local time with its offset, for files that travel (``2025-03-02 08:00 +0800``)."""
    if dt is None:
        return "-"
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone().strftime("%Y-%m-%d %H:%M %z")


def duration(rec: SwitchRecord) -> str:
    """How long the switch took (``41.0s``, ``12m``; ``-`` while it runs)."""
    if rec.finished_at is None or rec.started_at is None:
        return "-"
    s = (rec.finished_at - rec.started_at).total_seconds()
    return f"{s:.1f}s" if s < 600 else f"{s / 60:.0f}m"


def size(n: Any) -> str:
    """Bytes in binary units (``4.36 GiB``); ``?`` when not a number."""
    if not isinstance(n, (int, float)):
        return "?"
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:.2f} {unit}"
    return f"{n} B"


def short(h: Any, n: int = 12) -> str:
    """The first ``n`` characters of a hash or fingerprint (``-`` when there is none)."""
    return str(h)[:n] if h else "-"


def command_line(argv: Sequence[str], wrap: bool = False) -> str:
    """The command a person reads: credentials masked, shell-quoted."""
    return cmdline.join(redact_argv(argv), wrap)


def one_line(s: Any, width: int = 0) -> str:
    """``s`` on one line, cut to ``width`` characters with an ellipsis (0: not cut)."""
    text = " ".join(str(s or "").split())
    if width and len(text) > width:
        text = text[: width - 1] + "…"
    return text


def md(text: Any) -> str:
    """Text safe inside a markdown table cell or list item (and on a terminal)."""
    return terminal.escape(one_line(text)).replace("|", "\\|").replace("`", "'") or "-"


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    paint: Mapping[int, Callable[[str], str]] | None = None,
) -> str:
    """Columns padded to their widest cell; the last column (a reason, say) is not padded.

    ``paint`` colours the cells of some columns (by index) after they are padded, so colour codes
    never count as width; the header row is left plain.
    """
    cells = [list(r) for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))

    def line(r: Sequence[str], painted: bool) -> str:
        out = [c.ljust(w) for c, w in zip(r[:-1], widths[:-1], strict=True)] + [r[-1]]
        if painted and paint:
            out = [paint[i](c) if i in paint else c for i, c in enumerate(out)]
        return "  ".join(out).rstrip()

    return "\n".join([line(headers, False)] + [line(r, True) for r in cells])

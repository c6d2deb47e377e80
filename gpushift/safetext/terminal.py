"""Text from outside, made safe to show on a terminal — the one escaping function.

A reason typed by a caller, a holder's process name or command line, a backend's version string,
a unit's description, a log line, a backend name read back from the ledger: any of them may carry
bytes a terminal obeys.  ``ESC ] 52 ; c ; … BEL`` writes the clipboard, ``ESC ] 0 ;`` sets the
window title, ``ESC [ 2 J`` clears the screen, ``CR`` or a lone newline forges a line, a
right-to-left override reorders what is read.  Every human output of gpushift passes such text
through :func:`escape`, which replaces each of these characters with a visible escape:

* C0 controls (U+0000–U+001F), DEL (U+007F) and C1 controls (U+0080–U+009F, among them the 8-bit
  CSI U+009B): ``\\x1b``, ``\\x9b``...; newline, tab and carriage return as ``\\n``, ``\\t``, ``\\r``;
* line and paragraph separators and the bidirectional controls (U+061C, U+200E, U+200F,
  U+202A–U+202E, U+2066–U+2069, U+2028, U+2029): ``\\u202e``...;
* a lone surrogate (bytes that were not UTF-8, decoded with ``surrogateescape``): ``\\xff`` for the
  byte it stands for.

A backslash is left as it is.  JSON output stays JSON: :func:`json_safe` escapes, inside a JSON
text, what ``json.dumps(..., ensure_ascii=False)`` leaves raw (DEL, C1, the characters above) as
``\\uXXXX`` — the same value for a JSON reader, nothing a terminal obeys.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpushift.config.validate import FORMAT_CHARS as _FORMAT

_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f{_FORMAT}\ud800-\udfff]")
_UNSAFE_KEEP_NEWLINE = re.compile(f"[\x00-\x09\x0b-\x1f\x7f-\x9f{_FORMAT}\ud800-\udfff]")
# In JSON text, json.dumps has escaped C0 already; what it leaves raw with ensure_ascii=False:
_JSON_RAW = re.compile(f"[\x7f-\x9f{_FORMAT}\ud800-\udfff]")


def _visible(m: re.Match[str]) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    n = ord(c)
    if 0xDC80 <= n <= 0xDCFF:  # surrogateescape: the byte it stands for
        return f"\\x{n - 0xDC00:02x}"
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def escape(text: Any, keep_newlines: bool = False) -> str:
    """``text`` (made a string) with every character a terminal would obey shown as an escape.

    ``keep_newlines`` leaves ``\\n`` as it is, for a whole multi-line output that was made of
    escaped parts; a single value from outside is escaped with the default (a newline in it would
    forge a line).
    """
    s = text if isinstance(text, str) else str(text)
    pattern = _UNSAFE_KEEP_NEWLINE if keep_newlines else _UNSAFE
    return pattern.sub(_visible, s) if pattern.search(s) else s


def escape_tree(value: Any) -> Any:
    """Every string in a JSON-like value (keys too) escaped; other values as they are."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, (dict, Mapping)):
        return {escape(k) if isinstance(k, str) else k: escape_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [escape_tree(v) for v in value]
    return value


# In JSON text: an escaped control character (json.dumps writes C0 as \n, \u001b...) or one left raw.
_JSON_ANY_UNSAFE = re.compile(f"\\\\[bfnrtu]|[\x7f-\x9f{_FORMAT}\ud800-\udfff]")


def needs_escape(json_text: str) -> bool:
    """False when JSON text (``json.dumps(..., ensure_ascii=False)``) holds no string that
    :func:`escape` would change: callers may skip :func:`escape_tree`."""
    return _JSON_ANY_UNSAFE.search(json_text) is not None


def _json_escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def json_safe(json_text: str) -> str:
    """JSON text (from ``json.dumps(..., ensure_ascii=False)``) with the characters a terminal
    obeys that JSON leaves raw written as ``\\uXXXX`` escapes: still the same JSON value."""
    return _JSON_RAW.sub(_json_escape, json_text) if _JSON_RAW.search(json_text) else json_text


def fmt_mib(mib: float | None) -> str:
    """``9.1 GiB`` / ``812 MiB`` / ``unknown`` for a person."""
    if mib is None:
        return "unknown"
    if mib >= 1024:
        return f"{mib / 1024:.1f} GiB"
    return f"{mib:.0f} MiB"

"""The rules for arguments that arrive from outside — one place, pure, no I/O.

The D-Bus methods (``Switch``, ``SwitchWithOptions``), the command line (``gpushift/cli/params.py``)
and the config reader apply the same rules, so a name the CLI accepts is a name the daemon accepts:

* a backend name: ASCII letters, digits, ``-`` and ``_``, never starting with ``-`` (it would read
  as an option on a command line), at most :data:`NAME_MAX` characters;
* a free text (a reason): one line, at most :data:`REASON_MAX` characters, without control
  characters (C0, DEL, C1), line or paragraph separators, bidirectional controls or lone surrogates;
* a switch's options: a JSON object of known keys, each of its type, at most :data:`OPTIONS_MAX`
  characters of JSON (deep nesting is refused, never a ``RecursionError``).

Every refusal is an :class:`~gpushift.errors.InvalidArgument` (exit 2,
``org.gpushift.Error.InvalidArgument``) naming the field; a refused request changes nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from gpushift.errors import InvalidArgument

#: Longest backend name (config, CLI, D-Bus).
NAME_MAX = 64
#: Longest ``--reason``.
REASON_MAX = 1000
#: Longest ``--until`` text (``2026-12-01 08:00:00+01:00`` is 25).
UNTIL_MAX = 64
#: Longest options JSON a ``SwitchWithOptions`` call may carry.
OPTIONS_MAX = 4096
#: Largest ledger row id (SQLite's INTEGER PRIMARY KEY: a signed 64-bit integer).
ROW_ID_MAX = 2**63 - 1

NAME_RULE = "expected ASCII letters, digits, '-' and '_' only, not starting with '-'"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
#: Characters a terminal obeys or that reorder or break what is read: line and paragraph
#: separators and the bidirectional controls (``gpushift.safetext.terminal`` escapes the same set).
FORMAT_CHARS = "\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_NOT_ONE_LINE = re.compile(f"[\x00-\x1f\x7f-\x9f{FORMAT_CHARS}\ud800-\udfff]")
_NOT_ONE_LINE_BUT_TABS = re.compile(f"[\x00-\x08\x0a-\x1f\x7f-\x9f{FORMAT_CHARS}\ud800-\udfff]")

#: The options a switch takes, and their types (``until``: also null).
SWITCH_OPTIONS: Mapping[str, type] = {
    "reason": str,
    "now": bool,
    "restart": bool,
    "when_idle": bool,
    "hold": bool,
    "until": str,
}


def shown(value: Any, limit: int = 40) -> str:
    """``value`` for an error message: its repr (control characters escaped), cut at ``limit``."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def name_problem(name: Any) -> str | None:
    """Why ``name`` is not a backend name, or None when it is one."""
    if not isinstance(name, str):
        return f"expected a string, got {type(name).__name__}"
    if len(name) > NAME_MAX:
        return f"longer than {NAME_MAX} characters ({len(name)})"
    if not name.isascii() or not _NAME.fullmatch(name):
        return NAME_RULE
    return None


def backend_name(name: Any, field: str = "backend") -> str:
    """``name`` when it is a backend name (``off`` included).

    Raises:
        InvalidArgument: naming ``field``.
    """
    problem = name_problem(name)
    if problem is not None:
        raise InvalidArgument(f"{field} {shown(name)}: {problem}")
    return str(name)


def line_problem(text: str, limit: int, tabs: bool = False) -> str | None:
    """Why ``text`` is not one line of at most ``limit`` plain characters (``tabs``: a tab is
    plain), or None."""
    if len(text) > limit:
        return f"longer than {limit} characters ({len(text)})"
    bad = (_NOT_ONE_LINE_BUT_TABS if tabs else _NOT_ONE_LINE).search(text)
    if bad is not None:
        return f"control or formatting character U+{ord(bad.group()):04X} at column {bad.start() + 1}"
    return None


def one_line(text: Any, field: str, limit: int) -> str:
    """``text`` when it is a string of one line, at most ``limit`` characters, nothing a terminal
    obeys.

    Raises:
        InvalidArgument: naming ``field``.
    """
    if not isinstance(text, str):
        raise InvalidArgument(f"{field}: expected a string, got {type(text).__name__}")
    problem = line_problem(text, limit)
    if problem is not None:
        raise InvalidArgument(f"{field} {shown(text)}: {problem}")
    return text


def reason(text: Any) -> str:
    return one_line(text, "reason", REASON_MAX)


def url_problem(url: str) -> str | None:
    """Why ``url`` is not an ``http://`` or ``https://`` URL with a host and a valid port, or None.
    The message never repeats the URL (it may carry a credential)."""
    if any(c.isspace() or ord(c) < 32 or 127 <= ord(c) < 160 for c in url) or _NOT_ONE_LINE.search(url):
        return "expected a URL without spaces or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "expected an http:// or https:// URL with a valid host and port"
    if parts.scheme not in ("http", "https"):
        return "expected an http:// or https:// URL"
    if not parts.hostname:
        return "expected a host after http:// or https://"
    if port == 0:
        return "expected a port 1-65535"
    return None


#: systemd.unit(5), DESCRIPTION (https://www.freedesktop.org/software/systemd/man/latest/systemd.unit.html),
#: and systemd's src/basic/unit-name.c (VALID_CHARS, UNIT_NAME_MAX = 256 with ``strlen >= MAX``
#: refused): a name prefix of ASCII letters, digits, ':', '-', '_', '.' and '\\', an optional
#: instance after one '@', a suffix; at most 255 characters in all.  gpushift runs services only.
UNIT_MAX = 255
_UNIT = re.compile(r"[A-Za-z0-9:_.\\@-]+")


def unit_problem(unit: str) -> str | None:
    """Why ``unit`` is not the name of a service unit (an instance of a template included), or None."""
    if len(unit) > UNIT_MAX:
        return f"longer than {UNIT_MAX} characters ({len(unit)})"
    if not unit.isascii() or not _UNIT.fullmatch(unit):
        return "expected ASCII letters, digits and ':', '-', '_', '.', '\\', '@' only (systemd.unit(5))"
    if not unit.endswith(".service") or unit == ".service":
        return "expected a service unit name ending in .service (e.g. gpushift-x.service)"
    prefix, at, instance = unit[: -len(".service")].partition("@")
    if not prefix:
        return "expected a name before the suffix (and before any '@')"
    if at and not instance:
        return "a template (nothing after '@'): name an instance, e.g. foo@1.service"
    if "@" in instance:
        return "expected at most one '@'"
    return None


#: Deepest nesting of brackets a JSON or TOML text from outside may have: checked before it is
#: parsed, so the parser never recurses into a RecursionError (caught, it can still leave the
#: interpreter unsettled).
NESTING_MAX = 64


def nesting_problem(text: str, limit: int = NESTING_MAX, comments: bool = False) -> str | None:
    """Why ``text`` (JSON, or TOML with ``comments``) nests ``[``/``{`` deeper than ``limit``, or
    None.  Brackets inside strings (``"..."`` with escapes, TOML's ``'...'``) and comments do not
    count; the text need not be valid."""
    depth = 0
    quote = ""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 1
            elif c == quote:
                quote = ""
        elif c == '"' or (c == "'" and comments):
            quote = c
        elif c == "#" and comments:
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif c in "[{":
            depth += 1
            if depth > limit:
                return f"nested deeper than {limit} levels"
        elif c in "]}":
            depth = max(0, depth - 1)
        i += 1
    return None


def options_json(text: Any) -> dict[str, Any]:
    """The options object of ``SwitchWithOptions`` (``""``: none), checked by :func:`switch_options`."""
    if not isinstance(text, str):
        raise InvalidArgument(f"options: expected a string, got {type(text).__name__}")
    if not text:
        return {}
    if len(text) > OPTIONS_MAX:
        raise InvalidArgument(f"options: longer than {OPTIONS_MAX} characters ({len(text)})")
    too_deep = nesting_problem(text)
    if too_deep is not None:
        raise InvalidArgument(f"options: {too_deep}")
    try:
        value = json.loads(text)
    except ValueError as e:
        raise InvalidArgument(f"options are not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise InvalidArgument(f"options: expected a JSON object, got {type(value).__name__}")
    return switch_options(value)


def switch_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Known keys only, each of its type; ``reason`` and ``until`` one plain line.

    Raises:
        InvalidArgument: naming the key.
    """
    out: dict[str, Any] = {}
    for key, value in options.items():
        want = SWITCH_OPTIONS.get(key) if isinstance(key, str) else None
        if want is None:
            raise InvalidArgument(
                f"option {shown(key)}: unknown (expected one of: {', '.join(sorted(SWITCH_OPTIONS))})"
            )
        if value is None and key == "until":
            continue
        if not isinstance(value, want):
            raise InvalidArgument(f"option {key}: expected {want.__name__}, got {type(value).__name__}")
        out[key] = value
    out["reason"] = reason(out.get("reason", ""))
    if "until" in out:
        one_line(out["until"], "until", UNTIL_MAX)
    if out.get("hold") and out.get("until"):
        raise InvalidArgument("options hold and until exclude each other")
    return out


def switch_request(backend: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """A switch's arguments checked before anything changes: the backend's name (whether it is
    configured is the switcher's question) and its options.  Returns the options to use."""
    backend_name(backend)
    return switch_options(options)

"""L4: the arguments of every D-Bus method that takes any, checked before anything else sees them.

Each such handler of :mod:`gpushift.adapters.dbus_service` calls :func:`check` first.  pydbus hands
the handlers plain Python values (an ``a{sv}``'s variants unpacked: ``b`` a bool, ``s`` a str, ``x``
an int), so a type is checked on the value.  :func:`switch_options` turns ``SwitchTo``'s typed
options into the option dictionary the daemon takes (the one ``SwitchWithOptions`` carries as JSON).
A refusal is :class:`~gpushift.errors.InvalidArgs` (``org.gpushift.Error.InvalidArgs``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from ..errors import InvalidArgs

#: Longest backend name, reason and options JSON a caller may send (a name is a config key).
MAX_BACKEND = 200
MAX_REASON = 2000
MAX_OPTIONS_JSON = 8000

#: SwitchTo's options and the D-Bus types each may have (``until``: ISO 8601 text or UNIX seconds).
OPTION_TYPES: dict[str, tuple[str, ...]] = {
    "reason": ("s",),
    "now": ("b",),
    "restart": ("b",),
    "hold": ("b",),
    "when_idle": ("b",),
    "until": ("s", "x"),
}
_TYPE_NAMES = {"s": "a string (s)", "b": "a boolean (b)", "x": "an integer (x)"}


def _type_of(value: Any) -> str | None:
    if isinstance(value, bool):  # before int: a bool is an int in Python
        return "b"
    if isinstance(value, int):
        return "x"
    if isinstance(value, str):
        return "s"
    return None


def _text(what: str, value: Any, limit: int, empty: bool = True) -> None:
    if not isinstance(value, str):
        raise InvalidArgs(f"{what} must be a string")
    if not empty and not value:
        raise InvalidArgs(f"{what} must not be empty")
    if len(value) > limit:
        raise InvalidArgs(f"{what} is longer than {limit} characters")
    if "\x00" in value:
        raise InvalidArgs(f"{what} contains a NUL character")


def check(member: str, *args: Any) -> None:
    """Refuse malformed arguments of D-Bus method ``member`` (InvalidArgs)."""
    if member in ("Switch", "SwitchWithOptions", "SwitchTo"):
        if len(args) != 2:
            raise InvalidArgs(f"{member} takes a backend and one more argument")
        _text("backend", args[0], MAX_BACKEND, empty=False)
        if member == "Switch":
            _text("reason", args[1], MAX_REASON)
        elif member == "SwitchWithOptions":
            _text("options_json", args[1], MAX_OPTIONS_JSON)
        else:
            switch_options(args[1])
        return
    if args:
        raise InvalidArgs(f"{member} takes no arguments")


def switch_options(options: Any) -> dict[str, Any]:
    """SwitchTo's ``a{sv}`` → the daemon's options (``until`` as ISO 8601 text); InvalidArgs for an
    unknown key, a value of another type, or ``hold`` together with ``until``."""
    if not isinstance(options, Mapping):
        raise InvalidArgs("options must be a dictionary a{sv}")
    out: dict[str, Any] = {}
    for key, value in options.items():
        allowed = OPTION_TYPES.get(key)
        if allowed is None:
            raise InvalidArgs(f"unknown option {key!r} (known: {', '.join(OPTION_TYPES)})")
        if _type_of(value) not in allowed:
            raise InvalidArgs(f"option {key!r} must be {' or '.join(_TYPE_NAMES[t] for t in allowed)}")
        out[key] = value
    if "reason" in out:
        _text("reason", out["reason"], MAX_REASON)
    until = out.get("until")
    if isinstance(until, int):
        try:
            out["until"] = datetime.fromtimestamp(until, timezone.utc).isoformat()
        except (OverflowError, OSError, ValueError):
            raise InvalidArgs(f"option 'until': {until} is not a time in UNIX seconds") from None
    elif isinstance(until, str):
        _text("until", until, 100, empty=False)
    if out.get("hold") and "until" in out:
        raise InvalidArgs("options 'hold' and 'until' exclude each other (a hold lasts until Resume)")
    return out


def variant_types(options: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """The client's side: each option with its D-Bus type for ``SwitchTo`` (``until`` as ``s`` or ``x``)."""
    out: dict[str, tuple[str, Any]] = {}
    for key, value in options.items():
        t = _type_of(value)
        if key not in OPTION_TYPES or t not in OPTION_TYPES[key]:
            raise InvalidArgs(f"option {key!r}={value!r} cannot be sent to SwitchTo")
        out[key] = (t, value)
    return out

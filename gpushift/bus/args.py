"""The arguments of every D-Bus method that takes any, checked before anything changes.

Each such handler of :mod:`gpushift.bus.service` calls :func:`check`, which applies the
rules of :mod:`gpushift.config.validate` (backend names, one-line reasons, a switch's known options) and
returns the options the daemon is to use.  ``SwitchTo`` carries its options as ``a{sv}``: pydbus
hands them over unpacked (``b`` a bool, ``s`` a str, ``x`` an int), so :func:`switch_options`
checks each value's D-Bus type and turns ``until`` in UNIX seconds into ISO 8601 text before the
common rules run.  A refusal is :class:`~gpushift.errors.InvalidArgument`
(``org.gpushift.Error.InvalidArgument``).  :func:`variant_types` is the client's side.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from gpushift.config import validate
from gpushift.errors import InvalidArgument

#: The D-Bus types each of SwitchTo's options may have (``until``: ISO 8601 text or UNIX seconds).
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


def check(member: str, *args: Any) -> dict[str, Any]:
    """Refuse malformed arguments of D-Bus method ``member`` (InvalidArgument); for a switch
    method, the options to use (``{}`` for the others)."""
    if member in ("Switch", "SwitchWithOptions", "SwitchTo"):
        if len(args) != 2:
            raise InvalidArgument(f"{member} takes a backend and one more argument")
        backend, extra = args
        if member == "Switch":
            return validate.switch_request(backend, {"reason": extra})
        if member == "SwitchWithOptions":
            return validate.switch_request(backend, validate.options_json(extra))
        return validate.switch_request(backend, switch_options(extra))
    if args:
        raise InvalidArgument(f"{member} takes no arguments")
    return {}


def switch_options(options: Any) -> dict[str, Any]:
    """SwitchTo's ``a{sv}`` → options for :func:`gpushift.config.validate.switch_options`: each known key's
    value of one of its D-Bus types, ``until`` in UNIX seconds as ISO 8601 text (UTC)."""
    if not isinstance(options, Mapping):
        raise InvalidArgument("options: expected a dictionary a{sv}")
    out: dict[str, Any] = {}
    for key, value in options.items():
        allowed = OPTION_TYPES.get(key)
        if allowed is not None and _type_of(value) not in allowed:
            raise InvalidArgument(f"option {key}: expected {' or '.join(_TYPE_NAMES[t] for t in allowed)}")
        out[key] = value  # an unknown key is the common rules' to refuse
    until = out.get("until")
    if isinstance(until, int) and not isinstance(until, bool):
        try:
            out["until"] = datetime.fromtimestamp(until, timezone.utc).isoformat()
        except (OverflowError, OSError, ValueError):
            raise InvalidArgument(f"option until: {until} is not a time in UNIX seconds") from None
    return out


def variant_types(options: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """The client's side: each option with its D-Bus type for ``SwitchTo`` (``until`` as ``s`` or ``x``)."""
    out: dict[str, tuple[str, Any]] = {}
    for key, value in options.items():
        t = _type_of(value)
        if key not in OPTION_TYPES or t not in OPTION_TYPES[key]:
            raise InvalidArgument(f"option {key}={value!r} cannot be sent to SwitchTo")
        out[key] = (t, value)
    return out

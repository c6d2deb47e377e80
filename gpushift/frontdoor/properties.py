"""``org.gpushift.Switcher1``'s properties, as D-Bus delivers them, → a :class:`DaemonView` (pure).

The daemon link (:mod:`gpushift.frontdoor.daemonlink`) reads the properties once (``GetAll``) and
then follows ``PropertiesChanged``; each time it hands the properties it knows to :func:`view_of`.
The values arrive as jeepney gives a variant: ``(signature, value)``.  A property whose signature is
not the documented one (an older or a newer daemon, a bug) is left out, and the view keeps that
field's default; sizes are bounded, since a view lives for the process's life.  The names are
written here again rather than imported from ``gpushift.bus``: the front door imports nothing of the
daemon's process (``pyproject.toml``, the front door's contract); ``tests/unit/frontdoor`` checks
that they match.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpushift.frontdoor.view import DaemonView

SWITCHER_BUS_NAME = "org.gpushift.Switcher1"
SWITCHER_PATH = "/org/gpushift/Switcher1"
SWITCHER_INTERFACE = "org.gpushift.Switcher1"

#: At most this many backends in ``Models`` and models in ``NextServed`` (the rest is left out).
MAX_ENTRIES = 1024
#: A name (backend, model, zone, phase) longer than this is left out.
MAX_NAME = 256

#: Each property the front door reads: its D-Bus signature.
SIGNATURES = {
    "ActiveBackend": "s",
    "SwitchInProgress": "b",
    "SwitchTarget": "s",
    "Phase": "s",
    "Mode": "s",
    "Models": "a{sas}",
    "NextServed": "a{st}",
    "TimeZone": "s",
}


def _name(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= MAX_NAME


def _text(value: Any) -> str | None:
    return value if _name(value) else None


def _models(value: Any) -> dict[str, tuple[str, ...]] | None:
    if not isinstance(value, Mapping):
        return None
    out: dict[str, tuple[str, ...]] = {}
    for backend, names in list(value.items())[:MAX_ENTRIES]:
        if _name(backend) and isinstance(names, (list, tuple)):
            out[backend] = tuple(n for n in names[:MAX_ENTRIES] if _name(n))
    return out


def _next_served(value: Any) -> dict[str, int] | None:
    if not isinstance(value, Mapping):
        return None
    out: dict[str, int] = {}
    for model, when in list(value.items())[:MAX_ENTRIES]:
        if _name(model) and isinstance(when, int) and not isinstance(when, bool) and when >= 0:
            out[model] = when
    return out


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


_READERS = {
    "ActiveBackend": ("active", _text),
    "SwitchInProgress": ("switching", _bool),
    "SwitchTarget": ("target", _text),
    "Phase": ("phase", _text),
    "Mode": ("mode", _text),
    "Models": ("models", _models),
    "NextServed": ("next_served", _next_served),
    "TimeZone": ("zone", _text),
}


def values_of(props: Mapping[str, Any]) -> dict[str, Any]:
    """The view's fields that ``props`` (name → ``(signature, value)``) give, each checked."""
    fields: dict[str, Any] = {}
    for name, (field, read) in _READERS.items():
        variant = props.get(name)
        if not isinstance(variant, tuple) or len(variant) != 2 or variant[0] != SIGNATURES[name]:
            continue
        value = read(variant[1])
        if value is not None:
            fields[field] = value
    return fields


def view_of(props: Mapping[str, Any]) -> DaemonView:
    """What the front door knows once it has read ``props`` from a daemon that owns its name."""
    return DaemonView(connected=True, **values_of(props))


def merged(known: Mapping[str, Any], changed: Mapping[str, Any], invalidated: Any = ()) -> dict[str, Any]:
    """The properties known after a ``PropertiesChanged``: ``changed`` replaces, ``invalidated`` removes
    (the daemon never invalidates, but a name removed is not kept stale)."""
    out = {**known, **{k: v for k, v in changed.items() if isinstance(k, str) and k in SIGNATURES}}
    for name in invalidated if isinstance(invalidated, (list, tuple)) else ():
        out.pop(name, None)
    return out

"""A backend's model names — what the front door routes by and ``NextServed`` is keyed by.

One owner, the config: a backend's ``models = [...]`` when it is set, else what its kind reads from
its unit's command line (:attr:`gpushift.backends.kind.Kind.served_models`, through the one parser
:mod:`gpushift.backends.cmdline`): vLLM's ``--served-model-name``, else ``--model``;
llama-server's ``--alias``, else the model file as given to ``-m``; nothing for ``generic``.

:func:`compare` holds those names against what the running server lists at ``/v1/models``
(``data[].id``, and an entry's ``aliases`` where a server lists them): the warm-up and
``gpushift check`` report a name the server does not answer to.  Pure: plain values in and out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpushift.backends import cmdline, kinds

#: ``/v1/models`` answers are read up to this many entries (a server listing thousands is not ours).
MAX_LISTED = 256


def resolve(
    kind: str, configured: Sequence[str] | None, exec_start: Sequence[str], environment: Sequence[str]
) -> tuple[str, ...]:
    """The model names of a backend: ``configured`` (the config's ``models``) when set, else its
    kind's reading of the unit's ``ExecStart=`` (as written; expanded here with its
    ``Environment=`` the way systemd does)."""
    if configured is not None:
        return tuple(configured)
    env = cmdline.environment(environment)
    return tuple(kinds.kind_of(kind).served_models(cmdline.expand(exec_start, env), env))


def listed(body: Any) -> list[str] | None:
    """The names a ``/v1/models`` answer (parsed JSON) lists: every ``data[].id`` and each entry's
    ``aliases``; None when the answer is not of that shape."""
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        return None
    out: list[str] = []
    for entry in body["data"][:MAX_LISTED]:
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("id"), str):
            out.append(entry["id"])
        aliases = entry.get("aliases")
        if isinstance(aliases, list):
            out.extend(a for a in aliases if isinstance(a, str))
    return list(dict.fromkeys(out))


def compare(names: Sequence[str], served: Sequence[str]) -> dict[str, Any] | None:
    """A mismatch between the model names gpushift knows (``names``) and those the server lists
    (``served``): ``{"expected", "listed", "missing"}`` (the known names it does not list), or None
    when every known name is listed.  No known names and a server listing some is a mismatch too
    (``missing`` empty): requests naming a model cannot be routed to it."""
    missing = [n for n in names if n not in served]
    if not missing and (names or not served):
        return None
    return {"expected": list(names), "listed": list(served)[:32], "missing": missing}

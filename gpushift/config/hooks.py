"""The ``[hooks]`` and ``[notify]`` tables of the config file → frozen, validated types.

Read by ``config/schema.py``, which passes its reader (a :class:`~gpushift.config.keys.KeyReader`:
the same error format and number checks as every other key).  docs/config.md lists every key, docs/hooks.md what runs when.

* ``[hooks]``: ``user`` (default ``nobody``) and one entry per event (``before_stop``,
  ``after_ready``, ``on_failure``, ``before_boundary``): an argv list, or a table
  ``{ argv = [...], required = true, timeout_s = N, lead_s = N }`` (``required`` for
  ``before_stop`` only, ``lead_s`` for ``before_boundary`` only).  The argv is run exactly as
  written: no shell, no ``$VAR`` expansion, so its first element must be an absolute path.
* ``[notify]``: ``webhook_url`` (http/https; ``user:password@`` in it is sent as basic auth),
  ``lead_s`` (the notice before a scheduled switch; 0 turns it off), ``timeout_s``,
  ``max_queued``.  An error about the URL never shows the URL (it may carry a token).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpushift.config import validate
from gpushift.config.keys import KeyReader
from gpushift.values import HookEvent

#: A user name as useradd(8) takes it (or a numeric uid).
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}\$?|[0-9]{1,10}")


@dataclass(frozen=True)
class Hook:
    """One configured hook: ``argv`` run as ``[hooks] user`` in a transient unit."""

    event: HookEvent
    argv: tuple[str, ...]
    required: bool = False  # before_stop only: a non-zero exit refuses the switch
    timeout_s: float = 60.0
    lead_s: float = 300.0  # before_boundary only: this long before the scheduled switch


@dataclass(frozen=True)
class HooksConfig:
    user: str = "nobody"
    before_stop: Hook | None = None
    after_ready: Hook | None = None
    on_failure: Hook | None = None
    before_boundary: Hook | None = None

    def get(self, event: HookEvent) -> Hook | None:
        hook: Hook | None = getattr(self, event.value)
        return hook


@dataclass(frozen=True)
class NotifyConfig:
    webhook_url: str = ""  # "": no webhook
    lead_s: float = 300.0  # the notice this long before a scheduled switch (0: none)
    timeout_s: float = 10.0  # one POST's deadline
    max_queued: int = 1000  # documents waiting on disk; beyond it the oldest is dropped

    @property
    def enabled(self) -> bool:
        return bool(self.webhook_url)


def read_hooks(r: KeyReader, data: Mapping[str, Any]) -> HooksConfig:
    h = r.table(data, "hooks")
    r.no_unknown(h, "hooks", {"user", *(e.value for e in HookEvent)})
    user = h.get("user", HooksConfig.user)
    if not isinstance(user, str) or not _USER.fullmatch(user):
        raise r.err("hooks.user", f"expected a user name (e.g. 'nobody') or a numeric uid, got {user!r}")
    hooks = {e.value: _hook(r, h, e) for e in HookEvent if e.value in h}
    return HooksConfig(user=user, **hooks)


def _hook(r: KeyReader, h: Mapping[str, Any], event: HookEvent) -> Hook:
    key = f"hooks.{event.value}"
    v = h[event.value]
    if isinstance(v, list):
        return Hook(event, _argv(r, key, v))
    if not isinstance(v, dict):
        raise r.err(key, f'expected an argv list (e.g. ["/usr/local/bin/x", "arg"]) or a table, got {v!r}')
    allowed = {"argv", "timeout_s"}
    if event is HookEvent.BEFORE_STOP:
        allowed.add("required")
    if event is HookEvent.BEFORE_BOUNDARY:
        allowed.add("lead_s")
    r.no_unknown(v, key, allowed)
    if "argv" not in v:
        raise r.err(f"{key}.argv", "missing (expected the command to run, as a list of strings)")
    required = v.get("required", False)
    if not isinstance(required, bool):
        raise r.err(f"{key}.required", f"expected true or false, got {required!r}")
    return Hook(
        event,
        _argv(r, f"{key}.argv", v["argv"]),
        required=required,
        timeout_s=float(r.number(v, key, "timeout_s", 60.0, minimum=1, maximum=3600)),
        lead_s=float(r.number(v, key, "lead_s", 300.0, minimum=1, maximum=86400)),
    )


def _argv(r: KeyReader, key: str, v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise r.err(key, f"expected a non-empty list of strings, got {v!r}")
    if not v[0].startswith("/"):
        raise r.err(key, f"the program must be an absolute path (no shell, no PATH search), got {v[0]!r}")
    if any("\0" in x for x in v):
        raise r.err(key, "an argument holds a NUL character")
    for x in v:  # one plain line each, as every string of the config (gpushift.config.validate)
        r.one_line(key, x)
    return tuple(v)


def read_notify(r: KeyReader, data: Mapping[str, Any]) -> NotifyConfig:
    n = r.table(data, "notify")
    r.no_unknown(n, "notify", {"webhook_url", "lead_s", "timeout_s", "max_queued"})
    url = n.get("webhook_url", "")
    if not isinstance(url, str):
        raise r.err("notify.webhook_url", f"expected a URL string, got a {type(url).__name__}")
    if url:
        problem = validate.url_problem(url)
        if problem:
            # Never the URL itself: a chat's incoming-webhook URL is its credential.
            raise r.err("notify.webhook_url", f"{problem} (the URL is not shown: it may hold a token)")
    return NotifyConfig(
        webhook_url=url,
        lead_s=float(r.number(n, "notify", "lead_s", 300.0, maximum=86400)),
        timeout_s=float(r.number(n, "notify", "timeout_s", 10.0, minimum=1, maximum=300)),
        max_queued=int(r.number(n, "notify", "max_queued", 1000, minimum=1, integer=True, maximum=100000)),
    )

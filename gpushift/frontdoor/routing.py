"""Where one request goes: forward it to a backend, hold it through a switch, or answer it here.

Pure: a request's model name and what the front door knows (:class:`Situation`) → a
:class:`Decision`.  The rules (docs/frontdoor.md, issue 19 items 4 and 5):

* a name is resolved through each backend's model names (the config's ``models``; when the config
  names none, the daemon's ``Models`` property) and its ``aliases``; a name no backend has is
  unknown (404); a request that names no model goes wherever the serving backend is;
* served now → forwarded to the serving backend (an alias is rewritten to that backend's first
  model name, since vLLM answers 404 to a name it does not serve);
* while a switch is in progress (``SwitchInProgress``, or a ``Close`` not yet released): a request
  for a model the target serves, or naming none, is held; one that the old backend still serves,
  while it is not closed yet, is forwarded there (the drain waits for it); one the target does not
  serve is answered at once; when the target is not known yet, every request is held and sorted at
  the release;
* ``off`` → answered, with when the model comes back; nothing known to serve → answered;
* the daemon lost: forwarded to the last backend known serving while its health answers
  (``Situation.fallback``, kept by the core); nothing known → answered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpushift.frontdoor.view import OFF, DaemonView

FORWARD = "forward"
HOLD = "hold"
ANSWER = "answer"

# Why the front door answers a request itself (answers.py renders each).
NOT_SERVED = "not_served"  # a known model another backend serves
UNKNOWN_MODEL = "unknown_model"  # a name no backend has: 404
HOST_OFF = "off"  # ActiveBackend is "off"
NOTHING_SERVING = "nothing_serving"  # the daemon knows of no backend serving (a failed start, ...)
DAEMON_LOST = "daemon_lost"  # the daemon does not answer and no backend is known to be serving


@dataclass(frozen=True)
class Names:
    """Every model name and alias of the configured backends, and who has it."""

    models: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # backend -> model names
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # backend -> aliases
    _owners: Mapping[str, tuple[str, ...]] = field(default_factory=dict, repr=False, compare=False)
    _aliased: Mapping[str, tuple[str, ...]] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, models: Mapping[str, tuple[str, ...]], aliases: Mapping[str, tuple[str, ...]]) -> Names:
        return cls(dict(models), dict(aliases), _index(models), _index(aliases))

    def owners(self, name: str) -> tuple[str, ...]:
        """The backends that serve ``name`` as one of their model names."""
        return self._owners.get(name, ())

    def aliased(self, name: str) -> tuple[str, ...]:
        """The backends that take ``name`` as an alias."""
        return self._aliased.get(name, ())

    def known(self, name: str) -> bool:
        return name in self._owners or name in self._aliased

    def every_model(self) -> list[str]:
        """Every model name, each once, in the config's order of backends."""
        seen: dict[str, None] = {}
        for names in self.models.values():
            seen.update(dict.fromkeys(names))
        return list(seen)

    def reaches(self, name: str, backend: str) -> tuple[bool, str | None]:
        """Whether ``name`` reaches ``backend``, and the name to write into the body (None: keep)."""
        if backend in self.owners(name):
            return True, None
        if backend in self.aliased(name):
            own = self.models.get(backend, ())
            return True, (own[0] if own else None)
        return False, None


def _index(table: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for backend, names in table.items():
        for n in names:
            out[n] = (*out.get(n, ()), backend)
    return out


def names_of(
    configured: Mapping[str, tuple[str, ...] | None],
    aliases: Mapping[str, tuple[str, ...]],
    announced: Mapping[str, tuple[str, ...]],
) -> Names:
    """The names table: a backend's configured ``models``, or (None there) what the daemon
    announces for it in ``Models``; ``aliases`` from the config.

    Args:
        configured: backend → its ``models`` from the config (None: not written there).
        aliases: backend → its ``aliases`` from the config.
        announced: the daemon's ``Models`` property (backend → names).
    """
    models = {b: (m if m is not None else tuple(announced.get(b, ()))) for b, m in configured.items()}
    return Names.of(models, {b: tuple(aliases.get(b, ())) for b in configured})


@dataclass(frozen=True)
class Situation:
    """What the front door knows when a request arrives."""

    view: DaemonView
    closed: frozenset[str] = frozenset()  # backends Close()d and not released since
    fallback: str = ""  # the daemon lost: the last backend known serving whose health answers
    backends: frozenset[str] = frozenset()  # the configured backends' names

    @property
    def switching(self) -> bool:
        """A switch is in progress: the daemon says so, or a Close() is not released yet."""
        return bool(self.closed) or (self.view.connected and self.view.switching)


@dataclass(frozen=True)
class Decision:
    """What to do with one request.

    ``forward``: to ``backend``, with ``rewrite`` (when not None) as the body's ``model``;
    ``hold``: until the switch to ``backend`` ends ("" when its target is not known yet);
    ``answer``: here, for ``reason`` (answers.py), ``backend`` naming what serves now ("" none).
    """

    action: str
    backend: str = ""
    rewrite: str | None = None
    reason: str = ""
    target: str = ""  # an answer during a switch: where it goes


def forward(backend: str, rewrite: str | None = None) -> Decision:
    return Decision(FORWARD, backend, rewrite)


def answer(reason: str, serving: str = "", target: str = "") -> Decision:
    return Decision(ANSWER, serving, reason=reason, target=target)


def route(names: Names, s: Situation, model: str | None) -> Decision:
    """The decision for a request naming ``model`` (None: it names none)."""
    if model is not None and not names.known(model):
        return answer(UNKNOWN_MODEL, _serving(s))
    if not s.view.connected:
        return _route_lost(names, s, model)
    if s.switching:
        return _route_switching(names, s, model)
    active = s.view.active
    if active == OFF:
        return answer(HOST_OFF)
    if active not in s.backends:
        return answer(NOTHING_SERVING)
    return _to(names, active, model) or answer(NOT_SERVED, active)


def _serving(s: Situation) -> str:
    if not s.view.connected:
        return s.fallback
    return s.view.active if s.view.active in s.backends else ""


def _to(names: Names, backend: str, model: str | None) -> Decision | None:
    """Forward ``model`` to ``backend`` when it reaches it (None: it does not)."""
    if model is None:
        return forward(backend)
    ok, rewrite = names.reaches(model, backend)
    return forward(backend, rewrite) if ok else None


def _route_lost(names: Names, s: Situation, model: str | None) -> Decision:
    if s.closed:
        return Decision(HOLD, "")  # the daemon went away between Close and Release
    if not s.fallback:
        return answer(DAEMON_LOST)
    return _to(names, s.fallback, model) or answer(NOT_SERVED, s.fallback)


def _route_switching(names: Names, s: Situation, model: str | None) -> Decision:
    target = s.view.target if s.view.switching else ""
    active = s.view.active if s.view.active in s.backends else ""
    if target in s.backends and (model is None or names.reaches(model, target)[0]):
        return Decision(HOLD, target)
    if active and active not in s.closed and active != target:
        d = _to(names, active, model)
        if d is not None:
            return d  # the old backend still serves it and is not draining yet
    if not target:
        return Decision(HOLD, "")  # sorted at the release
    if target == OFF:
        return answer(HOST_OFF, active, target)
    return answer(NOT_SERVED, active, target)


def after_release(names: Names, serving: str, model: str | None, backends: Iterable[str]) -> Decision:
    """A held request once the switch ended with ``serving`` ("" or "off": nothing) serving."""
    if serving in set(backends):
        d = _to(names, serving, model)
        if d is not None:
            return d
        return answer(NOT_SERVED, serving)
    return answer(HOST_OFF if serving == OFF else NOTHING_SERVING)

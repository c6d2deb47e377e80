"""The log of an object that was given none — :data:`NULL_LOG`, which drops every line.

The daemon hands its structlog logger to what it builds (the switcher, the keeper, the sampler, the
override store, the look-ahead, the job watch); a test or a one-shot CLI command may build them
without one.  Their ``log`` argument defaults to :data:`NULL_LOG`, so their code logs unguarded
(``self.log.info(...)``), never ``if self.log is not None``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _drop(*_args: Any, **_fields: Any) -> None:
    return None


class NullLog:
    """Any method of a structlog logger (``info``, ``error``, ``debug``...): does nothing; ``bind``
    and ``new`` return the same null log."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("__"):  # copy, pickle, ... ask for protocols it does not have
            raise AttributeError(name)
        if name in ("bind", "new", "unbind", "try_unbind"):
            return lambda *_a, **_k: self
        return _drop

    def __repr__(self) -> str:
        return "NULL_LOG"


#: The one null log (typed ``Any``, as the structlog loggers it stands in for).
NULL_LOG: Any = NullLog()

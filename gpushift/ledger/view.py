"""The ledger as ``gpushift status`` shows it — its newest rows and its health, in memory.

The daemon answers status on its GLib loop thread, which must not do I/O.  Its ledger is therefore
a :class:`RememberingLedger`: after every write (on the writer's thread — the switch worker, the
keeper, the start-up) it reads its newest rows and its health once and keeps them as a
:class:`LedgerView`, which status takes from memory.  The CLI, when the daemon is down, reads the
same view directly with :func:`read_view`, so both show the same fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from gpushift.ports import Ledger
from gpushift.values import Outcome, SwitchRecord

#: Rows kept: enough to find when the serving backend last became the serving one.
KEEP_ROWS = 50


@dataclass(frozen=True)
class LedgerView:
    """The newest rows (newest first) and the ledger's health, as read at one moment."""

    rows: tuple[SwitchRecord, ...] = ()
    health: Mapping[str, Any] = field(default_factory=dict)

    def last(self) -> SwitchRecord | None:
        return self.rows[0] if self.rows else None

    def since(self, backend: str) -> datetime | None:
        """When ``backend`` last became the serving one: a switch to it, or a rollback to it."""
        for r in self.rows:
            if r.finished_at is None:
                continue
            if r.outcome == Outcome.OK.value and r.to_backend == backend:
                return r.finished_at
            if r.outcome == Outcome.ROLLED_BACK.value and r.from_backend == backend:
                return r.finished_at
        return None


def read_view(ledger: Ledger, keep: int = KEEP_ROWS) -> LedgerView:
    """Read the view now (never raises: an unreadable ledger says so in ``health``)."""
    try:
        return LedgerView(tuple(ledger.list(limit=keep)), dict(ledger.health()))
    except Exception as e:
        return LedgerView((), {"state": "unreadable", "error": repr(e)})


class RememberingLedger:
    """A :class:`gpushift.ports.Ledger` that keeps its :class:`LedgerView` up to date in memory.

    Every call goes to ``inner`` unchanged (an exception of ``inner`` still reaches the caller);
    the view is read again after each write and after a flush of the pending spool.  Anything else
    ``inner`` offers (``flush_pending``, ``verify``...) is reached through attribute access.
    """

    def __init__(self, inner: Ledger, keep: int = KEEP_ROWS) -> None:
        self._inner = inner
        self._keep = keep
        self._view = read_view(inner, keep)

    def view(self) -> LedgerView:
        """The view as of the last write (no I/O)."""
        return self._view

    def _refresh(self) -> None:
        self._view = read_view(self._inner, self._keep)

    def begin(self, record: SwitchRecord) -> int:
        try:
            return self._inner.begin(record)
        finally:
            self._refresh()

    def finish(self, record: SwitchRecord) -> None:
        try:
            self._inner.finish(record)
        finally:
            self._refresh()

    def mark_interrupted(self, now: datetime) -> list[int]:
        try:
            return self._inner.mark_interrupted(now)
        finally:
            self._refresh()

    def flush_pending(self) -> int:
        try:
            return int(getattr(self._inner, "flush_pending")())  # noqa: B009 - not on the port
        finally:
            self._refresh()

    def health(self) -> dict[str, Any]:
        h = self._inner.health()
        self._view = replace(self._view, health=dict(h))
        return h

    def last(self) -> SwitchRecord | None:
        return self._inner.last()

    def get(self, row_id: int) -> SwitchRecord | None:
        return self._inner.get(row_id)

    def list(self, limit: int = 20, **filters: Any) -> list[SwitchRecord]:
        return self._inner.list(limit, **filters)

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self._inner, name)

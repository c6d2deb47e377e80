"""A person's (or systemctl's) choice that the schedule waits for, and where it is kept.

Pure: the functions here compute the override a person's request or a change behind gpushift's
back leads to; :class:`OverrideStore` is the port that keeps it across restarts.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from gpushift.schedule import Schedule
from gpushift.values import OFF, Mode, OverrideSource


@dataclass(frozen=True)
class Override:
    """``mode`` is ``override`` (until ``until``) or ``hold`` (until ``gpushift resume``)."""

    mode: Mode
    backend: str
    until: datetime | None
    set_by: str
    set_at: datetime
    reason: str = ""
    source: OverrideSource = OverrideSource.MANUAL
    when_idle: bool = False  # the switch to ``backend`` waits for the serving backend to be idle

    def ended(self, now: datetime) -> bool:
        """An override whose time is up (a hold never ends by itself)."""
        return self.mode is Mode.OVERRIDE and self.until is not None and now >= self.until

    def describe(self) -> str:
        """``hold llama (until gpushift resume)`` / ``override llama until <iso>``."""
        if self.mode is Mode.HOLD:
            return f"hold {self.backend} (until gpushift resume)"
        return f"override {self.backend} until {self.until.isoformat() if self.until else '?'}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode.value,
            "backend": self.backend,
            "until": self.until.isoformat() if self.until else None,
            "set_by": self.set_by,
            "set_at": self.set_at.isoformat(),
            "reason": self.reason,
            "source": self.source.value,
            "when_idle": self.when_idle,
        }

    @staticmethod
    def from_dict(d: Any, backends: Collection[str] | None = None) -> Override:
        """The override written by :meth:`to_dict`, checked strictly: every key of its type, the
        times aware (a naive one would never compare with the clock), ``backend`` one of
        ``backends`` (when given) or ``off``.

        Raises:
            ValueError: naming the key and what is wrong.
        """
        if not isinstance(d, dict):
            raise ValueError(f"expected a JSON object, got {type(d).__name__}")
        unknown = sorted(set(d) - _KEYS)
        if unknown:
            raise ValueError(f"unknown key {unknown[0]!r}")
        backend = _text(d, "backend", required=True)
        if backends is not None and backend != OFF and backend not in backends:
            raise ValueError(f"backend {backend!r} is no longer configured")
        when_idle = d.get("when_idle", False)
        if not isinstance(when_idle, bool):
            raise ValueError(f"when_idle: expected true or false, got {when_idle!r}")
        mode = Mode(_text(d, "mode", required=True))
        source = OverrideSource(_text(d, "source") or OverrideSource.MANUAL.value)
        if mode not in (Mode.OVERRIDE, Mode.HOLD):
            raise ValueError(f"mode: expected override or hold, got {mode.value!r}")
        return Override(
            mode=mode,
            backend=backend,
            until=_aware(d, "until") if d.get("until") is not None else None,
            set_by=_text(d, "set_by"),
            set_at=_aware(d, "set_at"),
            reason=_text(d, "reason"),
            source=source,
            when_idle=when_idle,
        )


_KEYS = frozenset({"mode", "backend", "until", "set_by", "set_at", "reason", "source", "when_idle"})


def _text(d: dict[str, Any], key: str, required: bool = False) -> str:
    if key not in d and not required:
        return ""
    v = d.get(key)
    if not isinstance(v, str) or (required and not v):
        raise ValueError(f"{key}: expected a string, got {v!r}"[:200])
    return v


def _aware(d: dict[str, Any], key: str) -> datetime:
    v = _text(d, key, required=True)
    try:
        t = datetime.fromisoformat(v)
    except ValueError:
        raise ValueError(f"{key}: not a time: {v!r}"[:200]) from None
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{key}: {v!r} has no UTC offset (a naive time)"[:200])
    return t


class OverrideStore(Protocol):
    def load(self) -> Override | None: ...

    def save(self, override: Override | None) -> None: ...


def manual_override(
    now: datetime,
    schedule: Schedule | None,
    backend: str,
    who: str,
    hold: bool,
    until: datetime | None,
    reason: str,
    when_idle: bool = False,
) -> Override:
    """A person's switch: keep ``backend`` until ``until``, the next boundary, or ``resume``."""
    if hold:
        return Override(Mode.HOLD, backend, None, who, now, reason, when_idle=when_idle)
    end = until
    if end is None and schedule is not None:
        b = schedule.next_boundary(now)
        end = b.at if b else None
    return Override(Mode.OVERRIDE if end else Mode.HOLD, backend, end, who, now, reason, when_idle=when_idle)


def external_override(
    current: Override | None, schedule: Schedule | None, established: str, actual: str, now: datetime
) -> Override:
    """A unit started or stopped with systemctl: kept until the next boundary (a hold stays a
    hold, now of what really runs)."""
    if current is not None and current.mode is Mode.HOLD:
        return replace(current, backend=actual)
    nxt = schedule.next_boundary(now) if schedule else None
    return Override(
        Mode.OVERRIDE if nxt else Mode.HOLD,
        actual,
        nxt.at if nxt else None,
        "systemctl",
        now,
        f"{established} -> {actual} changed outside gpushift",
        OverrideSource.EXTERNAL,
    )


def after_failed_manual(current: Override | None, backend: str, actual: str) -> Override | None:
    """A person's switch to ``backend`` did not happen: the override keeps what really runs (for
    as long as the person asked), so status never names a backend that is not there.  None: the
    override does not change."""
    if current is None or current.backend != backend or current.source is not OverrideSource.MANUAL:
        return None
    return replace(current, backend=actual, reason=f"{current.reason} (switch to {backend} failed)".strip())

"""L3: a person's (or systemctl's) choice that the schedule waits for, and where it is kept.

Pure: the functions here compute the override a person's request or a change behind gpushift's
back leads to; :class:`OverrideStore` is the port that keeps it across restarts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol

from ..model import Mode, OverrideSource
from ..schedule import Schedule


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
    def from_dict(d: dict[str, Any]) -> Override:
        return Override(
            mode=Mode(d["mode"]),
            backend=str(d["backend"]),
            until=datetime.fromisoformat(d["until"]) if d.get("until") else None,
            set_by=str(d.get("set_by", "")),
            set_at=datetime.fromisoformat(d["set_at"]),
            reason=str(d.get("reason", "")),
            source=OverrideSource(d.get("source", OverrideSource.MANUAL.value)),
            when_idle=bool(d.get("when_idle", False)),
        )


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

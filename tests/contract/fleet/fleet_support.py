"""What the fleet's contract tests share: a recording log and a host (a real ledger, its mirror).

Imported by its own name (``fleet_support``) from the ``test_fleet_*`` modules beside it.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from gpushift.config.mirror import MirrorConfig
from gpushift.fleet.mirror import Mirror
from gpushift.ledger import SqliteLedger
from gpushift.values import SwitchRecord

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=timezone.utc)
PASSWORD = "mirror-pw-77e1"


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        def emit(event: str, **fields: Any) -> None:
            self.lines.append((level, event, fields))

        return emit

    def events(self, name: str) -> list[dict[str, Any]]:
        return [f for _lvl, e, f in self.lines if e == name]


class Host:
    """One host: its ledger, its state directory, its mirror."""

    def __init__(self, base: Path, mirror: MirrorConfig, name: str = "gpu-1") -> None:
        self.base = base
        self.state = base / "state"
        self.led = SqliteLedger(self.state / "ledger.db", spool_dir=base / "run", log=Log(), group=None)
        self.log = Log()
        self.config = mirror
        self.name = name
        self.mirror = self.new_mirror()

    def new_mirror(self) -> Mirror:
        return Mirror(self.config, self.name, "ab" * 16, str(self.state / "ledger.db"), str(self.state),
                      lambda: {"serving": "day"}, self.log)  # fmt: skip

    def switch(self, i: int, outcome: str | None = "ok") -> SwitchRecord:
        rec = SwitchRecord(trigger="manual", requested_by="alice", reason=f"switch {i}", from_backend="a",
                           to_backend="b", started_at=T0 + timedelta(minutes=i), ticket=f"t-{i}")  # fmt: skip
        self.led.begin(rec)
        if outcome is not None:
            rec.outcome = outcome
            rec.finished_at = rec.started_at + timedelta(seconds=20)
            self.led.finish(rec)
        return rec

    def cycle(self, times: int = 3) -> None:
        for _ in range(times):
            self.mirror._next_try = 0.0
            self.mirror._cycle()

"""L4: the manual override survives daemon restarts — one small JSON file in the state dir."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from ..keeper import Override


class JsonOverrideStore:
    """``state_dir/override.json``; written atomically (temp file + rename + fsync)."""

    def __init__(self, path: str | os.PathLike[str], log: Any = None) -> None:
        self.path = Path(path)
        self.log = log
        self.error: str | None = None

    def load(self) -> Override | None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            # A damaged file must not keep the daemon from starting: obey the schedule.
            return None
        if not data:
            return None
        try:
            return Override.from_dict(data)
        except (KeyError, ValueError, TypeError):
            return None

    def save(self, override: Override | None) -> None:
        """Persist; a full or read-only disk must not fail the switch: it is logged, and the
        override still holds in memory until the daemon restarts."""
        tmp = self.path.with_suffix(".tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "w") as f:
                json.dump(override.to_dict() if override else {}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
            self.error = None
        except OSError as e:
            self.error = f"cannot save {self.path}: {e.strerror}"
            if self.log is not None:
                self.log.error(
                    "override_not_saved",
                    path=str(self.path),
                    error=e.strerror,
                    detail="it holds until the daemon restarts",
                )
            with contextlib.suppress(OSError):
                tmp.unlink()

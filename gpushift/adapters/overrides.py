"""L4: the manual override survives daemon restarts — one small JSON file in the state dir."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..keeper import Override


class JsonOverrideStore:
    """``state_dir/override.json``; written atomically (temp file + rename + fsync)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump(override.to_dict() if override else {}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

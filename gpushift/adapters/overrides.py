"""L4: the manual override survives daemon restarts — one small JSON file in the state dir.

The file is read strictly (:meth:`Override.from_dict`): anything but what :meth:`save` writes —
garbage, deep nesting, more than :data:`MAX_BYTES`, a naive time, a wrong type, a backend no longer
configured, a FIFO or a directory in its place — is ignored: the daemon logs ``override_ignored``,
follows the schedule, and ``gpushift status`` says why (``ignored``) until the next override is
saved.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

from .. import validate
from ..keeper import Override
from . import safefile

#: Largest override.json read (what save writes is a few hundred bytes).
MAX_BYTES = 64 * 1024


class JsonOverrideStore:
    """``state_dir/override.json``; written atomically (temp file + rename + fsync)."""

    def __init__(
        self, path: str | os.PathLike[str], log: Any = None, backends: Collection[str] | None = None
    ) -> None:
        self.path = Path(path)
        self.log = log
        self.backends = backends
        self.error: str | None = None
        #: Why the file found at load was ignored (None: it was not, or an override was saved since).
        self.ignored: str | None = None

    def load(self) -> Override | None:
        try:
            raw = safefile.read_bounded(str(self.path), MAX_BYTES)
        except FileNotFoundError:
            return None
        except safefile.Skipped as e:
            return self._ignore(str(e))
        except OSError as e:
            return self._ignore(f"cannot read it: {e.strerror or e}")
        try:
            text = raw.decode("utf-8")
            too_deep = validate.nesting_problem(text)
            if too_deep is not None:
                return self._ignore(f"not valid JSON: {too_deep}")
            data = json.loads(text)
        except ValueError as e:  # UnicodeDecodeError included
            return self._ignore(f"not valid JSON: {e}")
        if data == {}:
            return None  # what save(None) writes
        try:
            return Override.from_dict(data, self.backends)
        except (ValueError, OverflowError) as e:
            return self._ignore(str(e))

    def _ignore(self, why: str) -> Override | None:
        """A damaged file must not keep the daemon from starting (nor crash it later): obey the
        schedule, and say so."""
        self.ignored = why[:300]
        if self.log is not None:
            self.log.error(
                "override_ignored", path=str(self.path), error=self.ignored, detail="obeying the schedule"
            )
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
            self.ignored = None  # the ignored file is gone: a person's choice replaced it
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

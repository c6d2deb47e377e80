"""The manual override survives daemon restarts — one small JSON file in the state dir.

The file is read strictly (:meth:`Override.from_dict`): anything but what :meth:`save` writes —
garbage, deep nesting, more than :data:`MAX_BYTES`, a naive time, a wrong type, a backend no longer
configured, a FIFO or a directory in its place — is ignored: the daemon logs ``override_ignored``,
follows the schedule, and ``gpushift status`` says why (``ignored``) until the next override is
saved.  A file that is no regular file of the state directory's own (a FIFO, a device, a directory,
a symlink out of the directory) or is larger than :data:`MAX_BYTES` is never opened as such (the
one careful reader, :mod:`gpushift.host.safefile`) and is moved aside too, renamed
``override.json.bad-<UTC time>`` (:func:`gpushift.config.textfile.set_aside`), so that it cannot
stand in the way of the next save or start; one that is merely wrong (a hand edit) stays, for the
person to mend.

A full or read-only state directory must neither fail the switch nor let an older override come
back at the next start: the override then goes to ``runtime_dir/override.json`` (a tmpfs, which
survives a restart of the daemon but not of the host), which :meth:`JsonOverrideStore.load` prefers
while it exists, and :meth:`JsonOverrideStore.flush` (every reconcile) writes it to the state
directory once it can, removing the fallback.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

from gpushift.config import validate
from gpushift.config.textfile import set_aside
from gpushift.host import safefile
from gpushift.host.files import write_atomic
from gpushift.host.nulllog import NULL_LOG
from gpushift.keeper import Override

#: Largest override.json read (what save writes is a few hundred bytes).
MAX_BYTES = 64 * 1024


class JsonOverrideStore:
    """``state_dir/override.json``; written atomically (temp file + rename + fsync).

    ``fallback``: where an override goes while the state directory cannot be written (None: nowhere;
    it then holds in memory only)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        log: Any = NULL_LOG,
        backends: Collection[str] | None = None,
        fallback: str | os.PathLike[str] | None = None,
    ) -> None:
        self.path = Path(path)
        self.fallback = Path(fallback) if fallback is not None else None
        self.log = log
        self.backends = backends
        #: Why the last save did not reach the state directory (None: it did).
        self.error: str | None = None
        #: Why the file found at load was ignored (None: it was not, or an override was saved since).
        self.ignored: str | None = None
        #: Where that file was moved aside (None: it was left in place, or could not be moved).
        self.moved_to: str | None = None
        self._lock = threading.Lock()
        self._unsaved: tuple[Override | None] | None = None  # what the state directory still lacks

    def load(self) -> Override | None:
        if self.fallback is not None and self.fallback.exists():
            # written because the state directory could not be: newer than what is there
            ov = self._load(self.fallback)
            if self.ignored is None:
                self._unsaved = (ov,)
                return ov
            self.ignored = self.moved_to = None  # a damaged fallback: the state directory's is the one
        return self._load(self.path)

    def _load(self, path: Path) -> Override | None:
        try:
            raw = safefile.read_bounded(str(path), MAX_BYTES, within=str(path.parent))
        except FileNotFoundError:
            return None
        except safefile.Skipped as e:
            self.moved_to = set_aside(str(path))
            return self._ignore(path, str(e))
        except OSError as e:
            return self._ignore(path, f"cannot read it: {e.strerror or e}")
        try:
            text = raw.decode("utf-8")
            too_deep = validate.nesting_problem(text)
            if too_deep is not None:
                return self._ignore(path, f"not valid JSON: {too_deep}")
            data = json.loads(text)
        except ValueError as e:  # UnicodeDecodeError included
            return self._ignore(path, f"not valid JSON: {e}")
        if data == {}:
            return None  # what save(None) writes
        try:
            return Override.from_dict(data, self.backends)
        except (ValueError, OverflowError) as e:
            return self._ignore(path, str(e))

    def _ignore(self, path: Path, why: str) -> Override | None:
        """A damaged file must not keep the daemon from starting (nor crash it later): obey the
        schedule, and say so."""
        self.ignored = why[:300]
        self.log.error(
            "override_ignored",
            path=str(path),
            error=self.ignored,
            moved_to=self.moved_to,
            detail="obeying the schedule",
        )
        return None

    def save(self, override: Override | None) -> None:
        """Persist; a full or read-only disk must not fail the switch: it is logged, the override
        goes to the fallback, and :meth:`flush` writes it once the state directory can be written."""
        with self._lock:
            # the ignored file is replaced: a person's choice (or the keeper's)
            self.ignored = self.moved_to = None
            self._save(override, first=True)

    def flush(self) -> bool:
        """Write an override the state directory still lacks (every reconcile); True when one landed."""
        with self._lock:
            if self._unsaved is None:
                return False
            return self._save(self._unsaved[0], first=False)

    def _save(self, override: Override | None, first: bool) -> bool:
        try:
            _write(self.path, override)
        except OSError as e:
            if first or self.error is None:
                kept = self._keep(override)
                detail = (
                    f"kept in {kept} until the state directory can be written (retried every reconcile)"
                    if kept
                    else "it holds in memory only, until the daemon restarts"
                )
                self.error = f"cannot save {self.path}: {e.strerror}; {detail}"
                self.log.error("override_not_saved", path=str(self.path), error=e.strerror, detail=detail)
            self._unsaved = (override,)
            return False
        was_unsaved = self._unsaved is not None
        self._unsaved, self.error = None, None
        if self.fallback is not None:
            with contextlib.suppress(OSError):
                self.fallback.unlink()
        if was_unsaved and not first:
            self.log.info(
                "override_saved", path=str(self.path), detail="the state directory can be written again"
            )
        return True

    def _keep(self, override: Override | None) -> str | None:
        """The override in the fallback file (what :meth:`load` prefers); its path, or None."""
        if self.fallback is None:
            return None
        try:
            _write(self.fallback, override)
        except OSError as e:
            self.log.error("override_fallback_not_saved", path=str(self.fallback), error=e.strerror)
            return None
        return str(self.fallback)


def _write(path: Path, override: Override | None) -> None:
    """Atomically and durably: a temporary file beside ``path``, fsynced, renamed over it."""
    write_atomic(str(path), json.dumps(override.to_dict() if override else {}).encode())

"""The switch in flight, written down for crash recovery — ``run.json`` in the state dir.

The switcher writes its run before a stop, before a start, after ready and when it rolls back;
it removes the file when the run's ledger row is complete.  A daemon that starts and finds the
file died in the middle of a switch: it converges from what the file says (docs/reliability.md).

Each write is atomic (temporary file, rename: :func:`gpushift.host.files.write_atomic`), so the
file is the old run or the new one, never half of either.  It is not fsynced: what it guards against
is the daemon's own death (a crash, an OOM kill, a restart), after which the kernel's page cache
still holds the write; a host that loses power loses its backends too, and the daemon converges from
the schedule at boot (a damaged file is ignored).  The fsyncs cost about 50 ms of every switch on a
virtual disk (bench/switch_overhead.py).  When the state directory cannot be written (full or
read-only disk), the run goes to the runtime directory (``/run``, another filesystem) instead;
loading reads both and takes the newer.

Loading never hangs and never reads more than :data:`MAX_BYTES`: each file is read with the one
careful reader (:func:`gpushift.host.safefile.read_bounded`): a regular file only (a FIFO there
would block the daemon's start, ``/dev/zero`` would fill its memory), no symlink out of its own
directory, at most :data:`MAX_BYTES`.  Such a file — or one that is not a run this code wrote — is
renamed ``run.json.bad-<UTC time>`` beside it (:func:`gpushift.config.textfile.set_aside`, the
newest few kept), logged (``run_store_set_aside``, with the path, why and where it went) and named
in :attr:`JsonRunStore.ignored`; the daemon then starts as if no switch had been in flight.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from gpushift.config import validate
from gpushift.config.textfile import set_aside
from gpushift.host import safefile
from gpushift.host.files import write_atomic as write_atomic  # notify/webhook.py imports it from here

FILE_NAME = "run.json"
#: Largest run.json read (what :meth:`JsonRunStore.save` writes is a few KiB).
MAX_BYTES = 1024 * 1024


class JsonRunStore:
    """``<state_dir>/run.json``, falling back to ``<runtime_dir>/run.json``.

    ``log``: where ``run_store_set_aside`` goes (None: the daemon's structlog logger, which is
    what the process configured)."""

    def __init__(self, state_dir: str, runtime_dir: str, log: Any = None) -> None:
        self.dirs = [state_dir, runtime_dir]
        self.paths = [os.path.join(d, FILE_NAME) for d in self.dirs]
        self.log = log
        #: Why the last load set a file aside, and where it went (None: it set none aside).
        self.ignored: str | None = None

    def save(self, run: dict[str, Any]) -> None:
        data = json.dumps(run, sort_keys=True).encode()
        errors = []
        for i, path in enumerate(self.paths):
            try:
                write_atomic(path, data, durable=False)
            except OSError as e:
                errors.append(f"{path}: {e.strerror or e}")
                continue
            for other in self.paths[i + 1 :]:  # an older fallback copy must not win a later load
                with contextlib.suppress(OSError):
                    os.unlink(other)
            return
        raise OSError("; ".join(errors))

    def load(self) -> dict[str, Any] | None:
        """The newer of the two files' runs (None: neither holds one); a file that cannot be one
        is set aside (see the module's docstring)."""
        found: list[tuple[float, dict[str, Any]]] = []
        self.ignored = None
        for folder, path in zip(self.dirs, self.paths, strict=True):
            try:
                raw = safefile.read_bounded(path, MAX_BYTES, within=folder)
                mtime = os.stat(path).st_mtime
            except FileNotFoundError:
                continue
            except safefile.Skipped as e:
                self._set_aside(path, str(e))
                continue
            except OSError:
                continue  # unreadable (a permission): left alone, never a crash
            try:
                data = _parse(raw)
            except ValueError as e:  # damaged: cannot happen with atomic writes
                self._set_aside(path, f"not valid JSON: {str(e)[:200]}")
                continue
            if not isinstance(data, dict) or not data.get("ticket"):
                self._set_aside(path, "not a run gpushift wrote (no ticket)")
                continue
            found.append((mtime, data))
        return max(found, key=lambda x: x[0])[1] if found else None

    def _set_aside(self, path: str, why: str) -> None:
        moved = set_aside(path)
        where = f"moved to {moved}" if moved else "it could not be moved aside"
        self.ignored = f"{path}: {why}; {where}"
        log = self.log if self.log is not None else _daemon_log()
        log.error(
            "run_store_set_aside",
            path=path,
            error=why,
            moved_to=moved,
            detail="the unfinished switch it may have named is not recovered; the daemon starts afresh",
        )

    def clear(self) -> None:
        for path in self.paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _parse(raw: bytes) -> Any:
    """The JSON document ``raw``; ValueError when it is not one (not UTF-8 included), or nests too
    deeply to parse safely."""
    text = raw.decode("utf-8")
    too_deep = validate.nesting_problem(text)
    if too_deep is not None:
        raise ValueError(too_deep)
    return json.loads(text)


def _daemon_log() -> Any:
    import structlog

    return structlog.get_logger("gpushift")

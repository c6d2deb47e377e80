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
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from gpushift.host.files import write_atomic as write_atomic  # notify/webhook.py imports it from here

FILE_NAME = "run.json"


class JsonRunStore:
    """``<state_dir>/run.json``, falling back to ``<runtime_dir>/run.json``."""

    def __init__(self, state_dir: str, runtime_dir: str) -> None:
        self.paths = [os.path.join(state_dir, FILE_NAME), os.path.join(runtime_dir, FILE_NAME)]

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
        found: list[tuple[float, dict[str, Any]]] = []
        for path in self.paths:
            try:
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
                mtime = os.stat(path).st_mtime
            except (OSError, ValueError):
                continue  # missing, or damaged (cannot happen with atomic writes, but never crash)
            if isinstance(data, dict) and data.get("ticket"):
                found.append((mtime, data))
        return max(found, key=lambda x: x[0])[1] if found else None

    def clear(self) -> None:
        for path in self.paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

"""The backends' model names as the daemon announces them (D-Bus ``Models``, ``NextServed``).

Each backend's names are its config's ``models`` when set, else what its kind reads from its unit's
``ExecStart=`` and ``Environment=`` (:func:`gpushift.backends.models.resolve`).  systemd is asked
at the daemon's start, on every reload and after every switch (a unit file changed behind a
``daemon-reload`` is seen at the next switch), never on the loop thread's property reads: those
read the last answer.  A unit that cannot be read keeps the names it had.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from gpushift.backends import models
from gpushift.config.schema import Config
from gpushift.errors import GpushiftError
from gpushift.host.nulllog import NULL_LOG
from gpushift.ports import UnitControl


class ModelNames:
    def __init__(self, log: Any = NULL_LOG) -> None:
        self._log = log
        self._names: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()  # one refresh at a time (start, reload, a switch's end)

    def get(self) -> Mapping[str, tuple[str, ...]]:
        """The last names, by backend in config order (a read, no I/O)."""
        return self._names

    def refresh(self, config: Config, units: UnitControl) -> Mapping[str, tuple[str, ...]]:
        """Resolve every backend's names now (asks systemd for the units without ``models``)."""
        with self._lock:
            old = self._names
            out: dict[str, tuple[str, ...]] = {}
            for name, b in config.backends.items():
                if b.models is not None:
                    out[name] = tuple(b.models)
                    continue
                try:
                    st = units.state(b.unit)
                except GpushiftError as e:
                    self._log.warning("model_names_unread", backend=name, unit=b.unit, error=str(e))
                    out[name] = old.get(name, ())
                    continue
                out[name] = models.resolve(b.kind, None, st.exec_start, st.environment)
            self._names = out  # one reference replaced: a reader sees the old or the new mapping
        if out != old:
            self._log.info("model_names", models={k: list(v) for k, v in out.items()})
        return out

"""Pre-warm as a look-ahead consumer — read the next backend's model files before its boundary.

``prewarm_lead_s`` before a switch the keeper will make to a backend (0: off for that backend),
its model files (:mod:`gpushift.prewarm.plan` decides which, within ``MemAvailable`` minus a margin)
are read into the page cache by a separate reader process (:mod:`gpushift.prewarm.reader`:
idle I/O class, ``prewarm_rate_mib_s``).  When that boundary is called off (an override, a hold,
a reload, a clock jump), the reader is ended by PID.  The row of the next switch to that backend
records what was pre-warmed under ``extra.prewarm`` (bytes, seconds, the share already cached,
what was skipped and why), whatever triggered the switch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gpushift.config.schema import Config
from gpushift.keeper import Coming
from gpushift.keeper.lookahead import Consumer
from gpushift.ports import UnitControl
from gpushift.prewarm import plan as prewarm
from gpushift.prewarm.reader import PrewarmJob, mem_available, walk

NAME = "prewarm"


class Prewarming:
    """Args:
    config: the config in force (asked at every use: a reload changes leads and paths).
    units: systemd, for the unit's ``ExecStart=`` and ``Environment=`` (the model options).
    log: structlog logger.
    job: makes a reader job (the real :class:`PrewarmJob`; a fake in unit tests).
    meminfo: ``MemAvailable`` in bytes.
    switching_to: the target of the switch in flight (None when idle): a boundary called off
        because a person switched to that very backend now keeps its pre-warm (the row takes it).
    """

    def __init__(
        self,
        config: Callable[[], Config],
        units: UnitControl,
        log: Any,
        job: Callable[[str, list[str], float], Any] = PrewarmJob,
        meminfo: Callable[[], int] = mem_available,
        switching_to: Callable[[], str | None] = lambda: None,
    ) -> None:
        self._switching_to = switching_to
        self.config = config
        self.units = units
        self.log = log
        self._job = job
        self._meminfo = meminfo
        self._lock = threading.Lock()
        # backend -> (the switch it was started for, the reader job, the plan's skipped files)
        self._jobs: dict[str, tuple[Coming, Any, tuple[prewarm.FileInfo, ...]]] = {}

    def consumer(self) -> Consumer:
        return Consumer(NAME, self.lead_s, self.act, self.abandon)

    def lead_s(self, coming: Coming) -> float | None:
        b = self.config().backends.get(coming.target)
        return b.prewarm_lead_s if b is not None and b.prewarm_lead_s > 0 else None

    def act(self, coming: Coming) -> None:
        """Start the reader for ``coming.target``'s model files (returns at once)."""
        cfg = self.config()
        b = cfg.backends.get(coming.target)
        if b is None:
            return
        st = self.units.state(b.unit)
        env = dict(e.split("=", 1) for e in st.environment if "=" in e)
        paths = prewarm.model_paths(b, st.exec_start, env)
        infos = [info for p in paths for info in walk(p)]
        plan = prewarm.plan(infos, self._meminfo())
        skipped = [{"path": f.path, "why": f.skipped} for f in plan.skipped]
        if not plan.files:
            self.log.info("prewarm_nothing", backend=b.name, paths=paths, skipped=skipped)
            return
        rate = cfg.daemon.prewarm_rate_mib_s * 1024 * 1024
        job = self._job(b.name, [f.path for f in plan.files], rate)
        with self._lock:
            old = self._jobs.pop(b.name, None)
            self._jobs[b.name] = (coming, job, plan.skipped)
        if old is not None:
            old[1].abandon()
        job.start()
        self.log.info(
            "prewarm_started",
            backend=b.name,
            pid=job.pid,
            files=len(plan.files),
            bytes=plan.total_bytes,
            budget_bytes=plan.budget_bytes,
            skipped=skipped,
            boundary=coming.at.isoformat(),
        )

    def abandon(self, coming: Coming) -> None:
        """The boundary it was reading for is called off: end the reader (by PID)."""
        if self._switching_to() == coming.target:
            return  # called off by a switch to that backend now: what was read is its row's
        with self._lock:
            held = self._jobs.get(coming.target)
            if held is None or held[0].key != coming.key:
                return
            del self._jobs[coming.target]
        held[1].abandon()
        self.log.info("prewarm_abandoned", backend=coming.target, boundary=coming.at.isoformat())

    def row_facts(self, target: str) -> dict[str, Any]:
        """For the row of a switch to ``target``: what was pre-warmed for it (once; then forgotten)."""
        with self._lock:
            held = self._jobs.pop(target, None)
        if held is None:
            return {}
        coming, job, skipped = held
        summary = dict(job.summary())
        summary["for_boundary"] = coming.at.isoformat()
        if skipped:
            summary["skipped_files"] = [{"path": f.path, "why": f.skipped} for f in skipped]
        return {"prewarm": summary}

    def stop(self) -> None:
        """The daemon stops: end every reader it started."""
        with self._lock:
            jobs = [j for _c, j, _s in self._jobs.values()]
            self._jobs.clear()
        for j in jobs:
            j.abandon()

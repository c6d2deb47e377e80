"""The steps of one switch — drain, stop, the VRAM gate, start, readiness, the launch record.

Each step asks the ports at that moment (systemd, the GPU provider, the backend's HTTP endpoints)
and either returns or raises :class:`~gpushift.switch.run.StepFailed`.  Every waiting loop checks
the run's cancel request between polls.  The order of the steps, and what happens when one
fails, belong to :mod:`gpushift.switch.machine` and :mod:`gpushift.switch.failure`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpushift.backends import cmdline, models, warmup
from gpushift.config.schema import BackendConfig, Config
from gpushift.errors import CancelRefused
from gpushift.ports import Ports
from gpushift.switch import frontdoor
from gpushift.switch.policy import gate
from gpushift.switch.run import StepFailed, SwitchRun
from gpushift.values import GpuReading, Phase, SwitchRecord, UnitState

#: While memory is held, who holds it is looked up at most this often (the fd scan is the slow part).
HOLDERS_EVERY_S = 1.0

#: Readiness polls at the fast cadence for this long after a start, then backs off.
READY_FAST_S = 2.0

#: Each readiness poll's own deadline: a loading server answers (or refuses) at once.
HEALTH_TIMEOUT_S = 1.0
#: How often the readiness wait asks systemd about the starting unit (an exit is noticed this soon).
UNIT_CHECK_INTERVAL_S = 0.25
#: The deadline of the warm-up's look at ``/v1/models`` (the model names the front door routes by).
MODELS_TIMEOUT_S = 5.0


def ready_interval(config: Config, waited_s: float) -> float:
    """How long to wait before the next readiness poll, ``waited_s`` into the wait.

    The fast cadence for the first :data:`READY_FAST_S` (a small model is ready in a fraction of a
    second), then growing by half again per second waited beyond that, up to ``poll_interval_s`` (a
    vLLM that loads for five minutes is polled twice a second, not a hundred times).
    """
    fast = config.daemon.fast_poll_interval_s
    if waited_s < READY_FAST_S:
        return fast
    return float(min(config.daemon.poll_interval_s, fast * 1.5 ** (waited_s - READY_FAST_S + 1)))


#: How a step reports progress: (run, phase, one line for a person).
Report = Callable[[SwitchRun, Phase, str], None]

#: The ``on_failure`` hook of a row that ends badly (``switch/hooks.py``), run as the row closes.
OnFailure = Callable[[SwitchRun, Config, SwitchRecord], None]


def foreign_failure(phase: Phase, b: BackendConfig, foreign: Mapping[str, Any], st: UnitState) -> StepFailed:
    """The start fails: a process outside ``b``'s unit answered on its port (the message names it;
    the unit's own server cannot bind that port, so it will not serve either)."""
    what = str(foreign.get("message") or "not the backend")
    return StepFailed(
        phase,
        f"{b.name}: {b.unit} did not answer: {what}",
        systemd_result=st.result,
        foreign=foreign,
    )


class RunGuard:
    """The lock around the run in flight, and the changes other threads make to it: a person's
    cancel request (D-Bus thread) meets the worker's phases here."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def request_cancel(self, run: SwitchRun, who: str) -> None:
        """Ask ``run`` to stop at its next check; refused once it rolls back."""
        with self.lock:
            if run.rollback_to is not None:
                raise CancelRefused(
                    f"switch {run.ticket} is rolling back to {run.rollback_to} after it failed: a rollback "
                    "cannot be cancelled (it is the way back to a serving backend)"
                )
            run.cancel_requested_by = who

    def take_cancel(self, run: SwitchRun) -> str | None:
        """The pending cancel request, now honoured (recorded as ``cancelled_by``); None if none."""
        with self.lock:
            who = run.cancel_requested_by
            if who is not None:
                run.cancel_requested_by = None
                run.cancelled_by = who
            return who

    def begin_rollback(self, run: SwitchRun, to: str) -> None:
        """From here on a cancel is refused; a request that came after the failure is moot."""
        with self.lock:
            run.rollback_to = to
            run.cancel_requested_by = None


class Steps:
    """The steps, bound to the ports and to the switcher's progress report and heartbeat."""

    def __init__(self, ports: Ports, guard: RunGuard, report: Report, beat: Callable[[], None]) -> None:
        self.ports = ports
        self.guard = guard
        self.report = report
        self.beat = beat
        self.on_failure: OnFailure | None = None  # set by the Switcher

    # ------------------------------------------------------------------ reads

    def readings(self, indices: Sequence[int] | None) -> list[GpuReading]:
        """Memory and holders of ``indices`` (None: of every GPU visible now)."""
        return self.ports.gpu.read(None if indices is None else list(indices))

    def all_gpus(self) -> tuple[int, ...]:
        """The GPUs visible now (memory only: who holds what is read where it is used)."""
        return tuple(r.index for r in self.ports.gpu.read(None, holders=False))

    def check_cancel(self, run: SwitchRun, phase: Phase) -> None:
        """Honour a cancel request (called between polls and between phases): the request becomes
        the run's ``cancelled_by`` and the step fails."""
        self.beat()
        who = self.guard.take_cancel(run)
        if who is not None:
            raise StepFailed(phase, f"cancelled by {who}", cancelled=True)

    def persist(self, run: SwitchRun) -> None:
        """Write the run down (before a stop, before a start, after ready, at a rollback): a daemon
        that dies here converges from it at its next start.  A store that cannot be written is
        logged by the caller's report and never fails the switch."""
        runs = self.ports.runs
        if runs is None:
            return
        with self.guard.lock:
            data = run.to_dict()
        # What recovery reads is all but the detail line: a write that would change only that line
        # (the explicit writes right after a phase's own) is skipped.  The run keeps what was last
        # written of it (``run.persisted``).
        same = {**data, "detail": None}
        if same == run.persisted:
            return
        try:
            runs.save(data)
            run.persisted = same
        except OSError as e:
            self.report(run, run.phase, f"warning: cannot write the switch down for crash recovery: {e}")

    # ------------------------------------------------------------------ steps

    def drain(self, run: SwitchRun, config: Config, b: BackendConfig) -> dict[str, Any]:
        """Close ``b`` at the front door (when there is one, also with ``--now``), then wait (up to
        drain_timeout_s) until ``b`` has no request running or waiting: the larger of its own count
        and the front door's (``switch/frontdoor.py``)."""
        clock = self.ports.clock
        t0 = clock.monotonic()
        at_close = frontdoor.close(self.ports, run, b)
        if self.ports.frontdoor is not None:
            shown = "not answering" if at_close is None else f"{at_close} request(s) in flight there"
            self.report(run, Phase.DRAIN, f"{b.name}: closed at the front door ({shown})")
        if run.skip_drain:
            self.report(run, Phase.DRAIN, f"{b.name}: drain skipped (--now)")
            return {"backend": b.name, "skipped": True}
        cgroup = self.ports.units.state(b.unit).control_group  # only its own answers count
        count = frontdoor.DrainCount(self.ports, b, at_close, cgroup)
        first = n = count.first
        self.report(run, Phase.DRAIN, f"{b.name}: {'unknown' if n is None else n} request(s) in flight")
        while n is not None and n > 0 and clock.monotonic() - t0 < b.drain_timeout_s:
            self.check_cancel(run, Phase.DRAIN)
            clock.sleep(config.daemon.poll_interval_s)
            n = count.now()
        waited = round(clock.monotonic() - t0, 3)
        timed_out = bool(n) and n is not None and n > 0
        if first:
            self.report(
                run,
                Phase.DRAIN,
                f"{b.name}: drained in {waited:.1f}s"
                if not timed_out
                else f"{b.name}: drain timeout, {n} request(s) still in flight",
            )
        return {
            "backend": b.name,
            "in_flight_at_start": first,
            "in_flight_at_stop": n,
            "waited_s": waited,
            "timed_out": timed_out,
        }

    def stop(self, run: SwitchRun, config: Config, b: BackendConfig) -> None:
        """StopUnit and wait for its job; the unit must be inactive afterwards."""
        self.report(run, Phase.STOP, f"stopping {b.unit}")
        run.touched = True
        units = self.ports.units
        job = units.stop(b.unit, config.daemon.stop_timeout_s)
        st = units.state(b.unit)
        if not job.ok or st.running:
            raise StepFailed(
                Phase.STOP,
                f"could not stop {b.unit}: job {job.result}, unit {st.active_state}/{st.sub_state}",
                systemd_result=st.result,
            )

    def wait_released(
        self, run: SwitchRun, config: Config, watched: Sequence[int], what: str
    ) -> list[GpuReading]:
        """Poll GPU memory at the fast cadence until every watched GPU is released, or fail closed.

        Memory alone is read at each poll (about 10 µs a GPU with NVML); who holds it (the ``/proc``
        fd scan, milliseconds on a busy host) is looked up at the first read, at most once every
        :data:`HOLDERS_EVERY_S` while memory is held, and for the message when the gate gives up.
        """
        clock = self.ports.clock
        gpu = self.ports.gpu
        gpus = ",".join(str(i) for i in watched)
        sim = " (SIMULATED)" if gpu.simulated else ""
        self.report(run, Phase.RELEASE, f"waiting for VRAM on GPU {gpus}{sim} {what}")
        t0 = clock.monotonic()
        named_at: float | None = None
        while True:
            now = clock.monotonic()
            name = named_at is None or now - named_at >= HOLDERS_EVERY_S
            readings = gpu.read(list(watched), holders=name)
            if name:
                named_at = now
            verdict = gate(readings, config.gpu.residual_mib, gpu.simulated, expected=watched)
            if verdict.open:
                used = ", ".join(
                    f"GPU {r.index} {r.used_mib:.0f} MiB" for r in readings if r.used_mib is not None
                )
                self.report(run, Phase.RELEASE, f"VRAM released ({used})")
                return readings
            if clock.monotonic() - t0 >= config.gpu.release_timeout_s:
                if not name:  # the message names who still holds the memory
                    readings = gpu.read(list(watched))
                    verdict = gate(readings, config.gpu.residual_mib, gpu.simulated, expected=watched)
                raise StepFailed(
                    Phase.RELEASE,
                    f"{verdict.message} (waited {config.gpu.release_timeout_s:g}s)",
                    vram=True,
                )
            self.check_cancel(run, Phase.RELEASE)
            clock.sleep(config.daemon.fast_poll_interval_s)

    def start_and_wait(
        self, run: SwitchRun, config: Config, b: BackendConfig, durations: dict[str, float]
    ) -> UnitState:
        """StartUnit (after ResetFailedUnit when needed), then wait until it answers; returns the
        unit as read when it answered (:meth:`wait_ready`)."""
        self.start_job(run, b, durations)
        return self.wait_ready(run, config, b, durations)

    def start_job(self, run: SwitchRun, b: BackendConfig, durations: dict[str, float]) -> None:
        """StartUnit (after ResetFailedUnit when needed) and wait for its job (``durations["start"]``)."""
        clock = self.ports.clock
        units = self.ports.units
        t0 = clock.monotonic()
        self.report(run, Phase.START, f"starting {b.unit}")
        if units.state(b.unit).failed:
            units.reset_failed(b.unit)
        run.touched = True
        job = units.start(b.unit, b.start_timeout_s)
        durations["start"] = round(clock.monotonic() - t0, 3)
        if not job.ok:
            st = units.state(b.unit)
            raise StepFailed(
                Phase.START,
                f"start job of {b.unit} ended with {job.result!r} (Result={st.result})",
                systemd_result=st.result,
            )

    def wait_ready(
        self, run: SwitchRun, config: Config, b: BackendConfig, durations: dict[str, float]
    ) -> UnitState:
        """Poll the health URL until 200, watching the unit: an exit is noticed within
        ``UNIT_CHECK_INTERVAL_S`` (the unit is read that often, and once more when health answers 200,
        so a 200 from anything but a running unit is never taken; systemd's answer costs several
        times a health request, which is polled every ``fast_poll_interval_s``).  Returns the unit
        as read with that 200 (the launch record describes it without asking again).

        Every poll is checked against the unit's ``ControlGroup``: an answer from a process outside
        the unit (another user's server on the backend's port) fails the start at once, naming it
        (:func:`foreign_failure`)."""
        clock = self.ports.clock
        self.report(run, Phase.READY, f"waiting for {b.health_url}")
        t0 = clock.monotonic()
        last = ""
        st = self.ports.units.state(b.unit)  # its cgroup: whose answers count
        checked = clock.monotonic()
        while True:
            h = self.ports.probe.health(b.health_url, HEALTH_TIMEOUT_S, expect_cgroup=st.control_group)
            if h.foreign is not None:
                raise foreign_failure(Phase.READY, b, h.foreign, st)
            if h.ok or clock.monotonic() - checked >= UNIT_CHECK_INTERVAL_S:
                checked = clock.monotonic()
                st = self.ports.units.state(b.unit)
            # A unit with Restart= that crashed sits in activating/auto-restart: an exit too.
            if st.active_state in ("failed", "inactive", "deactivating") or st.sub_state == "auto-restart":
                raise StepFailed(
                    Phase.READY,
                    f"{b.unit} exited while starting: {st.active_state}/{st.sub_state}, Result={st.result}",
                    systemd_result=st.result,
                )
            if h.ok:
                durations["ready"] = round(clock.monotonic() - t0, 3)
                self.report(run, Phase.READY, f"{b.name} is ready ({clock.monotonic() - t0:.1f}s)")
                return st
            detail = f"HTTP {h.status}" if h.status is not None else (h.detail or "no answer")
            if detail != last:
                self.report(run, Phase.READY, f"{b.name}: {detail}")
                last = detail
            if clock.monotonic() - t0 >= b.start_timeout_s:
                raise StepFailed(
                    Phase.READY,
                    f"{b.name} did not answer 200 on {b.health_url} within {b.start_timeout_s:g}s (last: {detail})",
                    systemd_result=st.result,
                )
            self.check_cancel(run, Phase.READY)
            clock.sleep(ready_interval(config, clock.monotonic() - t0))

    def warm_up(
        self, run: SwitchRun, config: Config, b: BackendConfig, rec: SwitchRecord, st: UnitState | None = None
    ) -> bool:
        """Proof of inference: one small request answered (its time to first token recorded), or
        the start failed — a backend can answer its health URL while its first request fails.
        ``st``: the unit as just read (else asked now).  Returns whether a request was sent."""
        units, host = self.ports.units, self.ports.host
        st = st if st is not None else units.state(b.unit)
        env = cmdline.environment(st.environment)
        argv = host.cmdline(st.main_pid) if st.main_pid else []
        req = warmup.request_for(b, argv or cmdline.expand(st.exec_start, env), env)
        if req is None:
            return False
        self.check_cancel(run, Phase.WARMUP)
        path = req.url.split("/", 3)[-1]
        self.report(run, Phase.WARMUP, f"{b.name}: a first request (/{path})")
        t0 = self.ports.clock.monotonic()
        res = self.ports.probe.warmup(req, expect_cgroup=st.control_group)
        rec.durations_s["warmup"] = round(self.ports.clock.monotonic() - t0, 3)
        rec.extra["warmup"] = {"path": "/" + path, **res.to_dict()}  # never the request's headers (a key)
        if res.foreign is not None:
            raise foreign_failure(Phase.WARMUP, b, res.foreign, st)
        if not res.ok:
            raise StepFailed(
                Phase.WARMUP, f"{b.name} answers its health URL but not a request on /{path}: {res.detail}"
            )
        self.report(
            run, Phase.WARMUP, f"{b.name} answered: first token {res.ttft_s:.2f}s, all {res.total_s:.2f}s"
        )
        return True

    def compare_models(self, run: SwitchRun, b: BackendConfig, rec: SwitchRecord, st: UnitState) -> None:
        """After the warm-up: the model names gpushift routes by (the config's ``models``, else its
        kind's reading of ``ExecStart=``) against what the server lists at ``/v1/models``, recorded
        as ``extra.model_names`` (``expected``, ``listed`` or ``error``, ``missing``).  A mismatch is
        reported and recorded, never a failure: the server serves, the names may be stale."""
        names = models.resolve(b.kind, b.models, st.exec_start, st.environment)
        if not names:
            return  # nothing to compare (gpushift check says so)
        env = cmdline.environment(st.environment)
        argv = self.ports.host.cmdline(st.main_pid) if st.main_pid else []
        url, headers = warmup.models_query(b, argv or cmdline.expand(st.exec_start, env), env)
        listed, error = self.ports.probe.models(url, headers, MODELS_TIMEOUT_S, st.control_group)
        entry: dict[str, Any] = {"expected": list(names)}
        if listed is None:
            entry["error"] = error
        else:
            entry["listed"] = listed[:32]
            bad = models.compare(names, listed)
            if bad is not None:
                entry["missing"] = bad["missing"]
                self.report(
                    run, run.phase, f"warning: {b.name} does not list the model name(s) "
                    f"{', '.join(bad['missing'])} at /v1/models (it lists {', '.join(listed[:8]) or 'none'})",
                )  # fmt: skip
        rec.extra["model_names"] = entry

    def record_launch(self, rec: SwitchRecord, b: BackendConfig, st: UnitState) -> None:
        """The launch as it really runs: argv from /proc, the version, the launch description."""
        host = self.ports.host
        argv: list[str] = host.cmdline(st.main_pid) if st.main_pid else []
        rec.argv_running = argv
        v = self.ports.probe.version(b.version_url, b.version_command, expect_cgroup=st.control_group)
        if v.foreign is not None:  # never an ``ok`` row with a version another process chose
            raise foreign_failure(Phase.VERSION, b, v.foreign, st)
        rec.backend_version = v.version
        rec.version_source = v.source
        try:
            rec.extra["launch"] = host.launch_info(st, argv or list(st.exec_start))
        except Exception as e:  # describing the launch must never fail the switch
            rec.extra["launch_error"] = repr(e)

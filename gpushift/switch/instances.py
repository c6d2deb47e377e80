"""A backend of several instances, switched as one (issue 23).

The switch's steps are written for one unit (:mod:`gpushift.switch.steps`); here they run for
every instance of a backend at once, each instance as the one-unit view of the backend
(:func:`gpushift.config.instances.view`), each on a thread of its own, all waited on:

* stop: every instance's stop job in parallel, each waited on; one that fails fails the stop;
* start: every instance's start job in parallel (phase ``start``), then every started instance's
  readiness in parallel (phase ``ready``), then every ready instance's warm-up in parallel (phase
  ``warmup``) — a stage ends when all of its instances are through, so the run's phase moves as
  the transition table says;
* the backend serves when ``min_ready`` instances (default: all) passed readiness and warm-up;
  the others are recorded as failed (with their evidence) and stopped; fewer than ``min_ready``
  fail the step, so the failure policy (a rollback) applies to the backend as a whole.

The row keeps each instance under ``extra.instances`` (a rollback's under
``extra.rollback.instances``): its unit, GPUs, port, outcome (``ready``, ``failed``, ``pending``:
never reached), main PID and argv as run, its own timings (``start``, ``ready``, ``warmup``), its
warm-up's answer, and for a failed one the phase, the error and the evidence.

A backend without instances takes the one-unit steps unchanged (no thread).  A cancel is honoured
by the instance whose wait sees it first; the others finish their wait (each bounded by
``start_timeout_s``) before the step ends as cancelled.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from gpushift.config.instances import joined_gpus, needed, port_of, units_of, view
from gpushift.config.schema import BackendConfig, Config
from gpushift.config.types import InstanceConfig
from gpushift.errors import GpushiftError
from gpushift.ports import UnitControl
from gpushift.switch import records
from gpushift.switch.phases import allowed
from gpushift.switch.run import StepFailed, SwitchRun
from gpushift.switch.steps import Steps
from gpushift.values import Phase, SwitchRecord, UnitState

T = TypeVar("T")

#: The key of a row's ``extra`` (and of its rollback's) that keeps the instances.
KEY = "instances"
READY, FAILED, PENDING = "ready", "failed", "pending"


def parallel(jobs: Sequence[Callable[[], T]], name: str) -> list[T | Exception]:
    """Run every job on a thread of its own and wait for all: each one's result or exception, in
    the order given."""
    out: list[T | Exception] = [RuntimeError("not run")] * len(jobs)

    def work(n: int, job: Callable[[], T]) -> None:
        try:
            out[n] = job()
        except Exception as e:  # handed to the caller, who decides (a bug is raised there)
            out[n] = e

    threads = [
        threading.Thread(target=work, args=(n, job), name=f"{name}-{n}", daemon=True)
        for n, job in enumerate(jobs)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def running(units: UnitControl, config: Config, states: Mapping[str, UnitState]) -> dict[str, bool]:
    """Which backends run, from each one's unit as read (``states``): a backend of several
    instances runs while any of its instances does (the others are asked now)."""
    return {
        name: st.running or any(units.state(u).running for u in units_of(config.backends[name])[1:])
        for name, st in states.items()
    }


def representative(units: UnitControl, b: BackendConfig) -> UnitState:
    """``b``'s unit as systemd reports it now; for a backend of several instances, the first
    instance that runs (else the first one): what runs is the backend while any instance runs."""
    first = units.state(b.unit)
    if first.running:
        return first
    for i in b.instances[1:]:
        st = units.state(i.unit)
        if st.running:
            return st
    return first


def any_running(steps: Steps, b: BackendConfig) -> bool:
    """Whether systemd reports any unit of ``b`` as running right now."""
    return any(steps.ports.units.state(u).running for u in units_of(b))


def stop(steps: Steps, run: SwitchRun, config: Config, b: BackendConfig) -> None:
    """Stop ``b``: every instance in parallel, each stop job waited on."""
    if not b.instances:
        steps.stop(run, config, b)
        return
    jobs = [_bind(steps.stop, run, config, view(b, i)) for i in b.instances]
    _raise_failures(parallel(jobs, f"stop-{run.ticket}"))


def _raise_failures(results: Sequence[object]) -> None:
    """The stops' failures, as one that fails the stop."""
    failures = [r for r in results if isinstance(r, Exception)]
    if not failures:
        return
    _raise_bugs(failures)
    raise StepFailed(
        Phase.STOP,
        "; ".join(_message(f) for f in failures),
        systemd_result=next((f.systemd_result for f in failures if isinstance(f, StepFailed)), None),
    )


def start(
    steps: Steps,
    run: SwitchRun,
    config: Config,
    b: BackendConfig,
    durations: dict[str, float],
    into: dict[str, Any],
    launch: bool = True,
) -> UnitState:
    """Start ``b`` (``launch`` False: it runs already, only prove it answers — and start those of
    its instances that do not run, each after the gate saw its own GPUs free: one that crashed
    while the others served) and wait until it answers; returns the unit of its first ready
    instance as read with its 200.  The instances' entries go into ``into[KEY]``."""
    if not b.instances:
        if not launch:
            return steps.wait_ready(run, config, b, durations)
        return steps.start_and_wait(run, config, b, durations)
    clock = steps.ports.clock
    views = [view(b, i) for i in b.instances]
    entries = [_entry(i) for i in b.instances]
    into[KEY] = entries
    down = range(len(views)) if launch else _relaunch_gate(steps, run, config, b, into)
    if down:
        t0 = clock.monotonic()
        jobs = [_bind(steps.start_job, run, views[n], entries[n]["durations_s"]) for n in down]
        _settle(steps, config, b, entries, parallel(jobs, f"start-{run.ticket}"), down)
        durations["start"] = round(clock.monotonic() - t0, 3)
        _enough(steps, config, b, entries, Phase.START)
    t0 = clock.monotonic()
    ok = [n for n, e in enumerate(entries) if e["outcome"] == PENDING]
    waits = [_bind(steps.wait_ready, run, config, views[n], entries[n]["durations_s"]) for n in ok]
    results = parallel(waits, f"ready-{run.ticket}")
    _settle(steps, config, b, entries, results, ok)
    durations["ready"] = round(clock.monotonic() - t0, 3)
    states = {n: r for n, r in zip(ok, results, strict=True) if isinstance(r, UnitState)}
    for n, st in states.items():
        argv = steps.ports.host.cmdline(st.main_pid) if st.main_pid else []
        entries[n].update(outcome=READY, main_pid=st.main_pid, argv=argv or list(st.exec_start))
    _enough(steps, config, b, entries, Phase.READY)
    return states[min(states)]


def _relaunch_gate(
    steps: Steps, run: SwitchRun, config: Config, b: BackendConfig, into: dict[str, Any]
) -> list[int]:
    """The instances of a running ``b`` that do not run (by index), with those of
    ``run.restart_instances`` (hung: running, health failing) once stopped (in parallel, each
    waited on; not drained: they answer nothing), once the gate saw their GPUs free (every GPU when
    one of them names none); recorded as ``into["relaunched"]`` (and ``into["restarted"]``)."""
    hung = [n for n, i in enumerate(b.instances) if i.unit in run.restart_instances]
    if hung:
        into["restarted"] = [b.instances[n].unit for n in hung]
        if not allowed(run.phase, Phase.STOP):  # from the intent row: the drain, with nothing to drain
            steps.report(run, Phase.DRAIN, f"not draining {', '.join(into['restarted'])}: not answering")
        jobs = [_bind(steps.stop, run, config, view(b, b.instances[n])) for n in hung]
        _raise_failures(parallel(jobs, f"stop-{run.ticket}"))
    down = [n for n, i in enumerate(b.instances) if not steps.ports.units.state(i.unit).running]
    if not down:
        return down
    units = [b.instances[n].unit for n in down]
    into["relaunched"] = units
    gpus = joined_gpus(tuple(b.instances[n] for n in down))
    steps.wait_released(
        run, config, gpus if gpus is not None else steps.all_gpus(), f"for {', '.join(units)}"
    )
    return down


def warm_up(
    steps: Steps, run: SwitchRun, config: Config, b: BackendConfig, rec: SwitchRecord, st: UnitState | None
) -> tuple[BackendConfig, bool]:
    """Warm every ready instance of ``b`` up (in parallel), then apply ``min_ready``.  Returns the
    one-unit view of the first instance that serves (what the rest of the switch describes: its
    version, its launch) and whether a request was sent."""
    if not b.instances:
        return b, steps.warm_up(run, config, b, rec, st)
    entries: list[dict[str, Any]] = rec.extra.get(KEY) or [_entry(i) for i in b.instances]
    views = [view(b, i) for i in b.instances]
    ready = [n for n, e in enumerate(entries) if e["outcome"] == READY]
    scratch = [replace(rec, durations_s={}, extra={}) for _ in ready]
    jobs = [_bind(steps.warm_up, run, config, views[n], r) for n, r in zip(ready, scratch, strict=True)]
    results = parallel(jobs, f"warmup-{run.ticket}")
    for n, r in zip(ready, scratch, strict=True):
        if "warmup" in r.extra:
            entries[n]["warmup"] = r.extra["warmup"]
            entries[n]["durations_s"]["warmup"] = r.durations_s.get("warmup")
    _settle(steps, config, b, entries, results, ready)
    _enough(steps, config, b, entries, Phase.WARMUP)
    first = next(n for n, e in enumerate(entries) if e["outcome"] == READY)
    if "warmup" in entries[first]:
        rec.extra["warmup"] = entries[first]["warmup"]
        rec.durations_s["warmup"] = max(float(r.durations_s.get("warmup", 0.0)) for r in scratch)
    return views[first], any(r is True for r in results)


# ---------------------------------------------------------------------- the instances' entries


def _entry(i: InstanceConfig) -> dict[str, Any]:
    return {
        "unit": i.unit,
        "gpus": list(i.gpus) if i.gpus is not None else "all",
        "port": port_of(i.health_url),
        "outcome": PENDING,
        "durations_s": {},
    }


def _bind(fn: Callable[..., T], *args: Any) -> Callable[[], T]:
    return lambda: fn(*args)


def _message(e: Exception) -> str:
    return e.message if isinstance(e, StepFailed) else str(e)


def _raise_bugs(results: Sequence[object]) -> None:
    """A bug in an instance's thread is raised as it is (the switch ends as an internal error)."""
    for r in results:
        if isinstance(r, Exception) and not isinstance(r, (StepFailed, GpushiftError)):
            raise r


def _settle(
    steps: Steps,
    config: Config,
    b: BackendConfig,
    entries: list[dict[str, Any]],
    results: Sequence[object],
    indices: Sequence[int],
) -> None:
    """Mark the instances whose stage failed (their phase, error and evidence); a cancel or a bug
    in any of them ends the step at once."""
    _raise_bugs(results)
    cancelled: StepFailed | None = None
    for n, r in zip(indices, results, strict=True):
        if not isinstance(r, Exception):
            continue
        e = entries[n]
        e["outcome"] = FAILED
        e["phase"] = r.phase.value if isinstance(r, StepFailed) else None
        e["error"] = _message(r)
        if isinstance(r, StepFailed):
            e["systemd_result"] = r.systemd_result
            if r.foreign is not None:
                e["foreign_answer"] = dict(r.foreign)
            if r.cancelled:
                cancelled = r
        e["evidence"] = records.evidence(steps.ports, e["unit"], config.daemon.evidence_lines)
    if cancelled is not None:
        raise cancelled


def _enough(
    steps: Steps, config: Config, b: BackendConfig, entries: list[dict[str, Any]], phase: Phase
) -> None:
    """Fail the step when fewer than ``min_ready`` instances can still serve; else stop the failed
    instances that still run (the others serve without them)."""
    alive = [e for e in entries if e["outcome"] != FAILED]
    failed = [e for e in entries if e["outcome"] == FAILED]
    if len(alive) < needed(b):
        raise StepFailed(
            phase,
            f"{b.name}: {len(alive)} of {len(entries)} instances ready, {needed(b)} needed (min_ready); "
            + "; ".join(f"{e['unit']}: {e['error']}" for e in failed),
            systemd_result=next((e.get("systemd_result") for e in failed), None),
        )
    units = steps.ports.units
    for e in failed:
        if "stopped" in e:
            continue
        try:
            if units.state(e["unit"]).running:
                job = units.stop(e["unit"], config.daemon.stop_timeout_s)
                e["stopped"] = job.result
        except GpushiftError as err:  # the others serve: a failed instance's stop is recorded only
            e["stop_error"] = str(err)

"""Watching the serving backend between switches — what happened to it, as plain values.

The keeper looks at the serving backend's unit at every decision and tells apart:

* a person's ``systemctl stop`` — a stop job gpushift did not start (the keeper's external rule);
* an exit by itself, whatever the exit status (vLLM can exit 0 when its engine dies, vllm#48966,
  so ``Result=success`` does not mean a person stopped it): outcome ``crashed``;
* a crash that systemd's ``Restart=`` already undid (``NRestarts`` went up): ``crashed`` too, the
  unit serves again on its own;
* a relaunch behind gpushift's back (``systemctl restart``: the main process changed, no restart
  of systemd's own): a ledger row with trigger ``external``;
* a wedged backend: its unit active, its health URL failing for ``unhealthy_after_s``: outcome
  ``unhealthy``.

:func:`observe` is pure: the unit as systemd reports it now, what the keeper saw last time, whether
a job gpushift did not start ran on the unit, and how long the health has been failing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from gpushift.values import Outcome, UnitState


@dataclass(frozen=True)
class Seen:
    """The serving backend's unit as the keeper last saw it."""

    backend: str
    main_pid: int
    main_start_us: int
    n_restarts: int

    @staticmethod
    def of(backend: str, st: UnitState) -> Seen:
        return Seen(backend, st.main_pid, st.main_start_us, st.n_restarts)


@dataclass(frozen=True)
class Incident:
    """Something happened to the serving backend that nobody asked for."""

    outcome: Outcome  # CRASHED or UNHEALTHY
    backend: str
    detail: str  # one line for a person
    unit_result: str = ""
    exit: str = ""  # "exit status 0" / "killed by signal 9" ...
    serving_again: bool = False  # systemd's Restart= already brought it back (or its other instances serve)
    unit: str = ""  # a backend of several instances: the instance's unit this happened to
    restart: bool = False  # relaunch through the whole gate, stopping what still runs of it first
    converge: bool = False  # it serves on its other instances: start the ones that are down (issue 23)
    hung: tuple[str, ...] = ()  # ... and restart these, running but not answering (converge only)


@dataclass(frozen=True)
class Observation:
    incident: Incident | None = None
    relaunched: str | None = None  # detail of a relaunch behind gpushift's back
    seen: Seen | None = None


def observe(
    backend: str,
    st: UnitState,
    seen: Seen | None,
    foreign_job: bool | None,
    unhealthy_for_s: float | None,
    unhealthy_after_s: float,
) -> Observation:
    """What happened to ``backend`` (the one gpushift established) since ``seen``.

    ``foreign_job``: a job gpushift did not start ran on the unit (None: cannot be told — then
    only a *failed* unit counts as an exit by itself, and an inactive one as a person's stop).
    """
    if st.exited:
        by_itself = (st.failed or st.sub_state == "auto-restart") if foreign_job is None else not foreign_job
        if not by_itself:
            return Observation()  # a person's systemctl stop: the external rule's business
        return Observation(
            Incident(
                Outcome.CRASHED,
                backend,
                f"{st.name} exited by itself ({st.exit_description()})",
                st.result,
                st.exit_description(),
            )
        )
    now = Seen.of(backend, st)
    if seen is None or seen.backend != backend:
        return Observation(seen=now)  # the first look after a switch: nothing to compare yet
    if st.n_restarts > seen.n_restarts:
        detail = f"{st.name} crashed and systemd restarted it (Restart=, {st.n_restarts} restart(s) in all)"
        return Observation(
            Incident(Outcome.CRASHED, backend, detail, st.result, st.exit_description(), serving_again=True),
            seen=now,
        )
    if (st.main_pid, st.main_start_us) != (seen.main_pid, seen.main_start_us) and st.main_pid:
        detail = f"{st.name} was relaunched outside gpushift (main pid {seen.main_pid} -> {st.main_pid})"
        return Observation(relaunched=detail, seen=now)
    if unhealthy_for_s is not None and unhealthy_for_s >= unhealthy_after_s:
        detail = (
            f"{backend} has not answered its health URL for {unhealthy_for_s:.0f}s while its unit is active"
        )
        return Observation(Incident(Outcome.UNHEALTHY, backend, detail, st.result), seen=now)
    return Observation(seen=now)


def observe_instances(
    backend: str,
    states: Mapping[str, UnitState],
    seen: Mapping[str, Seen],
    foreign_job: Callable[[str], bool | None] | None,
    needed: int,
    unhealthy_after_s: float,
    unhealthy: Mapping[str, float] | None = None,
) -> tuple[Incident | None, dict[str, Seen]]:
    """What happened to the instances of ``backend`` (a backend of several, issue 23) since
    ``seen`` (by unit; ``foreign_job``: whether a job gpushift did not start ran on a unit, see
    :func:`observe`; ``unhealthy``: for how long each instance's health has failed while its unit
    is active): the first instance that exited by itself or hung (its health failing for
    ``unhealthy_after_s``; its unit in the incident), and what to remember of each running one.

    An instance not seen running since the switch (it failed there, and that row says so) is not
    a crash.  The backend serves while ``needed`` (``min_ready``) instances run and are not hung:
    then the instances that are down are started again and the hung ones restarted (``hung``),
    each after the gate saw its GPUs free, the others untouched (``converge``); with fewer, the
    backend is relaunched through the whole gate (``restart``: what still runs of it is stopped
    first), or, with none left running, started again as after any crash.
    """
    now: dict[str, Seen] = {}
    incidents: list[Incident] = []
    hung: list[str] = []
    for unit, st in states.items():
        prev = seen.get(unit)
        prev = prev if prev is not None and prev.backend == backend else None  # seen before a switch
        if prev is None and st.exited:
            continue
        failing = (unhealthy or {}).get(unit)
        jobs = foreign_job(unit) if foreign_job else None
        o = observe(backend, st, prev, jobs, failing, unhealthy_after_s)
        if o.seen is not None:
            now[unit] = o.seen
        if o.incident is not None:
            inc = replace(o.incident, unit=unit)
            if inc.outcome is Outcome.UNHEALTHY:
                hung.append(unit)
                why = (
                    f"{unit} has not answered its health URL for {failing or 0:.0f}s while its unit is active"
                )
                inc = replace(inc, detail=why)
            incidents.append(inc)
    if not incidents:
        return None, now
    running = sum(1 for st in states.values() if st.running and not st.exited)
    serving = running - len(hung)
    first = incidents[0]
    how = "run" if not hung else "run and answer"
    detail = f"{first.detail}; {serving} of {len(states)} instances of {backend} {how} ({needed} needed)"
    enough = serving >= needed
    restart = not enough and running > 0
    again = tuple(hung) if enough else ()
    return replace(first, detail=detail, restart=restart, converge=enough, hung=again), now

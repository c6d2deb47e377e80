"""What the sampler saw — one immutable picture of the host, and how old each part of it is.

The sampler (:mod:`gpushift.sampler.sampler`) reads, every ``[daemon] sample_interval_s``: each
backend unit's state, the health of every running backend, every GPU's memory and the running
backend's in-flight requests.  Each reading is a :class:`Figure` stamped with the monotonic time it
was taken; the sampler replaces the whole :class:`Sample` at once, so a reader never sees half of
one cycle.  Readers (``gpushift status``, metrics, the keeper) do no I/O of their own.

A figure older than :data:`STALE_PERIODS` sampling periods is *stale*: it is reported as unknown,
with its age, never as its old value.  :func:`verdict` says which backend serves (a running unit
that is ``active`` AND whose health answered OK within that window) and :func:`to_status` turns a
sample into the ``active``/``backends``/``gpus`` parts of the status JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Generic, TypeVar

from gpushift.values import OFF, GpuReading, Health, UnitState

#: A figure older than this many sampling periods is unknown.
STALE_PERIODS = 2.0

T = TypeVar("T")


@dataclass(frozen=True)
class Figure(Generic[T]):
    """One reading: its value (None when it could not be read), when, and why it failed.

    ``at`` is the monotonic time the reading was taken; ``error`` is set when the read failed
    (``value`` is then None).  A value of None without an error means the source cannot tell
    (a backend without in-flight gauges).
    """

    value: T | None
    at: float
    error: str | None = None

    def age(self, now: float) -> float:
        return max(0.0, now - self.at)

    def stale(self, now: float, period_s: float) -> bool:
        return self.age(now) > STALE_PERIODS * period_s

    def known(self, now: float, period_s: float) -> T | None:
        """The value, when it was read without error and is not stale; else None."""
        return None if self.error is not None or self.stale(now, period_s) else self.value


@dataclass(frozen=True)
class BackendSample:
    """One configured backend as sampled.

    ``health`` and ``in_flight`` are None while its unit does not run (they are not polled);
    ``unhealthy_since`` is the monotonic time since which health has failed continuously while the
    unit was ``active`` (None: healthy, not active, or not known to fail).
    """

    name: str
    unit: str
    kind: str
    gpus: tuple[int, ...] | None
    state: Figure[UnitState] | None = None  # None: not read yet
    health: Figure[Health] | None = None
    in_flight: Figure[int] | None = None
    unhealthy_since: float | None = None
    idle_since: float | None = None  # since when no request has been in flight (known 0), else None
    # A backend of several instances (issue 23): each instance's unit as read, by unit name.
    instances: tuple[tuple[str, Figure[UnitState] | None], ...] = ()
    instance_health: tuple[tuple[str, Figure[Health]], ...] = ()  # each running instance's health
    # ... and since when each instance's health has failed while its unit is active (sampler/failing.py)
    instance_unhealthy: tuple[tuple[str, float], ...] = ()
    needed: int = 1  # how many instances must answer for it to serve (min_ready)


@dataclass(frozen=True)
class Sample:
    """Everything one sampler cycle knows; ``seq`` 0 means nothing was sampled yet."""

    period_s: float
    residual_mib: float
    simulated: bool
    backends: tuple[BackendSample, ...] = ()
    gpus: Figure[tuple[GpuReading, ...]] | None = None
    seq: int = 0
    taken_at: float | None = None
    # When the GPUs' holders were read: the sampler names them again when memory moves, else now
    # and then (the /proc scan is most of a GPU read), so they may be older than the memory figure.
    holders_at: float | None = None
    # The front door's Status() (with a [frontdoor] table; None: there is none, or not asked yet).
    frontdoor: Figure[dict[str, Any]] | None = None

    def backend(self, name: str) -> BackendSample | None:
        for b in self.backends:
            if b.name == name:
                return b
        return None


@dataclass(frozen=True)
class Verdict:
    """Which backend serves: a name, :data:`~gpushift.values.OFF`, or None (unknown, see ``reason``)."""

    active: str | None
    running: tuple[str, ...]
    reason: str | None = None
    warning: str | None = None


def _s(seconds: float) -> str:
    return f"{seconds:.1f} s"


def _unit_problem(b: BackendSample, now: float, period_s: float) -> str | None:
    """Why ``b``'s unit state is unknown; None when it is known."""
    f = b.state
    if f is None:
        return "unit state not read yet"
    if f.error is not None:
        return f.error
    if f.stale(now, period_s):
        return f"unit state unknown: last read {_s(f.age(now))} ago"
    return None


def verdict(sample: Sample, now: float) -> Verdict:
    """Who serves, from the sample alone.

    A backend serves only when its unit is the one running, is ``active``, and its health answered
    OK within the last :data:`STALE_PERIODS` periods; a backend of several instances, when at
    least ``min_ready`` of its instances' health answered OK so (issue 23: one hung instance does
    not stop it serving, nor does its first instance answering make it serve).  ``off`` needs
    every unit known not running.
    """
    p = sample.period_s
    if sample.seq == 0:
        return Verdict(None, (), "nothing sampled yet")
    unknown: list[str] = []
    running: list[str] = []
    for b in sample.backends:
        problem = _unit_problem(b, now, p)
        if problem is not None:
            unknown.append(f"{b.name}: {problem}")
        elif b.state is not None and b.state.value is not None and b.state.value.running:
            running.append(b.name)
    if len(running) > 1:
        text = f"more than one backend is running: {', '.join(running)}"
        return Verdict(None, tuple(running), text, warning=text)
    if unknown:
        return Verdict(None, tuple(running), "systemd could not be asked about " + "; ".join(unknown))
    if not running:
        return Verdict(OFF, ())
    name = running[0]
    serving = sample.backend(name)
    assert serving is not None and serving.state is not None and serving.state.value is not None
    st = serving.state.value
    if st.active_state != "active":
        return Verdict(None, (name,), f"{name} is {st.active_state} ({st.sub_state}), not serving")
    if serving.instances:
        ok = sum(1 for _u, f in serving.instance_health if _instance_health(f, now, p) == "ok")
        if ok >= serving.needed:
            return Verdict(name, (name,))
        n, need = len(serving.instances), serving.needed
        return Verdict(None, (name,), f"{name}: {ok} of {n} instances answer their health ({need} needed)")
    h = serving.health
    if h is None:
        return Verdict(None, (name,), f"{name}: health not polled yet")
    if h.stale(now, p):
        return Verdict(None, (name,), f"{name}: health unknown: last answer {_s(h.age(now))} ago")
    if h.error is not None or h.value is None or not h.value.ok:
        what = h.error or (h.value.detail if h.value is not None else "") or "not OK"
        status = f"HTTP {h.value.status}: " if h.value is not None and h.value.status else ""
        failing = serving.unhealthy_since
        since = f" for {_s(now - failing)}" if failing is not None and now > failing else ""
        return Verdict(None, (name,), f"{name}: health failing{since} ({status}{what[:120]})")
    return Verdict(name, (name,))


def frontdoor_count(
    doc: Figure[dict[str, Any]] | None, backend: str, now: float, period_s: float
) -> int | None:
    """The front door's count of requests in flight on ``backend`` (its Status() ``in_flight``),
    when it answered within the stale window; None otherwise."""
    d = doc.known(now, period_s) if doc is not None else None
    counts = d.get("in_flight") if isinstance(d, dict) else None
    n = counts.get(backend) if isinstance(counts, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def larger_in_flight(
    own: Figure[int] | None, doc: Figure[dict[str, Any]] | None, backend: str, now: float, period_s: float
) -> Figure[int] | None:
    """A running backend's requests in flight: the larger of its own metrics' count and the front
    door's (what status shows, and what the busy-aware boundaries and the idle moment read).  A
    count that cannot be told does not count; the figure's time is the larger count's."""
    theirs = frontdoor_count(doc, backend, now, period_s)
    if theirs is None:
        return own
    assert doc is not None
    mine = own.known(now, period_s) if own is not None else None
    if own is not None and mine is not None and mine >= theirs:
        return own
    return Figure(theirs, doc.at)


def frontdoor_entry(
    sample: Sample, now: float, listen: tuple[str, ...] = (), error: str | None = None
) -> dict[str, Any]:
    """``status --json``'s ``frontdoor``: what its Status() said (``listen``, ``held``,
    ``in_flight`` per backend, ``closed``, ``daemon``: connected or lost, ``requests``) with
    ``answered`` and ``age_s``; not answering: ``answered`` false, ``error``, the configured
    ``listen``."""
    f = sample.frontdoor
    doc = f.known(now, sample.period_s) if f is not None else None
    if not isinstance(doc, dict):
        why = (f.error if f is not None else None) or error
        if f is not None and f.error is None and f.stale(now, sample.period_s):
            why = f"no answer for {_s(f.age(now))}"
        return {
            "answered": False,
            "error": why or "not asked yet",
            "listen": list(listen),
            "age_s": _age(f, now) if f is not None else None,
        }
    counts = doc.get("in_flight")
    out = {
        "answered": True,
        "listen": [str(x) for x in doc.get("listen") or []],
        "held": doc.get("held"),
        "in_flight": dict(counts) if isinstance(counts, dict) else {},
        "closed": [str(x) for x in doc.get("closed") or []],
        "daemon": doc.get("daemon"),
        "requests": doc.get("requests"),
        "age_s": _age(f, now) if f is not None else None,
    }
    if isinstance(doc.get("instances"), dict):  # a backend of several: each instance as it sees it
        out["instances"] = _frontdoor_instances(doc["instances"])
    return out


def _frontdoor_instances(doc: dict[Any, Any]) -> dict[str, list[dict[str, Any]]]:
    """Status()'s ``instances`` (another process's answer): per backend, each instance's name, up
    (a bool, or None) and requests in flight (a count, or None); what is not of that shape is left out."""
    out: dict[str, list[dict[str, Any]]] = {}
    for backend, entries in doc.items():
        if not isinstance(backend, str) or not isinstance(entries, list):
            continue
        out[backend] = [
            {
                "instance": e["instance"],
                "up": e.get("up") if isinstance(e.get("up"), bool) else None,
                "in_flight": n
                if isinstance(n := e.get("in_flight"), int) and not isinstance(n, bool) and n >= 0
                else None,
            }
            for e in entries
            if isinstance(e, dict) and isinstance(e.get("instance"), str)
        ]
    return out


# --------------------------------------------------------------------------- the status JSON


def _age(f: Figure[Any], now: float) -> float:
    return round(f.age(now), 1)


def _health_entry(b: BackendSample, now: float, period_s: float) -> dict[str, Any] | None:
    h = b.health
    if h is None:
        return None
    out: dict[str, Any]
    if h.stale(now, period_s):
        out = {"ok": None, "status": None, "state": "unknown", "detail": f"no answer for {_s(h.age(now))}"}
    elif h.error is not None or h.value is None:
        out = {"ok": False, "status": None, "state": "failing", "detail": (h.error or "")[:120]}
    else:
        v = h.value
        out = {"ok": v.ok, "status": v.status, "state": "ok" if v.ok else "failing", "detail": v.detail[:120]}
        if v.foreign is not None:
            out["foreign"] = dict(v.foreign)  # who answered on the port instead of the backend
    out["age_s"] = _age(h, now)
    out["failing_for_s"] = round(now - b.unhealthy_since, 1) if b.unhealthy_since is not None else None
    return out


def _in_flight_entry(b: BackendSample, now: float, period_s: float) -> dict[str, Any] | None:
    f = b.in_flight
    if f is None:
        return None
    return {"requests": f.known(now, period_s), "age_s": _age(f, now), "error": f.error}


def _instance_health(h: Figure[Health] | None, now: float, period_s: float) -> str | None:
    """An instance's health in a word: ``ok``, ``failing``, ``unknown`` (stale), None (not polled)."""
    if h is None:
        return None
    if h.stale(now, period_s):
        return "unknown"
    return "ok" if h.value is not None and h.error is None and h.value.ok else "failing"


def _instance_entry(unit: str, f: Figure[UnitState] | None, now: float, period_s: float) -> dict[str, Any]:
    """One instance of a backend of several: its unit's state (``unknown`` while it is)."""
    st = f.known(now, period_s) if f is not None else None
    if st is None:
        return {
            "unit": unit,
            "active_state": "unknown",
            "error": f.error if f is not None else "not read yet",
        }
    return {"unit": unit, "active_state": st.active_state, "sub_state": st.sub_state,
            "result": st.result, "main_pid": st.main_pid or None}  # fmt: skip


def _backend_entry(b: BackendSample, now: float, period_s: float) -> dict[str, Any]:
    entry: dict[str, Any] = {"unit": b.unit, "kind": b.kind, "gpus": list(b.gpus) if b.gpus else "all"}
    problem = _unit_problem(b, now, period_s)
    if problem is not None:
        entry["error"] = problem
        entry["active_state"] = "unknown"
    else:
        assert b.state is not None and b.state.value is not None
        st = b.state.value
        entry.update(
            load_state=st.load_state,
            active_state=st.active_state,
            sub_state=st.sub_state,
            result=st.result,
            main_pid=st.main_pid or None,
            main_started_at=(
                datetime.fromtimestamp(st.main_start_us / 1e6, timezone.utc).isoformat(timespec="seconds")
                if st.main_start_us and st.main_pid
                else None
            ),
        )
    entry["age_s"] = _age(b.state, now) if b.state is not None else None
    if b.instances:
        health = dict(b.instance_health)
        entry["instances"] = [
            {**_instance_entry(u, f, now, period_s), "health": _instance_health(health.get(u), now, period_s)}
            for u, f in b.instances
        ]
    entry["health"] = _health_entry(b, now, period_s)
    entry["in_flight"] = _in_flight_entry(b, now, period_s)
    return entry


def _gpu_entries(sample: Sample, now: float) -> list[dict[str, Any]]:
    f = sample.gpus
    if f is None:
        return [{"error": "GPUs not read yet", "state": "unknown", "age_s": None}]
    age = _age(f, now)
    if f.error is not None or f.value is None:
        return [{"error": f"cannot read GPUs: {f.error}", "state": "unknown", "age_s": age}]
    stale = f.stale(now, sample.period_s)
    out = []
    for r in f.value:
        d = r.to_dict()
        d["state"] = r.state(sample.residual_mib).value
        if stale:  # what it held then is not what it holds now: the figures go, the facts stay
            d.update(used_mib=None, holders=[], unreadable_pids=[], holders_complete=False, state="unknown")
            d["error"] = f"not read for {_s(f.age(now))}"
        d["holders_age_s"] = (
            round(max(0.0, now - sample.holders_at), 1)
            if sample.holders_at is not None and not stale
            else None
        )
        d["simulated"] = sample.simulated
        if sample.simulated and "SIMULATED" not in d["name"]:
            d["name"] = f"SIMULATED {d['name']}"
        d["age_s"] = age
        out.append(d)
    return out


def to_status(sample: Sample, now: float) -> dict[str, Any]:
    """The parts of ``gpushift status --json`` a sample answers, as of monotonic time ``now``.

    Keys: ``active`` (a backend, ``off``, or None), ``active_reason`` (why None), ``running``,
    ``backends`` (per backend: unit state, ``health`` and ``in_flight`` with their ``age_s``),
    ``gpus`` (each reading with its ``age_s``, and ``holders_age_s``: how old the names of its holders are), ``simulated``, ``sample`` (period, age, cycle), and
    ``warning`` when more than one backend runs.
    """
    v = verdict(sample, now)
    out: dict[str, Any] = {
        "active": v.active,
        "active_reason": v.reason,
        "running": list(v.running),
        "backends": {b.name: _backend_entry(b, now, sample.period_s) for b in sample.backends},
        "gpus": _gpu_entries(sample, now),
        "simulated": sample.simulated,
        "sample": {
            "period_s": sample.period_s,
            "seq": sample.seq,
            "age_s": round(max(0.0, now - sample.taken_at), 1) if sample.taken_at is not None else None,
        },
    }
    if v.warning:
        out["warning"] = v.warning
    return out

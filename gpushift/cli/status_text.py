"""The text of ``gpushift status`` for a person, part by part: the daemon, what serves and what the
schedule wants, the backends, the GPUs, the last switch, the ledger and the notices.

Every value from outside is escaped (gpushift.safetext.terminal) once, in :func:`render_status`,
before any part lays it out; ``paint`` colours outcome and state words (gpushift.cli.output).

What a person reads is words, never Python: a value the report lacks reads ``?`` (not ``None``),
times read as the ``gpushift ledger`` table writes them (local, to the minute: :func:`local_time`;
``--json`` keeps ISO 8601), and when systemd cannot be reached at all its error is said once.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Any

from gpushift.cli.output import Paint
from gpushift.safetext import terminal

#: An ISO 8601 time with its UTC offset, as the daemon writes them into its sentences.
_ISO = re.compile(r"\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:\d{2})")
#: ``LedgerError('message')``: an exception's repr, where a report carries one.
_REPR = re.compile(r"^[A-Z]\w*\((?P<q>['\"])(?P<message>.*)(?P=q)\)$", re.DOTALL)
#: What the CLI's own view (wiring.UnreachableUnits) says for each unit when the bus is unreachable.
_NO_SYSTEMD = "systemd not reachable"


def local_time(value: Any) -> str:
    """An ISO 8601 time of the report as the ``gpushift ledger`` table shows it: local, to the
    minute (``2026-12-01 18:17``, as gpushift.ledger.text.local_time writes it; a time without an
    offset is UTC).  Text that is not a time is returned as it is; none at all reads ``?``."""
    if value is None or value == "":
        return "?"
    text = str(value)
    try:
        t = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return text
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return t.astimezone().strftime("%Y-%m-%d %H:%M")


def local_times(text: Any) -> str:
    """A sentence of the daemon's with each ISO 8601 time in it written as :func:`local_time`."""
    return _ISO.sub(lambda m: local_time(m.group()), known(text))


def known(value: Any, unknown: str = "?") -> str:
    """``value`` as text; ``unknown`` where the report has none (never ``None``)."""
    return unknown if value is None or value == "" else str(value)


def plain_error(text: Any) -> str:
    """An error message without the exception's repr around it (``LedgerError('x')`` → ``x``)."""
    m = _REPR.match(known(text, ""))
    return m.group("message") if m else known(text, "")


def _no_systemd(backends: dict[str, Any]) -> str | None:
    """The one error every backend shares when systemd could not be asked at all (no bus)."""
    errors = {str(b.get("error")) for b in backends.values() if isinstance(b, dict) and b.get("error")}
    if (
        backends
        and len(errors) == 1
        and all(isinstance(b, dict) and b.get("error") for b in backends.values())
    ):
        (error,) = errors
        return error if error.startswith(_NO_SYSTEMD) else None
    return None


def render_status(s: dict[str, Any], paint: Paint | None = None) -> str:
    """``gpushift status`` for a person; ``paint`` colours outcome and state words (None: plain).
    Every value from outside is escaped (gpushift.safetext.terminal) before it is laid out."""
    s = terminal.escape_tree(s)
    paint = paint or str
    daemon = s.get("daemon") or {}
    backends = s.get("backends") or {}
    no_systemd = _no_systemd(backends)
    lines = [
        *_daemon_lines(daemon, paint),
        # With the daemon down, the daemon's line names the bus that cannot be reached: once.
        *([f"systemd:  {no_systemd}"] if no_systemd and daemon.get("running") else []),
        *_serving_lines(s, no_systemd is not None),
        *_backend_lines(backends, paint, no_systemd is not None),
        *_gpu_lines(s.get("gpus") or [], bool(s.get("simulated"))),
        *_last_switch_lines(s, paint),
        *_ledger_lines(s.get("ledger") or {}),
        *_notices_lines(s.get("notices") or {}),
        *_frontdoor_lines(s.get("frontdoor")),
        *_mirror_lines(s.get("mirror"), s.get("stagger")),
    ]
    return "\n".join(lines)


def _mirror_lines(m: Any, stagger: Any) -> list[str]:
    """The fleet's mirror (docs/fleet.md): its state and lag, problems it reported; the stagger."""
    lines = []
    if isinstance(m, dict):
        lag = (
            f"{m.get('lag_rows') or 0} rows behind, for {m.get('lag_s') or 0:g} s"
            if m.get("lag_rows")
            else "caught up"
        )
        err = f"; {plain_error(m['error'])}" if m.get("error") else ""
        lines.append(
            f"mirror:   {known(m.get('state'))} as {known(m.get('host'))} to {known(m.get('database'))}: {lag}{err}"
        )
        for p in m.get("last_problems") or []:
            lines.append(f"mirror:   REPORTED {known(p.get('kind'))}: {known(p.get('what'))}")
        if m.get("machine_id_shared_with"):
            lines.append(
                f"mirror:   machine-id shared with {', '.join(map(str, m['machine_id_shared_with']))}"
            )
    if isinstance(stagger, dict) and stagger.get("stagger_s"):
        lines.append(
            f"stagger:  boundaries {stagger.get('offset_s')} s late (of {stagger.get('stagger_s')} s, from host "
            f"name {known(stagger.get('host_name'))})"
        )
    return lines


def _mib(v: Any) -> str:
    return "?" if v is None else f"{float(v):.0f}"


def _ago(age_s: Any) -> str:
    return f"  ({age_s:.1f}s ago)" if isinstance(age_s, (int, float)) else ""


def _daemon_lines(d: dict[str, Any], paint: Paint) -> list[str]:
    """The daemon: running (with the switch in progress and what it refused) or down."""
    if not d.get("running"):
        why = known(d.get("error"), "not running")
        return [f"daemon:   {paint('DOWN')}: {why}", "          (below: what the CLI can read itself)"]
    lines = [
        f"daemon:   running (pid {known(d.get('pid'))}, {known(d.get('state'))}, gpushift {known(d.get('version'))})"
    ]
    sw = d.get("switch")
    if sw:
        detail = f"{sw['detail']} " if sw.get("detail") else ""
        elapsed = f"{sw['elapsed_s']}s, " if sw.get("elapsed_s") is not None else ""
        lines.append(
            f"switch:   {sw.get('from') or 'off'} -> {known(sw.get('to'))} [{known(sw.get('phase'))}] "
            f"{detail}({elapsed}ticket {known(sw.get('ticket'))}, by {known(sw.get('requested_by'))})"
        )
    if d.get("reload_error"):
        lines.append(f"reload:   REJECTED, old config in force: {d['reload_error']}")
    if d.get("override_ignored"):
        lines.append(f"override: IGNORED, obeying the schedule: {local_times(d['override_ignored'])}")
    if d.get("override_moved_to"):
        lines.append(f"override: the unusable file was moved to {d['override_moved_to']}")
    if d.get("run_ignored"):
        lines.append(f"run store: SET ASIDE at start: {d['run_ignored']}")
    if d.get("override_not_saved"):
        lines.append(f"override: NOT SAVED: {d['override_not_saved']}")
    return lines


def _serving_lines(s: dict[str, Any], no_systemd: bool = False) -> list[str]:
    """The mode, the active backend, what the schedule wants and its next switch, a warning."""
    lines = []
    if s.get("mode"):
        lines.append(f"mode:     {local_times(s['mode'])}")
    active = s.get("active")
    since = f" since {local_time(s['since'])}" if s.get("since") else ""
    if active is None and len(s.get("running") or []) > 1:
        lines.append(f"active:   CONFLICT: {', '.join(map(str, s['running']))} all running")
    elif active is None and no_systemd:
        lines.append("active:   unknown: systemd could not be asked")
    elif active is None:
        lines.append(f"active:   unknown: {s.get('active_reason') or 'systemd could not be asked'}")
    else:
        lines.append(f"active:   {active}{since}")
    sched = s.get("schedule")
    if isinstance(sched, dict):
        if sched.get("wants"):
            exc = sched.get("exception")
            exc_text = (
                # until_local stays ISO 8601 until docs/schedule.md's example of this line says otherwise
                f" (calendar exception {known(exc.get('name'))} until {known(exc.get('until_local'))})"
                if isinstance(exc, dict)
                else ""
            )
            lines.append(f"schedule: wants {sched['wants']} now{exc_text}")
        if sched.get("next"):
            n = sched["next"]
            lines.append(
                f"next:     {known(n.get('target'))} at {local_time(n.get('at') or n.get('at_local'))}"
            )
    if s.get("warning"):
        lines.append(f"WARNING:  {s['warning']}")
    return lines


def _health_text(h: dict[str, Any] | None, in_flight: dict[str, Any] | None, paint: Paint) -> str:
    """``health 200 (0.4s ago)``, ``health FAILING for 12.0s: 503 ...``, ``health unknown: ...``."""
    if h is None:
        return ""
    state = h.get("state") or ("ok" if h.get("ok") else "failing")
    if state == "ok":
        text = f"health {known(h.get('status'), 'ok')}"
    elif state == "unknown":
        text = "health unknown" + (f": {h['detail']}" if h.get("detail") else "")
    else:
        failing = (
            f" for {h['failing_for_s']:.1f}s"
            if isinstance(h.get("failing_for_s"), (int, float)) and h["failing_for_s"]
            else ""
        )
        what = " ".join(str(x) for x in (h.get("status"), h.get("detail")) if x)
        text = f"health {paint('FAILING')}{failing}" + (f": {what}" if what else "")
    text += _ago(h.get("age_s"))
    requests = (in_flight or {}).get("requests")
    return text + (f", {requests} request(s) in flight" if requests is not None else "")


def _backend_lines(backends: dict[str, Any], paint: Paint, no_systemd: bool = False) -> list[str]:
    """One line per backend: its unit, the unit's states, main PID and health (the unit's state
    unknown, without the error again, when systemd could not be asked at all)."""
    lines = ["backends:"]
    for name, b in backends.items():
        if not isinstance(b, dict):
            continue
        if no_systemd:
            lines.append(f"  {name:<10} {known(b.get('unit'))}  unit state unknown")
            continue
        if b.get("error"):
            lines.append(f"  {name:<10} {known(b.get('unit'))}  ERROR: {b['error']}")
            continue
        pid = f"pid {b['main_pid']}" if b.get("main_pid") else ""
        states = f"{known(b.get('active_state'))}/{known(b.get('sub_state')):<10}"
        lines.append(
            f"  {name:<10} {known(b.get('unit')):<28} {states} {pid:<10} "
            + _health_text(b.get("health"), b.get("in_flight"), paint)
        )
        for i in b.get("instances") or []:  # a backend of several (issue 23): each instance's unit
            if isinstance(i, dict):
                ipid = f"pid {i['main_pid']}" if i.get("main_pid") else ""
                state = f"{known(i.get('active_state'))}/{known(i.get('sub_state'))}"
                lines.append(f"    instance {known(i.get('unit')):<28} {state:<18} {ipid}".rstrip())
    return lines


def _gpu_lines(gpus: list[dict[str, Any]], simulated: bool) -> list[str]:
    """One line per GPU (memory, state), then a line per process holding it."""
    lines = ["GPUs (SIMULATED — no real GPU is measured):" if simulated else "GPUs:"]
    for g in gpus:
        if not isinstance(g, dict):
            continue
        if "index" not in g:
            lines.append(f"  {known(g.get('error'), 'unreadable')}")
            continue
        used = (
            "unknown"
            if g.get("used_mib") is None
            else f"{_mib(g['used_mib'])}/{_mib(g.get('total_mib'))} MiB"
        )
        lines.append(
            f"  GPU {known(g['index'])}  {known(g.get('name'))}  {used}  [{known(g.get('state'))}]"
            + (f"  {g['error']}" if g.get("error") else "")
            + _ago(g.get("age_s"))
        )
        for h in g.get("holders") or []:
            if not isinstance(h, dict):
                continue
            amount = f" {terminal.fmt_mib(h['used_mib'])}" if h.get("used_mib") else ""
            unit = f", unit {h['unit']}" if h.get("unit") else ""
            lines.append(
                f"      pid {known(h.get('pid'))} ({known(h.get('command'))}, user {known(h.get('user'))}{unit}){amount}"
            )
        if g.get("unreadable_pids"):
            pids = ", ".join(known(pid) for pid in g["unreadable_pids"])
            lines.append(f"      cannot read open files of pid {pids}")
    return lines


def _last_switch_lines(s: dict[str, Any], paint: Paint) -> list[str]:
    """The last switch (what blocks or defers the next one first), with its warm-up."""
    last = s.get("last_switch")
    if not last:
        return ["last:     no switch recorded yet"]
    lines = []
    sched = s.get("schedule") or {}
    blocked = s.get("blocked") or sched.get("blocked")
    if blocked:
        lines.append(f"blocked:  {local_times(blocked)}")
    deferred = s.get("deferred")
    if isinstance(deferred, dict):
        why = deferred.get("why") or f"the switch to {known(deferred.get('to'))} waits for an idle moment"
        lines.append(f"deferred: {local_times(why)}")
    lines.append(
        f"last:     #{known(last.get('id'))} {last.get('from') or 'off'} -> {known(last.get('to'))} "
        f"{paint(known(last.get('outcome')))} at {local_time(last.get('finished_at') or last.get('started_at'))} "
        f"({known(last.get('trigger'))} by {known(last.get('requested_by'))})"
        + (f": {last['message']}" if last.get("message") and last.get("outcome") != "ok" else "")
    )
    lines.extend(_instance_lines(last.get("instances")))
    w = last.get("warmup") or {}
    if w.get("ok") and all(isinstance(w.get(k), (int, float)) for k in ("ttft_s", "total_s")):
        lines.append(f"warm-up:  first token {w['ttft_s']:.2f}s, answered in {w['total_s']:.2f}s")
    return lines


def _instance_lines(instances: Any) -> list[str]:
    """The last switch's instances (a backend of several): each one's outcome, a failed one's why."""
    lines = []
    for e in instances if isinstance(instances, list) else []:
        if not isinstance(e, dict):
            continue
        gpus = e.get("gpus")
        gpus_text = ",".join(map(known, gpus)) if isinstance(gpus, list) else known(gpus)
        outcome = known(e.get("outcome"))
        why = f" in {known(e.get('phase'))}: {known(e.get('error'))}" if outcome == "failed" else ""
        lines.append(
            f"instance: {known(e.get('unit'))} (GPU {gpus_text}, port {known(e.get('port'))}) "
            f"{outcome.upper() if outcome == 'failed' else outcome}{why}"
        )
    return lines


def _ledger_lines(led: dict[str, Any]) -> list[str]:
    """The ledger's state (``absent`` before there is one), a tamper alarm, a new chain."""
    state = led.get("state")
    if state == "absent":
        where = f"{led['path']} does not exist" if led.get("path") else "no file"
        lines = [f"ledger:   absent (no ledger yet: {where}; the daemon creates it)"]
    elif state and state != "ok":
        pending = led.get("pending") or 0
        lines = [f"ledger:   {state} ({pending} pending) {plain_error(led.get('error'))}".rstrip()]
    else:
        lines = ["ledger:   ok"]
    if led.get("alarm"):
        lines.append(f"ledger:   TAMPER ALARM: {led['alarm']} (run `gpushift ledger verify`)")
    brk = led.get("chain_break")
    if isinstance(brk, dict):
        lines.append(
            f"ledger:   new chain since {local_time(brk.get('at'))}: {known(brk.get('reason'))}, "
            f"old file {brk.get('moved_to') or '-'}"
        )
    return lines


def _notices_lines(n: dict[str, Any]) -> list[str]:
    """The webhook's queue and what the look-ahead is armed for (status's ``notices``)."""
    lines = []
    w = n.get("webhook")
    if isinstance(w, dict):
        err = f", last error: {plain_error(w['last_error'])}" if w.get("last_error") else ""
        lines.append(
            f"webhook:  {known(w.get('url'))}: {w.get('queued') or 0} queued, {w.get('delivered') or 0} delivered, "
            f"{w.get('dropped') or 0} dropped{err}"
        )
    for name, st in (n.get("lookahead") or {}).items():
        armed = (st or {}).get("armed")
        if isinstance(armed, dict):
            lines.append(
                f"ahead:    {name} at {local_time(armed.get('fires_at'))}, before the switch to "
                f"{known(armed.get('to'))} at {local_time(armed.get('at'))}"
            )
    return lines


def _frontdoor_lines(fd: Any) -> list[str]:
    """``front door: [::]:8000 [::]:8080 · held 0 · in flight vllm 2`` (status's ``frontdoor``,
    present with a ``[frontdoor]`` table), or that it is not answering."""
    if not isinstance(fd, dict):
        return []
    listen = " ".join(str(a) for a in fd.get("listen") or []) or "?"
    if not fd.get("answered"):
        why = f" ({plain_error(fd['error'])})" if fd.get("error") else ""
        return [f"front door: {listen} · not answering{why}"]
    counts = fd.get("in_flight")
    counts = counts if isinstance(counts, dict) else {}
    busy = [f"{name} {n}" for name, n in counts.items() if n]
    parts = [listen, f"held {known(fd.get('held'))}", "in flight " + (", ".join(busy) if busy else "0")]
    if fd.get("closed"):
        parts.append("closed " + ", ".join(str(b) for b in fd["closed"]))
    if fd.get("daemon") == "lost":
        parts.append("lost the daemon")
    return ["front door: " + " · ".join(parts), *_frontdoor_instance_lines(fd.get("instances"))]


def _frontdoor_instance_lines(pools: Any) -> list[str]:
    """``front door night: gs-night0.service up 3 · gs-night1.service DOWN 0`` per backend of
    several instances (each instance: up or DOWN as the front door marks it, its requests in flight)."""
    if not isinstance(pools, dict):
        return []
    lines = []
    for backend, entries in pools.items():
        shown = [
            f"{e.get('instance')} {_UP.get(e.get('up'), '?')} {known(e.get('in_flight'))}"
            for e in entries if isinstance(e, dict)
        ]  # fmt: skip
        lines.append(f"front door {backend}: " + " · ".join(shown))
    return lines


_UP: dict[Any, str] = {True: "up", False: "DOWN"}

"""The text of ``gpushift status`` for a person, part by part: the daemon, what serves and what the
schedule wants, the backends, the GPUs, the last switch, the ledger and the notices.

Every value from outside is escaped (gpushift.safetext.terminal) once, in :func:`render_status`,
before any part lays it out; ``paint`` colours outcome and state words (gpushift.cli.output).
"""

from __future__ import annotations

from typing import Any

from gpushift.cli.output import Paint
from gpushift.safetext import terminal


def render_status(s: dict[str, Any], paint: Paint | None = None) -> str:
    """``gpushift status`` for a person; ``paint`` colours outcome and state words (None: plain).
    Every value from outside is escaped (gpushift.safetext.terminal) before it is laid out."""
    s = terminal.escape_tree(s)
    paint = paint or str
    lines = [
        *_daemon_lines(s.get("daemon") or {}, paint),
        *_serving_lines(s),
        *_backend_lines(s.get("backends") or {}, paint),
        *_gpu_lines(s.get("gpus") or [], bool(s.get("simulated"))),
        *_last_switch_lines(s, paint),
        *_ledger_lines(s.get("ledger") or {}),
        *_notices_lines(s.get("notices") or {}),
    ]
    return "\n".join(lines)


def _mib(v: Any) -> str:
    return "?" if v is None else f"{float(v):.0f}"


def _ago(age_s: Any) -> str:
    return "" if age_s is None else f"  ({age_s:.1f}s ago)"


def _daemon_lines(d: dict[str, Any], paint: Paint) -> list[str]:
    """The daemon: running (with the switch in progress and what it refused) or down."""
    if not d.get("running"):
        return [
            f"daemon:   {paint('DOWN')} ({d.get('error', 'not running')}); showing what the CLI can read itself"
        ]
    lines = [f"daemon:   running (pid {d.get('pid')}, {d.get('state', '?')}, gpushift {d.get('version')})"]
    sw = d.get("switch")
    if sw:
        lines.append(
            f"switch:   {sw.get('from') or 'off'} -> {sw.get('to')} [{sw.get('phase')}] "
            f"{sw.get('detail', '')} ({sw.get('elapsed_s')}s, ticket {sw.get('ticket')}, "
            f"by {sw.get('requested_by')})"
        )
    if d.get("reload_error"):
        lines.append(f"reload:   REJECTED, old config in force: {d['reload_error']}")
    if d.get("override_ignored"):
        lines.append(f"override: IGNORED, obeying the schedule: {d['override_ignored']}")
    if d.get("override_not_saved"):
        lines.append(f"override: NOT SAVED: {d['override_not_saved']}")
    return lines


def _serving_lines(s: dict[str, Any]) -> list[str]:
    """The mode, the active backend, what the schedule wants and its next switch, a warning."""
    lines = []
    if s.get("mode"):
        lines.append(f"mode:     {s['mode']}")
    active = s.get("active")
    since = f" since {s['since']}" if s.get("since") else ""
    if active is None and len(s.get("running") or []) > 1:
        lines.append(f"active:   CONFLICT: {', '.join(s['running'])} all running")
    elif active is None:
        lines.append(f"active:   unknown: {s.get('active_reason') or 'systemd could not be asked'}")
    else:
        lines.append(f"active:   {active}{since}")
    sched = s.get("schedule")
    if isinstance(sched, dict):
        if sched.get("wants"):
            exc = sched.get("exception")
            exc_text = f" (calendar exception {exc['name']} until {exc['until_local']})" if exc else ""
            lines.append(f"schedule: wants {sched['wants']} now{exc_text}")
        if sched.get("next"):
            n = sched["next"]
            lines.append(f"next:     {n.get('target')} at {n.get('at_local') or n.get('at')}")
    if s.get("warning"):
        lines.append(f"WARNING:  {s['warning']}")
    return lines


def _health_text(h: dict[str, Any] | None, in_flight: dict[str, Any] | None, paint: Paint) -> str:
    """``health 200 (0.4s ago)``, ``health FAILING for 12.0s: 503 ...``, ``health unknown: ...``."""
    if h is None:
        return ""
    state = h.get("state") or ("ok" if h.get("ok") else "failing")
    if state == "ok":
        text = f"health {h.get('status')}"
    elif state == "unknown":
        text = f"health unknown: {h.get('detail')}"
    else:
        failing = f" for {h['failing_for_s']:.1f}s" if h.get("failing_for_s") else ""
        what = f"{h['status']} {h.get('detail') or ''}" if h.get("status") else h.get("detail")
        text = f"health {paint('FAILING')}{failing}: {what}".rstrip()
    text += _ago(h.get("age_s"))
    requests = (in_flight or {}).get("requests")
    return text + (f", {requests} request(s) in flight" if requests is not None else "")


def _backend_lines(backends: dict[str, Any], paint: Paint) -> list[str]:
    """One line per backend: its unit, the unit's states, main PID and health."""
    lines = ["backends:"]
    for name, b in backends.items():
        if "error" in b:
            lines.append(f"  {name:<10} {b.get('unit')}  ERROR: {b['error']}")
            continue
        pid = f"pid {b['main_pid']}" if b.get("main_pid") else ""
        lines.append(
            f"  {name:<10} {b.get('unit'):<28} {b.get('active_state')}/{b.get('sub_state'):<10} {pid:<10} "
            + _health_text(b.get("health"), b.get("in_flight"), paint)
        )
    return lines


def _gpu_lines(gpus: list[dict[str, Any]], simulated: bool) -> list[str]:
    """One line per GPU (memory, state), then a line per process holding it."""
    lines = ["GPUs (SIMULATED — no real GPU is measured):" if simulated else "GPUs:"]
    for g in gpus:
        if "index" not in g:
            lines.append(f"  {g.get('error')}")
            continue
        used = "unknown" if g.get("used_mib") is None else f"{_mib(g['used_mib'])}/{_mib(g['total_mib'])} MiB"
        lines.append(
            f"  GPU {g['index']}  {g.get('name')}  {used}  [{g.get('state')}]"
            + (f"  {g['error']}" if g.get("error") else "")
            + _ago(g.get("age_s"))
        )
        for h in g.get("holders") or []:
            amount = f" {terminal.fmt_mib(h['used_mib'])}" if h.get("used_mib") else ""
            unit = f", unit {h['unit']}" if h.get("unit") else ""
            lines.append(f"      pid {h['pid']} ({h['command']}, user {h['user']}{unit}){amount}")
        if g.get("unreadable_pids"):
            lines.append(f"      cannot read open files of pid {', '.join(map(str, g['unreadable_pids']))}")
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
        lines.append(f"blocked:  {blocked}")
    deferred = s.get("deferred")
    if deferred:
        lines.append(f"deferred: {deferred.get('why')}")
    lines.append(
        f"last:     #{last.get('id')} {last.get('from') or 'off'} -> {last.get('to')} "
        f"{paint(str(last.get('outcome')))} at {last.get('finished_at') or last.get('started_at')} "
        f"({last.get('trigger')} by {last.get('requested_by')})"
        + (f": {last['message']}" if last.get("message") and last.get("outcome") != "ok" else "")
    )
    w = last.get("warmup") or {}
    if w.get("ok"):
        lines.append(f"warm-up:  first token {w.get('ttft_s'):.2f}s, answered in {w.get('total_s'):.2f}s")
    return lines


def _ledger_lines(led: dict[str, Any]) -> list[str]:
    """The ledger's state, a tamper alarm, a new chain."""
    if led.get("state") and led.get("state") != "ok":
        lines = [
            f"ledger:   {led.get('state')} ({led.get('pending', 0)} pending) {led.get('error') or ''}".rstrip()
        ]
    else:
        lines = ["ledger:   ok"]
    if led.get("alarm"):
        lines.append(f"ledger:   TAMPER ALARM: {led['alarm']} (run `gpushift ledger verify`)")
    brk = led.get("chain_break")
    if isinstance(brk, dict):
        lines.append(
            f"ledger:   new chain since {brk.get('at')}: {brk.get('reason')}, old file {brk.get('moved_to') or '-'}"
        )
    return lines


def _notices_lines(n: dict[str, Any]) -> list[str]:
    """The webhook's queue and what the look-ahead is armed for (status's ``notices``)."""
    lines = []
    w = n.get("webhook")
    if isinstance(w, dict):
        err = f", last error: {w['last_error']}" if w.get("last_error") else ""
        lines.append(
            f"webhook:  {w.get('url')}: {w.get('queued', 0)} queued, {w.get('delivered', 0)} delivered, "
            f"{w.get('dropped', 0)} dropped{err}"
        )
    for name, st in (n.get("lookahead") or {}).items():
        armed = (st or {}).get("armed")
        if isinstance(armed, dict):
            lines.append(
                f"ahead:    {name} at {armed.get('fires_at')}, before the switch to {armed.get('to')} "
                f"at {armed.get('at')}"
            )
    return lines

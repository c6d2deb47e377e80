"""What ``gpushift ledger`` shows beyond raw rows: the list, one record in full (``show``), the
per-machine deployment README (``export --format markdown``) and the JSON lines export.

The comparison of two launches lives in ``diff.py``; its public names are re-exported here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from gpushift.ledger.diff import (
    describe_change,
    diff_records,
    is_launch,
    launch_argv,
    launch_facts,
    launch_info,
    sub,
)
from gpushift.ledger.reader import LedgerReader
from gpushift.ledger.text import (
    command_line,
    duration,
    for_terminal,
    local_time,
    md,
    one_line,
    short,
    size,
    stamp,
    table,
)
from gpushift.values import HookOutcome, Outcome, SwitchRecord

if TYPE_CHECKING:
    from gpushift.config.schema import Config

__all__ = [
    "degraded_note",
    "describe_change",
    "diff_records",
    "export_jsonl",
    "export_markdown",
    "format_list",
    "format_record",
    "launch_facts",
    "list_items",
]

#: The last lines of a hook's output ``ledger show`` prints (the row keeps 4000 characters).
HOOK_OUTPUT_LINES = 10

# --------------------------------------------------------------------------- the list


def list_items(rows: Iterable[SwitchRecord], pending_ids: set[int | None]) -> list[dict[str, Any]]:
    """``gpushift ledger --json``: each record's ``to_dict()``; ``pending_write`` marks the spooled."""
    items = []
    for r in rows:
        d = r.to_dict()
        if r.id in pending_ids:
            d["pending_write"] = True
        items.append(d)
    return items


def format_list(
    rows: list[SwitchRecord], pending_ids: set[int | None], paint: Callable[[str], str] | None = None
) -> str:
    """``gpushift ledger``: one line per switch, newest first; ``*`` marks a record still spooled.
    ``paint`` colours the outcome column (None: plain)."""
    cells = []
    for r in map(for_terminal, rows):
        rid = f"{r.id}*" if r.id in pending_ids else str(r.id)
        cells.append(
            [
                rid,
                local_time(r.started_at),
                f"{r.from_backend or '-'} → {r.to_backend}"
                if r.outcome != Outcome.CHAIN_BREAK.value
                else "(new chain)",
                r.outcome,
                duration(r),
                r.trigger,
                r.requested_by,
                one_line(r.backend_version, 24) or "-",
                one_line(r.reason, 60) or "-",
            ]
        )
    headers = ["ID", "STARTED", "SWITCH", "OUTCOME", "TOOK", "TRIGGER", "BY", "VERSION", "REASON"]
    out = table(headers, cells, {3: paint} if paint else None)
    if pending_ids & {r.id for r in rows}:
        out += "\n* not yet in the database (pending in the spool)"
    return out


def degraded_note(led: LedgerReader) -> str | None:
    """A line saying that records wait in the spool (None when none does)."""
    pending = len(led.pending_records())
    if not pending:
        return None
    return (
        f"ledger: degraded ({pending} pending in {led.spool_dir}; the daemon writes them when the "
        f"database accepts writes again)"
    )


# --------------------------------------------------------------------------- show


def format_record(rec: SwitchRecord, paint: Callable[[str], str] | None = None) -> str:
    """``ledger show``: every field of one record, grouped, for a person (``paint`` colours the
    outcome)."""
    lines: list[str] = []
    rec = for_terminal(rec)

    def kv(key: str, value: Any) -> None:
        lines.append(f"  {key:<20} {value if value not in (None, '') else '-'}")

    sim = " SIMULATED" if rec.gpu_facts.get("simulated") else ""
    lines.append(f"Switch {rec.id}" + (f"  (ticket {rec.ticket})" if rec.ticket else ""))
    kv("outcome", paint(rec.outcome) if paint else rec.outcome)
    kv("from → to", f"{rec.from_backend or '-'} → {rec.to_backend}")
    kv("started", f"{local_time(rec.started_at, True)} local ({rec.started_at.isoformat()})")
    kv("finished", f"{local_time(rec.finished_at, True)} (took {duration(rec)})" if rec.finished_at else None)
    who = rec.requested_by + (f" (uid {rec.uid})" if rec.uid is not None else "")
    kv("trigger", f"{rec.trigger}, by {who}")
    kv("reason", rec.reason)
    kv("failed phase", rec.failed_phase)
    kv("message", rec.message)
    kv("systemd result", rec.systemd_result)

    li = launch_info(rec)
    unit = sub(li, "unit")
    lines.append("Launch")
    kv("unit", rec.unit)
    kv(
        "unit file",
        f"{rec.unit_path or unit.get('path') or '-'}  sha256 {rec.unit_sha256 or unit.get('sha256') or '-'}",
    )
    for d in unit.get("drop_ins") or []:
        kv("drop-in", f"{d.get('path')}  sha256 {d.get('sha256') or d.get('error') or '-'}")
    kv("user", unit.get("user"))
    kv("working directory", unit.get("working_directory"))
    for k, v in sorted((unit.get("environment") or {}).items()):
        kv("environment", f"{k}={v}")
    kv("command configured", command_line(rec.argv_configured) if rec.argv_configured else None)
    kv("command running", command_line(rec.argv_running) if rec.argv_running else None)
    for m in li.get("models") or []:
        if m.get("error") or m.get("skipped"):
            kv(f"model {m.get('flag')}", f"{m.get('path')}  ({m.get('error') or m.get('skipped')})")
        else:
            kv(
                f"model {m.get('flag')}",
                f"{m.get('resolved') or m.get('path')}  {size(m.get('size_bytes'))}  mtime {m.get('mtime')}  "
                f"{m.get('fingerprint')}",
            )
    if rec.extra.get("launch_error"):
        kv("launch info error", rec.extra["launch_error"])

    gf = rec.gpu_facts or {}
    lines.append("Versions")
    kv(
        "backend",
        f"{rec.backend_version or '-'}" + (f" (from {rec.version_source})" if rec.version_source else ""),
    )
    kv("gpushift", rec.gpushift_version)
    kv("driver", (gf.get("driver_version") or "-") + sim)
    kv("CUDA", (gf.get("cuda_version") or "-") + sim)
    host = sub(li, "host")
    if host:
        lines.append("Host")
        kv("name", host.get("hostname"))
        kv("kernel", host.get("kernel"))
        kv("os", host.get("os"))
    gpus = gf.get("gpus") or []
    if gpus or gf.get("error"):
        lines.append("GPUs" + sim)
        if gf.get("error"):
            kv("error", gf["error"])
        for g in gpus:
            ecc = g.get("ecc_enabled")
            ecc_text = "ECC ?" if ecc is None else ("ECC on" if ecc else "ECC off")
            if g.get("ecc_uncorrected") is not None:
                ecc_text += f", {g['ecc_uncorrected']} uncorrected"
            kv(
                f"GPU {g.get('index')}",
                f"{g.get('name')}  {g.get('uuid')}  cc {g.get('compute_capability') or '?'}  "
                f"{size((g.get('total_mib') or 0) * (1 << 20))}  {ecc_text}{sim}",
            )
    if rec.vram:
        lines.append("VRAM used (MiB)" + sim)
        for phase, readings in rec.vram.items():
            parts = []
            for r in readings or []:
                used = r.get("used_mib")
                used_text = "?" if used is None else f"{used:.0f}"
                part = f"GPU{r.get('index')} {used_text}/{(r.get('total_mib') or 0):.0f}"
                holders = r.get("holders") or []
                if holders:
                    part += " (" + ", ".join(f"pid {h.get('pid')} {h.get('command')}" for h in holders) + ")"
                if r.get("error"):
                    part += f" [error: {r['error']}]"
                parts.append(part)
            kv(phase, "; ".join(parts) + sim)
    if rec.durations_s:
        lines.append("Durations")
        for phase, s in rec.durations_s.items():
            kv(phase, f"{s:.2f} s" if isinstance(s, (int, float)) else s)
    w = rec.extra.get("warmup")
    if isinstance(w, dict):
        lines.append("Warm-up (proof of inference)")
        kv("request", w.get("path"))
        kv("answered", "yes" if w.get("ok") else f"no: {w.get('detail')}")
        kv("first token", f"{w['ttft_s']:.3f} s" if isinstance(w.get("ttft_s"), (int, float)) else None)
        kv("total", f"{w['total_s']:.3f} s" if isinstance(w.get("total_s"), (int, float)) else None)
    ev = rec.extra.get("evidence")
    if isinstance(ev, dict):
        lines.append(f"Evidence: {ev.get('unit')}")
        kv("result", ev.get("result"))
        kv("exit", ev.get("exit"))
        log = ev.get("log")
        log = log if isinstance(log, dict) else {}
        if log.get("error"):
            kv("log", log["error"])
        for line in log.get("lines") or []:
            lines.append(f"    | {line}")
    _hooks(rec.extra.get("hooks"), lines, kv)
    shown = ("launch", "launch_error", "warmup", "evidence", "hooks")
    others = {k: v for k, v in rec.extra.items() if k not in shown}
    if others:
        lines.append("Other")
        for k, v in sorted(others.items()):
            kv(k, json.dumps(v, ensure_ascii=False, default=str))
    return "\n".join(lines) + "\n"


def _hooks(hooks: Any, lines: list[str], kv: Callable[[str, Any], None]) -> None:
    """The row's hook runs (``extra.hooks``): what ran, as whom, how it ended, its output's end."""
    if not isinstance(hooks, list) or not hooks:
        return
    lines.append("Hooks")
    for h in hooks:
        if not isinstance(h, dict):
            continue
        seconds, status, argv = h.get("seconds"), h.get("exit_status"), h.get("argv")
        seconds = seconds if isinstance(seconds, (int, float)) else 0.0
        status = status if isinstance(status, int) else None
        argv = [str(a) for a in argv] if isinstance(argv, list) else []
        out = HookOutcome(
            str(h.get("unit")), str(h.get("result")), status, "", float(seconds), h.get("error")
        )
        kv(
            str(h.get("event")),
            f"{command_line(argv)} as {h.get('user')}: {out.describe()} in {out.seconds:.2f} s",
        )
        # Its newlines reach here as the two characters backslash and n (for_terminal escaped them).
        text = str(h.get("output") or "").replace("\\n", "\n")
        for line in text.splitlines()[-HOOK_OUTPUT_LINES:]:
            lines.append(f"    | {line}")


# --------------------------------------------------------------------------- exports


def export_jsonl(led: LedgerReader) -> Iterator[str]:
    """Every record as one JSON line, oldest first; then the records pending in the spool."""
    for rec in led.iter_all():
        yield json.dumps(rec.to_dict(), ensure_ascii=False, default=str) + "\n"
    for rec in led.pending_records():
        d = rec.to_dict()
        d["pending_write"] = True
        yield json.dumps(d, ensure_ascii=False, default=str) + "\n"


def export_markdown(led: LedgerReader, config: Config | None = None, recent: int = 20) -> str:
    """The per-machine deployment README: per backend its current launch command and versions, and
    the history of changes (what changed, when, who, why); then the latest switches."""
    from gpushift import __version__

    history: dict[str, list[tuple[SwitchRecord, list[dict[str, Any]] | None]]] = {}
    last_launch: dict[str, SwitchRecord] = {}
    current: dict[str, SwitchRecord] = {}
    unchanged: dict[str, int] = {}
    attempts: dict[str, int] = {}
    host: dict[str, Any] = {}  # from the newest record that described its host
    gpu_facts: dict[str, Any] = {}  # likewise for the GPUs
    recent_rows: list[SwitchRecord] = []
    total = 0
    for rec in map(for_terminal, led.iter_all()):  # oldest first, streamed: 100,000 rows are fine
        total += 1
        if sub(launch_info(rec), "host"):
            host = sub(launch_info(rec), "host")
        if rec.gpu_facts:
            gpu_facts = rec.gpu_facts
        recent_rows.append(rec)
        if len(recent_rows) > recent:
            recent_rows.pop(0)
        b = rec.to_backend
        if not is_launch(rec, b):
            continue
        attempts[b] = attempts.get(b, 0) + 1
        prev = last_launch.get(b)
        changes = diff_records(prev, rec) if prev else None
        if prev is None or changes or rec.outcome != "ok":
            history.setdefault(b, []).append((rec, changes))
        else:
            unchanged[b] = unchanged.get(b, 0) + 1
        last_launch[b] = rec
        if rec.outcome == "ok":
            current[b] = rec

    hostname = (host or {}).get("hostname") or _hostname()
    out: list[str] = [f"# Deployment record: {hostname}", ""]
    out.append(
        f"Written by `gpushift ledger export` (gpushift {__version__}) on {stamp(datetime.now(timezone.utc))} "
        f"from `{led.db_path}`: {total} switch(es) recorded. Regenerate it rather than editing it."
    )
    out.append("")
    if total:
        gf = gpu_facts
        sim = " **SIMULATED**" if gf.get("simulated") else ""
        gpus = gf.get("gpus") or []
        gpu_names = ", ".join(
            f"GPU {g.get('index')}: {g.get('name')} (cc {g.get('compute_capability') or '?'}, {g.get('uuid')})"
            for g in gpus
        )
        out.append(f"- Host: {hostname}, kernel {host.get('kernel') or '?'}, {host.get('os') or 'OS ?'}")
        out.append(
            f"- GPUs{sim}: {gpu_names or '?'}; driver {gf.get('driver_version') or '?'}, "
            f"CUDA {gf.get('cuda_version') or '?'}"
        )
        out.append("")
    pending = led.pending_records()
    if pending:
        out.append(
            f"> {len(pending)} switch record(s) are waiting in the spool (the database could not be written)."
        )
        out.append("")

    backend_names = list(dict.fromkeys((list(config.backends) if config else []) + sorted(attempts)))
    for b in backend_names:
        out.append(f"## Backend `{b}`")
        out.append("")
        if config is not None and b in config.backends:
            bc = config.backends[b]
            out.append(f"Unit `{bc.unit}`, health `{bc.health_url}`.")
            out.append("")
        cur = current.get(b)
        if cur is None and b not in attempts:
            out.append("Never launched by gpushift yet.")
            out.append("")
            continue
        if cur is None:
            out.append("No successful launch recorded yet.")
            out.append("")
        else:
            out += _md_current(cur)
        hist = history.get(b, [])
        out.append("### History of changes (newest first)")
        out.append("")
        for rec, changes in reversed(hist):
            who = md(rec.requested_by) + (f" (uid {rec.uid})" if rec.uid is not None else "")
            out.append(
                f"- **#{rec.id}** {stamp(rec.started_at)}, {who}, {rec.trigger}: "
                f"“{md(rec.reason)}” → {rec.outcome}"
            )
            if rec.outcome != "ok" and rec.message:
                out.append(f"  - {md(rec.message)}")
            if changes is None:
                out.append("  - first launch recorded")
            for c in changes or []:
                out.append(f"  - {md(describe_change(c, width=0))}")
        n = unchanged.get(b, 0)
        if n:
            out.append(f"- … and {n} more launch(es) with no change.")
        out.append("")

    out.append(f"## Latest switches (newest first, at most {recent})")
    out.append("")
    out.append("| # | Started | From → to | Trigger | Who | Why | Outcome |")
    out.append("|---|---|---|---|---|---|---|")
    for rec in reversed(recent_rows):
        out.append(
            f"| {rec.id} | {stamp(rec.started_at)} | {md(rec.from_backend)} → {md(rec.to_backend)} | "
            f"{md(rec.trigger)} | {md(rec.requested_by)} | {md(rec.reason)} | {md(rec.outcome)} |"
        )
    out.append("")
    return "\n".join(out)


def _md_current(rec: SwitchRecord) -> list[str]:
    li = launch_info(rec)
    unit = sub(li, "unit")
    gf = rec.gpu_facts or {}
    sim = " (SIMULATED GPUs)" if gf.get("simulated") else ""
    out = [
        f"Current launch: **#{rec.id}**, {stamp(rec.started_at)}, by {md(rec.requested_by)}: “{md(rec.reason)}”.",
        "",
    ]
    out.append("```sh")
    out.append(command_line(launch_argv(rec), wrap=True))
    out.append("```")
    out.append("")
    out.append(
        f"- Version: {rec.backend_version or '?'}"
        + (f" (from {rec.version_source})" if rec.version_source else "")
    )
    out.append(
        f"- gpushift {rec.gpushift_version or '?'}; driver {gf.get('driver_version') or '?'}, "
        f"CUDA {gf.get('cuda_version') or '?'}{sim}"
    )
    path = rec.unit_path or unit.get("path")
    sha = rec.unit_sha256 or unit.get("sha256")
    if path or sha:
        out.append(f"- Unit file: `{path or '?'}` (sha256 {short(sha, 16)})")
    for d in unit.get("drop_ins") or []:
        out.append(f"- Drop-in: `{d.get('path')}` (sha256 {short(d.get('sha256'), 16)})")
    if unit.get("user") or unit.get("working_directory"):
        out.append(
            f"- User {unit.get('user') or '-'}, working directory `{unit.get('working_directory') or '-'}`"
        )
    env = unit.get("environment") or {}
    if env:
        out.append("- Environment: " + ", ".join(f"`{k}={v}`" for k, v in sorted(env.items())))
    for m in li.get("models") or []:
        if m.get("error") or m.get("skipped"):
            out.append(f"- Model `{m.get('path')}` ({m.get('flag')}): {m.get('error') or m.get('skipped')}")
        else:
            out.append(
                f"- Model `{m.get('resolved') or m.get('path')}` ({m.get('flag')}): {size(m.get('size_bytes'))}, "
                f"modified {m.get('mtime')}, fingerprint `{short(m.get('fingerprint'), 24)}`"
            )
    if rec.durations_s:
        out.append(
            "- Took: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in rec.durations_s.items() if isinstance(v, (int, float)))
        )
    out.append("")
    return out


def _hostname() -> str:
    import socket

    return socket.gethostname()

"""``gpushift ledger show``: every field of one record, grouped in sections, for a person.

Pure: a :class:`~gpushift.values.SwitchRecord` in, text out.  Each section (the switch, its launch,
versions, host, GPUs, VRAM, durations, the proofs of inference, hooks, the rest of ``extra``) is one
function that adds its lines; ``format_record`` puts them in order.  Re-exported by ``reports.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from gpushift.ledger.diff import launch_info, sub
from gpushift.ledger.text import command_line, duration, for_terminal, local_time, size
from gpushift.values import HookOutcome, SwitchRecord

#: The last lines of a hook's output ``ledger show`` prints (the row keeps 4000 characters).
HOOK_OUTPUT_LINES = 10

#: The keys of ``extra`` that have a section of their own; every other one goes under "Other".
_SHOWN = ("launch", "launch_error", "warmup", "evidence", "hooks")


class _Text:
    """The lines of ``ledger show``: section titles, indented ``key value`` rows, quoted output."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, line: str) -> None:
        self.lines.append(line)

    def kv(self, key: str, value: Any) -> None:
        self.lines.append(f"  {key:<20} {value if value not in (None, '') else '-'}")


def format_record(rec: SwitchRecord, paint: Callable[[str], str] | None = None) -> str:
    """``ledger show``: every field of one record, grouped, for a person (``paint`` colours the
    outcome)."""
    out = _Text()
    rec = for_terminal(rec)
    sim = " SIMULATED" if rec.gpu_facts.get("simulated") else ""
    li = launch_info(rec)
    _switch(out, rec, paint)
    _launch(out, rec, li)
    _versions(out, rec, li, sim)
    _gpus(out, rec.gpu_facts or {}, sim)
    _vram(out, rec.vram, sim)
    if rec.durations_s:
        out.add("Durations")
        for phase, s in rec.durations_s.items():
            out.kv(phase, f"{s:.2f} s" if isinstance(s, (int, float)) else s)
    _warmup(out, rec.extra.get("warmup"))
    _evidence(out, rec.extra.get("evidence"))
    _hooks(out, rec.extra.get("hooks"))
    others = {k: v for k, v in rec.extra.items() if k not in _SHOWN}
    if others:
        out.add("Other")
        for k, v in sorted(others.items()):
            out.kv(k, json.dumps(v, ensure_ascii=False, default=str))
    return "\n".join(out.lines) + "\n"


def _switch(out: _Text, rec: SwitchRecord, paint: Callable[[str], str] | None) -> None:
    """The first lines: which switch, how it ended, when, who asked and why."""
    out.add(f"Switch {rec.id}" + (f"  (ticket {rec.ticket})" if rec.ticket else ""))
    out.kv("outcome", paint(rec.outcome) if paint else rec.outcome)
    out.kv("from → to", f"{rec.from_backend or '-'} → {rec.to_backend}")
    out.kv("started", f"{local_time(rec.started_at, True)} local ({rec.started_at.isoformat()})")
    out.kv(
        "finished", f"{local_time(rec.finished_at, True)} (took {duration(rec)})" if rec.finished_at else None
    )
    who = rec.requested_by + (f" (uid {rec.uid})" if rec.uid is not None else "")
    out.kv("trigger", f"{rec.trigger}, by {who}")
    out.kv("reason", rec.reason)
    out.kv("failed phase", rec.failed_phase)
    out.kv("message", rec.message)
    out.kv("systemd result", rec.systemd_result)


def _launch(out: _Text, rec: SwitchRecord, li: Mapping[str, Any]) -> None:
    """The unit, its files, user, directory and environment, the command lines, the models."""
    unit = sub(li, "unit")
    out.add("Launch")
    out.kv("unit", rec.unit)
    out.kv(
        "unit file",
        f"{rec.unit_path or unit.get('path') or '-'}  sha256 {rec.unit_sha256 or unit.get('sha256') or '-'}",
    )
    for d in unit.get("drop_ins") or []:
        out.kv("drop-in", f"{d.get('path')}  sha256 {d.get('sha256') or d.get('error') or '-'}")
    out.kv("user", unit.get("user"))
    out.kv("working directory", unit.get("working_directory"))
    for k, v in sorted((unit.get("environment") or {}).items()):
        out.kv("environment", f"{k}={v}")
    out.kv("command configured", command_line(rec.argv_configured) if rec.argv_configured else None)
    out.kv("command running", command_line(rec.argv_running) if rec.argv_running else None)
    for m in li.get("models") or []:
        if m.get("error") or m.get("skipped"):
            out.kv(f"model {m.get('flag')}", f"{m.get('path')}  ({m.get('error') or m.get('skipped')})")
        else:
            out.kv(
                f"model {m.get('flag')}",
                f"{m.get('resolved') or m.get('path')}  {size(m.get('size_bytes'))}  mtime {m.get('mtime')}  "
                f"{m.get('fingerprint')}",
            )
    if rec.extra.get("launch_error"):
        out.kv("launch info error", rec.extra["launch_error"])


def _versions(out: _Text, rec: SwitchRecord, li: Mapping[str, Any], sim: str) -> None:
    """The backend's, gpushift's, the driver's and CUDA's versions; the host, where it was described."""
    gf = rec.gpu_facts or {}
    out.add("Versions")
    out.kv(
        "backend",
        f"{rec.backend_version or '-'}" + (f" (from {rec.version_source})" if rec.version_source else ""),
    )
    out.kv("gpushift", rec.gpushift_version)
    out.kv("driver", (gf.get("driver_version") or "-") + sim)
    out.kv("CUDA", (gf.get("cuda_version") or "-") + sim)
    host = sub(li, "host")
    if host:
        out.add("Host")
        out.kv("name", host.get("hostname"))
        out.kv("kernel", host.get("kernel"))
        out.kv("os", host.get("os"))


def _gpus(out: _Text, gf: Mapping[str, Any], sim: str) -> None:
    """Each GPU: name, UUID, compute capability, memory, ECC (or the error that hid them)."""
    gpus = gf.get("gpus") or []
    if not (gpus or gf.get("error")):
        return
    out.add("GPUs" + sim)
    if gf.get("error"):
        out.kv("error", gf["error"])
    for g in gpus:
        ecc = g.get("ecc_enabled")
        ecc_text = "ECC ?" if ecc is None else ("ECC on" if ecc else "ECC off")
        if g.get("ecc_uncorrected") is not None:
            ecc_text += f", {g['ecc_uncorrected']} uncorrected"
        out.kv(
            f"GPU {g.get('index')}",
            f"{g.get('name')}  {g.get('uuid')}  cc {g.get('compute_capability') or '?'}  "
            f"{size((g.get('total_mib') or 0) * (1 << 20))}  {ecc_text}{sim}",
        )


def _vram(out: _Text, vram: Mapping[str, Any], sim: str) -> None:
    """Per phase, each GPU's memory in use and who held it."""
    if not vram:
        return
    out.add("VRAM used (MiB)" + sim)
    for phase, readings in vram.items():
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
        out.kv(phase, "; ".join(parts) + sim)


def _warmup(out: _Text, w: Any) -> None:
    """The warm-up request (``extra.warmup``): the proof that the backend answered."""
    if not isinstance(w, dict):
        return
    out.add("Warm-up (proof of inference)")
    out.kv("request", w.get("path"))
    out.kv("answered", "yes" if w.get("ok") else f"no: {w.get('detail')}")
    out.kv("first token", f"{w['ttft_s']:.3f} s" if isinstance(w.get("ttft_s"), (int, float)) else None)
    out.kv("total", f"{w['total_s']:.3f} s" if isinstance(w.get("total_s"), (int, float)) else None)


def _evidence(out: _Text, ev: Any) -> None:
    """What a failed unit left (``extra.evidence``): its result, exit, and the end of its log."""
    if not isinstance(ev, dict):
        return
    out.add(f"Evidence: {ev.get('unit')}")
    out.kv("result", ev.get("result"))
    out.kv("exit", ev.get("exit"))
    log = ev.get("log")
    log = log if isinstance(log, dict) else {}
    if log.get("error"):
        out.kv("log", log["error"])
    for line in log.get("lines") or []:
        out.add(f"    | {line}")


def _hooks(out: _Text, hooks: Any) -> None:
    """The row's hook runs (``extra.hooks``): what ran, as whom, how it ended, its output's end."""
    if not isinstance(hooks, list) or not hooks:
        return
    out.add("Hooks")
    for h in hooks:
        if not isinstance(h, dict):
            continue
        seconds, status, argv = h.get("seconds"), h.get("exit_status"), h.get("argv")
        seconds = seconds if isinstance(seconds, (int, float)) else 0.0
        status = status if isinstance(status, int) else None
        argv = [str(a) for a in argv] if isinstance(argv, list) else []
        outcome = HookOutcome(
            str(h.get("unit")), str(h.get("result")), status, "", float(seconds), h.get("error")
        )
        out.kv(
            str(h.get("event")),
            f"{command_line(argv)} as {h.get('user')}: {outcome.describe()} in {outcome.seconds:.2f} s",
        )
        # Its newlines reach here as the two characters backslash and n (for_terminal escaped them).
        text = str(h.get("output") or "").replace("\\n", "\n")
        for line in text.splitlines()[-HOOK_OUTPUT_LINES:]:
            out.add(f"    | {line}")

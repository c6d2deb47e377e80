"""`gpushift check`: the preflight doctor as a command (no daemon needed).

Validates the config and the schedule, reads each backend's unit from systemd and the GPU facts
from the GPU provider, and reports every finding of the rules in gpushift/doctor/: errors
(a switch to that backend would be refused) and warnings (it would run, logged and recorded).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from .. import redact, terminal
from .output import say, say_json


def _collect(config_path: str | None) -> dict[str, Any]:
    from .. import config as config_mod
    from ..errors import ConfigError, GpushiftError

    report: dict[str, Any] = {
        "ok": False,
        "config": {"path": config_mod.config_path(config_path)},
        "schedule": None,
        "gpu": None,
        "units": {},
        "findings": [],
    }
    try:
        cfg = config_mod.load(config_path)
    except ConfigError as e:
        report["config"].update(ok=False, error=str(e))
        return report
    report["config"].update(ok=True, backends=list(cfg.backends))
    from ..daemon import load_schedule_of

    try:
        sched = load_schedule_of(cfg)
        report["schedule"] = (
            {"ok": True, "path": sched.path, "entries": len(sched.entries), "tz": str(sched.tz)}
            if sched
            else {"ok": True, "path": None}
        )
    except ConfigError as e:
        report["schedule"] = {"ok": False, "error": str(e)}
    from .. import wiring
    from ..adapters.doctor_io import run_checks

    units = None
    try:
        from ..adapters import systemd
        from ..adapters.bus import connect

        units = systemd.SystemdUnits(connect(cfg.daemon.bus))
    except GpushiftError as e:
        report["systemd_error"] = str(e)
    gpu = wiring.make_gpu(cfg)
    try:
        ledger = wiring.make_ledger(cfg, readonly=True)
    except Exception:
        ledger = None
    findings, facts, states = run_checks(cfg, units, gpu, ledger)
    report["gpu"] = facts.to_dict()
    report["units"] = {
        name: (
            {
                "unit": cfg.backends[name].unit,
                "load_state": st.load_state,
                "active_state": st.active_state,
                "exec_start": list(st.exec_start),
                "fragment_path": st.fragment_path,
            }
            if st
            else {"unit": cfg.backends[name].unit, "error": report.get("systemd_error", "unreadable")}
        )
        for name, st in states.items()
    }
    report["findings"] = [f.to_dict() for f in findings]
    errors = sum(1 for f in findings if f.is_error)
    report["errors"] = errors + (0 if report["schedule"]["ok"] else 1)
    report["warnings"] = sum(1 for f in findings if not f.is_error)
    report["ok"] = report["errors"] == 0 and units is not None
    return report


def _render(r: dict[str, Any]) -> str:
    lines = []
    c = r["config"]
    lines.append(f"config    {c['path']}: " + ("ok" if c.get("ok") else f"INVALID: {c.get('error')}"))
    if not c.get("ok"):
        return "\n".join(lines)
    s = r["schedule"] or {}
    if not s.get("ok"):
        lines.append(f"schedule  INVALID: {s.get('error')}")
    elif s.get("path"):
        lines.append(f"schedule  {s['path']}: ok ({s['entries']} entries, TZ {s['tz']})")
    else:
        lines.append("schedule  none configured (gpushift switches only when asked)")
    if r.get("systemd_error"):
        lines.append(f"systemd   UNREACHABLE: {r['systemd_error']}")
    g = r.get("gpu") or {}
    sim = " (SIMULATED)" if g.get("simulated") else ""
    gpus = g.get("gpus") or []
    names = ", ".join(
        f"GPU {x['index']} {x['name']} sm_{(x.get('compute_capability') or '?').replace('.', '')}"
        for x in gpus
    )
    lines.append(
        f"GPUs{sim}  driver {g.get('driver_version')}, CUDA {g.get('cuda_version')}: {names or 'none'}"
        + (f"  ERROR: {g['error']}" if g.get("error") else "")
    )
    by_backend: dict[str, list[dict[str, str]]] = {}
    for f in r["findings"]:
        by_backend.setdefault(f["backend"], []).append(f)
    for name, u in r["units"].items():
        state = u.get("error") or f"{u.get('load_state')}, {u.get('active_state')}"
        lines.append(f"\nbackend {name} ({u['unit']}: {state})")
        fs = by_backend.get(name, [])
        if not fs:
            lines.append("  ok: no findings")
        for f in fs:
            tag = "ERROR  " if f["severity"] == "error" else "warning"
            lines.append(f"  {tag} [{f['code']}] {f['message']}")
            if f.get("hint"):
                lines.append(f"          hint: {f['hint']}")
    lines.append(f"\n{r.get('errors', 0)} error(s), {r.get('warnings', 0)} warning(s)")
    return "\n".join(lines)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object (stable keys).")
@click.pass_context
def check(ctx: click.Context, as_json: bool) -> None:
    """Check config, schedule, units and GPU facts before any switch (the preflight doctor).

    Reports each finding as ERROR (a switch to that backend is refused) or warning (it runs, and the
    warning is logged and recorded in the ledger): FP8 or BF16 on GPUs without them, more
    tensor-parallel ranks than GPUs, --split-mode none on several GPUs, missing model files, ECC
    errors, an unpinned version, port clashes, unit settings that let processes outlive a stop.
    Exit status 0 when there is no error, 1 otherwise (2: the config itself is invalid).

    \b
    Examples:
      gpushift check
      gpushift check --json           # one JSON object with stable keys
    """
    # The units' ExecStart= and the findings quote command lines: credentials masked in both outputs.
    report = redact.redact_tree(_collect(ctx.obj.get("config_path") if ctx.obj else None))
    if as_json:
        say_json(json.dumps(report, indent=2, default=str))
    else:
        say(_render(terminal.escape_tree(report)))
    if not report["config"].get("ok"):
        sys.exit(2)
    if not report["ok"]:
        sys.exit(1)

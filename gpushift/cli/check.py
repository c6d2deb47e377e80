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

from gpushift.cli.output import say, say_json
from gpushift.cli.status_text import known
from gpushift.safetext import redact, terminal


def _runnable_by(path: str, user: str) -> str | None:
    """Why ``user`` cannot run ``path`` (None: it can): the file is a regular executable file and
    every directory above it may be searched, by the owner/group/other bits that apply to the user."""
    import grp
    import os
    import pwd
    import stat

    try:
        pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, OverflowError):
        return f"no such user {user!r} ([hooks] user)"
    gids = {pw.pw_gid} | {g.gr_gid for g in grp.getgrall() if pw.pw_name in g.gr_mem}

    def allowed(st: os.stat_result) -> bool:
        if pw.pw_uid == 0:
            return bool(st.st_mode & 0o111) or stat.S_ISDIR(st.st_mode)
        if st.st_uid == pw.pw_uid:
            return bool(st.st_mode & stat.S_IXUSR)
        if st.st_gid in gids:
            return bool(st.st_mode & stat.S_IXGRP)
        return bool(st.st_mode & stat.S_IXOTH)

    try:
        st = os.stat(path)
    except OSError as e:
        return f"cannot be run: {e.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    parent = os.path.dirname(path)
    while True:
        try:
            if not allowed(os.stat(parent)):
                return f"{parent} may not be searched by {pw.pw_name}"
        except OSError as e:
            return f"{parent}: {e.strerror}"
        if parent == "/":
            break
        parent = os.path.dirname(parent)
    if not allowed(st):
        return f"is not executable by {pw.pw_name} (mode {stat.filemode(st.st_mode)}, owner uid {st.st_uid})"
    return None


def _hooks(cfg: Any) -> dict[str, Any]:
    """Each configured hook's program, checked the way its transient unit will run it."""
    from gpushift.values import HookEvent

    out: dict[str, Any] = {"user": cfg.hooks.user, "hooks": []}
    for event in HookEvent:
        hook = cfg.hooks.get(event)
        if hook is None:
            continue
        why = _runnable_by(hook.argv[0], cfg.hooks.user)
        out["hooks"].append(
            {
                "event": event.value,
                "program": hook.argv[0],
                "required": hook.required,
                "ok": why is None,
                "error": why,
            }
        )
    out["errors"] = sum(1 for h in out["hooks"] if not h["ok"])
    return out


def _directory_problem(path: str) -> str | None:
    """Why the daemon could not keep its files in ``path`` (None: it can).  A directory that does not
    exist yet is fine when the nearest existing one above it is a directory (systemd's
    ``StateDirectory=``/``RuntimeDirectory=`` or the daemon makes it)."""
    import os
    import stat

    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        parent = os.path.dirname(os.path.abspath(path))
        while parent != "/" and not os.path.isdir(parent) and not os.path.lexists(parent):
            parent = os.path.dirname(parent)
        return None if os.path.isdir(parent) else f"cannot be made: {parent} is not a directory"
    except OSError as e:
        return f"cannot be read: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if os.geteuid() == 0 and not os.access(path, os.W_OK | os.X_OK):
        return "is not writable"
    return None


def _directories(cfg: Any) -> list[dict[str, Any]]:
    """``[daemon] state_dir`` and ``runtime_dir``: each a usable directory (the daemon refuses every
    switch without one)."""
    out = []
    for key in ("state_dir", "runtime_dir"):
        path = getattr(cfg.daemon, key)
        why = _directory_problem(path)
        out.append({"setting": key, "path": path, "ok": why is None, "error": why})
    return out


def _collect(config_path: str | None) -> dict[str, Any]:
    from gpushift.config import schema as config_mod
    from gpushift.errors import ConfigError, GpushiftError

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
    from gpushift.daemon import load_schedule_of

    try:
        sched = load_schedule_of(cfg)
        report["schedule"] = (
            {"ok": True, "path": sched.path, "entries": len(sched.entries), "tz": str(sched.tz)}
            if sched
            else {"ok": True, "path": None}
        )
    except ConfigError as e:
        report["schedule"] = {"ok": False, "error": str(e)}
    from gpushift.daemon import wiring
    from gpushift.doctor.facts import run_checks

    units = None
    try:
        from gpushift.host import systemd
        from gpushift.host.dbus import connect

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
    report["hooks"] = _hooks(cfg)
    report["directories"] = _directories(cfg)
    from gpushift.cli import check_frontdoor, check_mirror

    fd = report["frontdoor"] = check_frontdoor.collect(cfg, units, states)  # None: no [frontdoor]
    mr = report["mirror"] = check_mirror.collect(cfg)  # None: no [mirror] url
    parts = [p for p in (fd, mr) if p]
    errors = sum(1 for f in findings if f.is_error) + report["hooks"]["errors"]
    errors += sum(1 for d in report["directories"] if not d["ok"]) + sum(p["errors"] for p in parts)
    report["errors"] = errors + (0 if report["schedule"]["ok"] else 1)
    report["warnings"] = sum(1 for f in findings if not f.is_error) + sum(p["warnings"] for p in parts)
    report["ok"] = report["errors"] == 0 and units is not None
    return report


def _gpu_line(g: dict[str, Any]) -> str:
    """The GPU facts in one line: driver, CUDA and each GPU, or why they could not be read."""
    sim = " (SIMULATED)" if g.get("simulated") else ""
    names = ", ".join(
        f"GPU {known(x.get('index'))} {known(x.get('name'))} sm_{known(x.get('compute_capability')).replace('.', '')}"
        for x in g.get("gpus") or []
    )
    versions = [
        f"{what} {g[key]}"
        for what, key in (("driver", "driver_version"), ("CUDA", "cuda_version"))
        if g.get(key)
    ]
    if g.get("error") and not names and not versions:  # nothing was read: say why, not "None"
        return f"GPUs{sim}  UNREADABLE: {g['error']}"
    facts = ", ".join(versions or ["driver and CUDA version unknown"])
    return f"GPUs{sim}  {facts}: {names or 'none'}" + (f"  ERROR: {g['error']}" if g.get("error") else "")


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
    for d in r.get("directories") or []:
        state = "ok" if d["ok"] else f"ERROR: {d['error']}"
        lines.append(f"{d['setting']:<9} {d['path']}: {state}")
    from gpushift.cli import check_frontdoor, check_mirror

    lines += check_mirror.render(r.get("mirror"))
    if r.get("systemd_error"):
        lines.append(f"systemd   UNREACHABLE: {r['systemd_error']}")
    lines.append(_gpu_line(r.get("gpu") or {}))
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
    h = r.get("hooks") or {}
    if h.get("hooks"):
        lines.append(f"\nhooks (run as {h['user']})")
        for x in h["hooks"]:
            state = "ok" if x["ok"] else f"ERROR: {x['error']}"
            lines.append(f"  {x['event']}: {x['program']}: {state}")
    lines += check_frontdoor.render(r.get("frontdoor"))
    lines.append(f"\n{r.get('errors', 0)} error(s), {r.get('warnings', 0)} warning(s)")
    return "\n".join(lines)


@click.command(short_help="Check config, units and GPUs before a switch.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object (stable keys).")
@click.pass_context
def check(ctx: click.Context, as_json: bool) -> None:
    """Check config, schedule, units and GPU facts before any switch (the preflight doctor).

    Reports each finding as ERROR (a switch to that backend is refused) or warning (it runs, and the
    warning is logged and recorded in the ledger): FP8 or BF16 on GPUs without them, more
    tensor-parallel ranks than GPUs, --split-mode none on several GPUs, missing model files, ECC
    errors, an unpinned version, port clashes, unit settings that let processes outlive a stop,
    a hook program ([hooks]) that is missing or not executable by the hooks' user, a state_dir or
    runtime_dir that is not a usable directory, with [frontdoor]: its ports, each backend's
    model names against its /v1/models, and gpushift-frontdoor.socket's ListenStream= against
    [frontdoor] listen, and with [mirror]: whether the central database is reachable within
    connect_timeout_s, and its schema version (not reachable is a warning: the mirror never
    holds up a switch).
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

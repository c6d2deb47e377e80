"""``gpushift ledger export --format markdown``: the per-machine deployment README.

Per backend its current launch command and versions and the history of changes (what changed,
when, who, why); then the latest switches.  The ledger is read once, oldest first and streamed
(:class:`_Scan` keeps per backend only what the README shows: its current and last launch, and
its history as the README's lines, not as records), then each part is written by its
own function.  Re-exported by ``reports.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from gpushift.ledger.diff import describe_change, diff_records, is_launch, launch_argv, launch_info, sub
from gpushift.ledger.reader import LedgerReader
from gpushift.ledger.text import command_line, for_terminal, md, short, size, stamp
from gpushift.values import SwitchRecord

if TYPE_CHECKING:
    from gpushift.config.schema import Config


@dataclass
class _Scan:
    """What the README needs from the whole ledger, gathered in one pass, oldest first."""

    recent: int
    #: Per backend its launches that changed something, as the README's lines (a record is not kept).
    history: dict[str, list[list[str]]] = field(default_factory=dict)
    last_launch: dict[str, SwitchRecord] = field(default_factory=dict)
    current: dict[str, SwitchRecord] = field(default_factory=dict)
    unchanged: dict[str, int] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    host: dict[str, Any] = field(default_factory=dict)  # from the newest record that described its host
    gpu_facts: dict[str, Any] = field(default_factory=dict)  # likewise for the GPUs
    recent_rows: list[SwitchRecord] = field(default_factory=list)
    total: int = 0

    def read(self, records: Iterable[SwitchRecord]) -> _Scan:
        for rec in map(for_terminal, records):  # oldest first, streamed: 100,000 rows are fine
            self.add(rec)
        return self

    def add(self, rec: SwitchRecord) -> None:
        self.total += 1
        if sub(launch_info(rec), "host"):
            self.host = sub(launch_info(rec), "host")
        if rec.gpu_facts:
            self.gpu_facts = rec.gpu_facts
        self.recent_rows.append(rec)
        if len(self.recent_rows) > self.recent:
            self.recent_rows.pop(0)
        b = rec.to_backend
        if not is_launch(rec, b):
            return
        self.attempts[b] = self.attempts.get(b, 0) + 1
        prev = self.last_launch.get(b)
        changes = diff_records(prev, rec) if prev else None
        if prev is None or changes or rec.outcome != "ok":
            self.history.setdefault(b, []).append(_md_change(rec, changes))
        else:
            self.unchanged[b] = self.unchanged.get(b, 0) + 1
        self.last_launch[b] = rec
        if rec.outcome == "ok":
            self.current[b] = rec


def export_markdown(led: LedgerReader, config: Config | None = None, recent: int = 20) -> str:
    """The per-machine deployment README: per backend its current launch command and versions, and
    the history of changes (what changed, when, who, why); then the latest switches."""
    scan = _Scan(recent).read(led.iter_all())
    out = _md_top(led, scan)
    backend_names = list(dict.fromkeys((list(config.backends) if config else []) + sorted(scan.attempts)))
    for b in backend_names:
        out += _md_backend(b, scan, config)
    out += _md_latest(scan.recent_rows, recent)
    return "\n".join(out)


def _md_top(led: LedgerReader, scan: _Scan) -> list[str]:
    """The title, where it comes from, the host and its GPUs, and the records still spooled."""
    from gpushift import __version__

    host = scan.host
    hostname = (host or {}).get("hostname") or _hostname()
    out: list[str] = [f"# Deployment record: {hostname}", ""]
    out.append(
        f"Written by `gpushift ledger export` (gpushift {__version__}) on {stamp(datetime.now(timezone.utc))} "
        f"from `{led.db_path}`: {scan.total} switch(es) recorded. Regenerate it rather than editing it."
    )
    out.append("")
    if scan.total:
        gf = scan.gpu_facts
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
    return out


def _md_backend(b: str, scan: _Scan, config: Config | None) -> list[str]:
    """One backend's section: its unit, its current launch, the history of its changes."""
    out = [f"## Backend `{b}`", ""]
    if config is not None and b in config.backends:
        bc = config.backends[b]
        out.append(f"Unit `{bc.unit}`, health `{bc.health_url}`.")
        out.append("")
    cur = scan.current.get(b)
    if cur is None and b not in scan.attempts:
        out.append("Never launched by gpushift yet.")
        out.append("")
        return out
    if cur is None:
        out.append("No successful launch recorded yet.")
        out.append("")
    else:
        out += _md_current(cur)
    out.append("### History of changes (newest first)")
    out.append("")
    for lines in reversed(scan.history.get(b, [])):
        out += lines
    n = scan.unchanged.get(b, 0)
    if n:
        out.append(f"- … and {n} more launch(es) with no change.")
    out.append("")
    return out


def _md_change(rec: SwitchRecord, changes: list[dict[str, Any]] | None) -> list[str]:
    """One entry of a backend's history of changes: the launch, and what changed (None: the first)."""
    who = md(rec.requested_by) + (f" (uid {rec.uid})" if rec.uid is not None else "")
    out = [
        f"- **#{rec.id}** {stamp(rec.started_at)}, {who}, {rec.trigger}: “{md(rec.reason)}” → {rec.outcome}"
    ]
    if rec.outcome != "ok" and rec.message:
        out.append(f"  - {md(rec.message)}")
    if changes is None:
        out.append("  - first launch recorded")
    for c in changes or []:
        out.append(f"  - {md(describe_change(c, width=0))}")
    return out


def _md_latest(rows: list[SwitchRecord], recent: int) -> list[str]:
    """The table of the latest switches, newest first."""
    out = [f"## Latest switches (newest first, at most {recent})", ""]
    out.append("| # | Started | From → to | Trigger | Who | Why | Outcome |")
    out.append("|---|---|---|---|---|---|---|")
    for rec in reversed(rows):
        out.append(
            f"| {rec.id} | {stamp(rec.started_at)} | {md(rec.from_backend)} → {md(rec.to_backend)} | "
            f"{md(rec.trigger)} | {md(rec.requested_by)} | {md(rec.reason)} | {md(rec.outcome)} |"
        )
    out.append("")
    return out


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

"""L5: ``gpushift ledger`` — read the deployment ledger (no daemon needed).

The main CLI adds this group with ``main.add_command(ledger)``.  Every command opens the database
read-only (the daemon may be writing; WAL lets both proceed) and also shows records still waiting
in the pending spool.

Start-up time matters (``gpushift ledger --limit 20`` ≤ 0.2 s on 100,000 rows, bench/ledger_list.py):
this module imports only click and the standard library at the top; the config and the SQLite
adapter are imported inside the commands.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import click

from .. import cmdline
from ..redact import redact_argv

if TYPE_CHECKING:
    from ..config import Config
    from ..ledger import SqliteLedger
    from ..model import SwitchRecord

OUTCOMES = ("pending", "ok", "failed", "rolled_back", "refused", "interrupted", "cancelled")

#: Outcomes whose row did not launch the target (nothing to compare in ``diff``).
_NOT_A_LAUNCH = ("refused", "pending")


# --------------------------------------------------------------------------- plumbing


class _Fail(Exception):
    """A one-line error for the user, with the exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _open(ctx: click.Context) -> tuple[Config, SqliteLedger]:
    from ..config import load
    from ..ledger import SqliteLedger

    obj = ctx.obj if isinstance(ctx.obj, dict) else {}
    config = load(obj.get("config_path"))
    return config, SqliteLedger.open_readonly(config.ledger_path, spool_dir=config.daemon.runtime_dir)


def _run(ctx: click.Context, fn: Callable[[], None]) -> None:
    """Run a command body; expected failures become one line on stderr and their exit code."""
    from ..errors import GpushiftError

    try:
        fn()
    except GpushiftError as e:
        click.echo(f"gpushift ledger: {e}", err=True)
        ctx.exit(e.code)
    except _Fail as e:
        click.echo(f"gpushift ledger: {e}", err=True)
        ctx.exit(e.code)


def _ledger_error_code() -> int:
    from ..errors import LedgerError

    return LedgerError.code


def _degraded_note(led: SqliteLedger) -> None:
    h = led.health()
    if h["pending"]:
        click.echo(
            f"ledger: degraded ({h['pending']} pending in {led.spool_dir}; the daemon writes them when the "
            f"database accepts writes again)",
            err=True,
        )


# --------------------------------------------------------------------------- formatting helpers


def _local(dt: datetime | None, seconds: bool = False) -> str:
    if dt is None:
        return "-"
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone().strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")


def _stamp(dt: datetime | None) -> str:
    """Local time with its offset, for files that travel (``2025-03-02 08:00 +0800``)."""
    if dt is None:
        return "-"
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone().strftime("%Y-%m-%d %H:%M %z")


def _duration(rec: SwitchRecord) -> str:
    if rec.finished_at is None or rec.started_at is None:
        return "-"
    s = (rec.finished_at - rec.started_at).total_seconds()
    return f"{s:.1f}s" if s < 600 else f"{s / 60:.0f}m"


def _size(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "?"
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:.2f} {unit}"
    return f"{n} B"


def _short(h: Any, n: int = 12) -> str:
    return str(h)[:n] if h else "-"


def command_line(argv: Sequence[str], wrap: bool = False) -> str:
    """The command a person reads: credentials masked, shell-quoted."""
    return cmdline.join(redact_argv(argv), wrap)


def _sim(rec: SwitchRecord) -> str:
    return " SIMULATED" if rec.gpu_facts.get("simulated") else ""


def _launch(rec: SwitchRecord) -> dict[str, Any]:
    li = rec.extra.get("launch")
    return li if isinstance(li, dict) else {}


def _sub(d: Mapping[str, Any], key: str) -> dict[str, Any]:
    v = d.get(key)
    return v if isinstance(v, dict) else {}


def _argv(rec: SwitchRecord) -> list[str]:
    return list(rec.argv_running or rec.argv_configured)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    rows = [list(r) for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    # The last column (the reason) may be long: it is not padded.
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    return "\n".join(fmt.format(*r).rstrip() for r in [list(headers)] + rows)


def _one_line(s: Any, width: int = 0) -> str:
    text = " ".join(str(s or "").split())
    if width and len(text) > width:
        text = text[: width - 1] + "…"
    return text


# --------------------------------------------------------------------------- --since


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``--since``: an ISO date/time (local time unless it has an offset), ``today``,
    ``yesterday``, or an age such as ``30m``, ``12h``, ``7d``, ``2w``.  Returns an aware instant."""
    now = now or datetime.now(timezone.utc)
    t = text.strip().lower()
    m = re.fullmatch(r"(\d+)\s*([mhdw])", t)
    if m:
        n = int(m.group(1))
        unit = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}[m.group(2)]
        return now - timedelta(**{unit: n})
    if t in ("today", "yesterday"):
        local_midnight = now.astimezone().replace(hour=0, minute=0, second=0, microsecond=0)
        return local_midnight - timedelta(days=1 if t == "yesterday" else 0)
    s = text.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: expected a date (2025-03-01), a date and time (2025-03-01T08:00), "
            f"'today', 'yesterday' or an age (30m, 12h, 7d, 2w)",
            param_hint="--since",
        ) from None
    return dt if dt.tzinfo is not None else dt.astimezone()  # naive: the user's local time


# --------------------------------------------------------------------------- diff


def _flag_text(values: list[str | None]) -> str | None:
    shown = [v for v in values if v is not None]
    if not shown:
        return None
    return ", ".join(v for v in shown if v is not None)


def launch_facts(rec: SwitchRecord) -> dict[str, Any]:
    """What ``diff`` compares, gathered from the record and its launch info."""
    li = _launch(rec)
    unit = _sub(li, "unit")
    gf = rec.gpu_facts or {}
    models: dict[str, dict[str, Any]] = {}
    for m in li.get("models") or []:
        if isinstance(m, dict):
            models[str(m.get("resolved") or m.get("path"))] = m
    drop_ins: dict[str, Any] = {}
    for d in unit.get("drop_ins") or []:
        if isinstance(d, dict):
            drop_ins[str(d.get("path"))] = d.get("sha256")
    gpus = {}
    for g in gf.get("gpus") or []:
        if isinstance(g, dict):
            gpus[str(g.get("index"))] = f"{g.get('name')} ({g.get('uuid')}, cc {g.get('compute_capability')})"
    host = _sub(li, "host")
    return {
        "argv": _argv(rec),
        "env": dict(unit.get("environment") or {}),
        "versions": {
            "backend": rec.backend_version,
            "gpushift": rec.gpushift_version or None,
            "driver": gf.get("driver_version"),
            "cuda": gf.get("cuda_version"),
        },
        "unit_path": rec.unit_path or unit.get("path"),
        "unit_sha256": rec.unit_sha256 or unit.get("sha256"),
        "drop_ins": drop_ins,
        "user": unit.get("user"),
        "working_directory": unit.get("working_directory"),
        "models": models,
        "gpus": gpus,
        "simulated": bool(gf.get("simulated")),
        "host": {"hostname": host.get("hostname"), "kernel": host.get("kernel")},
    }


def diff_records(old: SwitchRecord, new: SwitchRecord) -> list[dict[str, Any]]:
    """What changed from launch ``old`` to launch ``new``: a list of
    ``{"area", "change", "name", "old", "new"}`` (area: program, argv, flag, env, version, unit,
    drop_in, user, working_directory, model, gpu, host)."""
    a, b = launch_facts(old), launch_facts(new)
    out: list[dict[str, Any]] = []

    def add(area: str, change: str, name: str, o: Any, n: Any) -> None:
        out.append({"area": area, "change": change, "name": name, "old": o, "new": n})

    ca, cb = cmdline.parse(redact_argv(a["argv"])), cmdline.parse(redact_argv(b["argv"]))
    pa, posa, fa = ca.program, list(ca.positional), ca.flags()
    pb, posb, fb = cb.program, list(cb.positional), cb.flags()
    if pa != pb:
        add("program", "changed", "program", pa, pb)
    if posa != posb:
        add("argv", "changed", "positional arguments", posa, posb)
    for name in sorted(set(fa) | set(fb)):
        if name not in fa:
            add("flag", "added", name, None, _flag_text(fb[name]))
        elif name not in fb:
            add("flag", "removed", name, _flag_text(fa[name]), None)
        elif fa[name] != fb[name]:
            add("flag", "changed", name, _flag_text(fa[name]), _flag_text(fb[name]))
    _diff_map(add, "env", a["env"], b["env"])
    for k in ("backend", "gpushift", "driver", "cuda"):
        if a["versions"][k] != b["versions"][k]:
            add("version", "changed", k, a["versions"][k], b["versions"][k])
    if a["unit_path"] != b["unit_path"]:
        add("unit", "changed", "path", a["unit_path"], b["unit_path"])
    if a["unit_sha256"] != b["unit_sha256"]:
        add("unit", "changed", "sha256", a["unit_sha256"], b["unit_sha256"])
    _diff_map(add, "drop_in", a["drop_ins"], b["drop_ins"])
    for k in ("user", "working_directory"):
        if a[k] != b[k]:
            add(k, "changed", k, a[k], b[k])
    for path in sorted(set(a["models"]) | set(b["models"])):
        ma, mb = a["models"].get(path), b["models"].get(path)
        if ma is None:
            add("model", "added", path, None, _model_text(mb))
        elif mb is None:
            add("model", "removed", path, _model_text(ma), None)
        else:
            for k in ("fingerprint", "size_bytes", "mtime", "kind"):
                if ma.get(k) != mb.get(k):
                    add("model", "changed", f"{path} {k}", ma.get(k), mb.get(k))
    _diff_map(add, "gpu", a["gpus"], b["gpus"])
    if a["simulated"] != b["simulated"]:
        add("gpu", "changed", "simulated", a["simulated"], b["simulated"])
    for k in ("hostname", "kernel"):
        if a["host"][k] != b["host"][k] and a["host"][k] and b["host"][k]:
            add("host", "changed", k, a["host"][k], b["host"][k])
    return out


def _diff_map(add: Callable[..., None], area: str, a: Mapping[str, Any], b: Mapping[str, Any]) -> None:
    for k in sorted(set(a) | set(b)):
        if k not in a:
            add(area, "added", k, None, b[k])
        elif k not in b:
            add(area, "removed", k, a[k], None)
        elif a[k] != b[k]:
            add(area, "changed", k, a[k], b[k])


def _model_text(m: Mapping[str, Any] | None) -> str:
    if not m:
        return "-"
    if m.get("error"):
        return f"({m['error']})"
    return f"{_size(m.get('size_bytes'))}, {_short(m.get('fingerprint'), 20)}"


def describe_change(c: Mapping[str, Any], width: int = 15) -> str:
    """One change as a line for a person (``width`` pads the label into a column)."""
    area, change, name, o, n = c["area"], c["change"], c["name"], c["old"], c["new"]
    if area in ("unit", "drop_in") and ("sha256" in name or area == "drop_in"):
        o, n = _short(o), _short(n)
    if area == "model" and name.endswith(" fingerprint"):
        o, n = _short(o, 20), _short(n, 20)
    if area == "model" and name.endswith(" size_bytes"):
        o, n = _size(o), _size(n)
    label = {
        "flag": f"flag {change}",
        "env": f"env {change}",
        "version": "version",
        "drop_in": f"drop-in {change}",
        "model": f"model {change}" if change != "changed" else "model",
    }.get(area, area.replace("_", " "))
    if change == "added":
        return f"{label:<{width}} {name}" + (f" {n}" if n is not None else "")
    if change == "removed":
        return f"{label:<{width}} {name}" + (f" {o}" if o is not None else "")
    return f"{label:<{width}} {name}: {o if o is not None else '-'} → {n if n is not None else '-'}"


def _is_launch(rec: SwitchRecord, backend: str) -> bool:
    return rec.to_backend == backend and rec.outcome not in _NOT_A_LAUNCH and bool(_argv(rec))


def _launches(led: SqliteLedger, backend: str, limit: int) -> list[SwitchRecord]:
    """The newest ``limit`` launches of ``backend``, newest first."""
    out: list[SwitchRecord] = []
    for rec in led.iter_to(backend):
        if _is_launch(rec, backend):
            out.append(rec)
            if len(out) >= limit:
                break
    return out


# --------------------------------------------------------------------------- the commands


@click.group(name="ledger", invoke_without_command=True)
@click.option(
    "--limit", "-n", type=click.IntRange(min=1), default=20, show_default=True, help="Rows to show."
)
@click.option("--backend", metavar="NAME", help="Only switches to or away from this backend.")
@click.option(
    "--since", metavar="DATE", help="Only switches started since: 2025-03-01, 2025-03-01T08:00, 7d, 12h."
)
@click.option("--outcome", type=click.Choice(OUTCOMES), help="Only switches that ended so.")
@click.option("--json", "as_json", is_flag=True, help="A JSON list, newest first.")
@click.pass_context
def ledger(
    ctx: click.Context, limit: int, backend: str | None, since: str | None, outcome: str | None, as_json: bool
) -> None:
    """The deployment ledger: every switch and launch (newest first).

    Reads the database directly; the daemon need not run.
    """
    if ctx.invoked_subcommand is not None:
        return
    since_dt = parse_since(since) if since else None

    def body() -> None:
        _config, led = _open(ctx)
        rows = led.list(limit=limit, backend=backend, since=since_dt, outcome=outcome)
        pending_ids = {r.id for r in led.pending_records()}
        if as_json:
            items = []
            for r in rows:
                d = r.to_dict()
                if r.id in pending_ids:
                    d["pending_write"] = True
                items.append(d)
            click.echo(json.dumps(items, indent=2, ensure_ascii=False, default=str))
            return
        _degraded_note(led)
        if not rows:
            click.echo("no switches recorded" + (" that match" if backend or since or outcome else " yet"))
            return
        table = []
        for r in rows:
            rid = f"{r.id}*" if r.id in pending_ids else str(r.id)
            table.append(
                [
                    rid,
                    _local(r.started_at),
                    f"{r.from_backend or '-'} → {r.to_backend}",
                    r.outcome,
                    _duration(r),
                    r.trigger,
                    r.requested_by,
                    _one_line(r.backend_version, 24) or "-",
                    _one_line(r.reason, 60) or "-",
                ]
            )
        click.echo(
            _table(
                ["ID", "STARTED", "SWITCH", "OUTCOME", "TOOK", "TRIGGER", "BY", "VERSION", "REASON"], table
            )
        )
        if pending_ids & {r.id for r in rows}:
            click.echo("* not yet in the database (pending in the spool)")

    _run(ctx, body)


@ledger.command("show")
@click.argument("row_id", metavar="ID", type=int)
@click.option("--json", "as_json", is_flag=True, help="The full record as JSON.")
@click.pass_context
def show(ctx: click.Context, row_id: int, as_json: bool) -> None:
    """Everything about one switch and the launch it made."""

    def body() -> None:
        _config, led = _open(ctx)
        rec = led.get(row_id)
        if rec is None:
            raise _Fail(f"no switch with id {row_id} in the ledger", _ledger_error_code())
        if as_json:
            click.echo(json.dumps(rec.to_dict(), indent=2, ensure_ascii=False, default=str))
        else:
            click.echo(format_record(rec))

    _run(ctx, body)


@ledger.command("diff")
@click.argument("ids", metavar="[ID1 ID2]", nargs=-1, type=int)
@click.option("--json", "as_json", is_flag=True, help="Changes as JSON.")
@click.pass_context
def diff(ctx: click.Context, ids: tuple[int, ...], as_json: bool) -> None:
    """What changed between two launches of the same backend.

    Without IDs: the last launch of each backend against its previous one.
    """
    if len(ids) not in (0, 2):
        raise click.UsageError("give two ids (older, newer), or none")

    def body() -> None:
        config, led = _open(ctx)
        if ids:
            a, b = led.get(ids[0]), led.get(ids[1])
            for i, r in zip(ids, (a, b), strict=True):
                if r is None:
                    raise _Fail(f"no switch with id {i} in the ledger", _ledger_error_code())
            assert a is not None and b is not None
            if a.to_backend != b.to_backend:
                raise _Fail(
                    f"switches {a.id} and {b.id} launched different backends ({a.to_backend}, {b.to_backend}); "
                    f"diff compares launches of one backend",
                    _ledger_error_code(),
                )
            result: Any = _diff_item(a.to_backend, a, b)
            items = [result]
        else:
            names = list(dict.fromkeys(list(config.backends) + led.backends()))
            items = []
            for name in names:
                launches = _launches(led, name, 2)
                if not launches:
                    continue
                prev = launches[1] if len(launches) > 1 else None
                items.append(_diff_item(name, prev, launches[0]))
            result = items
        if as_json:
            click.echo(json.dumps(result, indent=2, ensure_ascii=False, default=str))
            return
        if not items:
            click.echo("no launches recorded yet")
        for item in items:
            click.echo(_format_diff_item(item))

    _run(ctx, body)


def _diff_item(backend: str, old: SwitchRecord | None, new: SwitchRecord) -> dict[str, Any]:
    item: dict[str, Any] = {
        "backend": backend,
        "from_id": old.id if old else None,
        "to_id": new.id,
        "from_started_at": old.started_at.isoformat() if old else None,
        "to_started_at": new.started_at.isoformat(),
        "simulated": bool(new.gpu_facts.get("simulated") or (old and old.gpu_facts.get("simulated"))),
        "changes": diff_records(old, new) if old else [],
    }
    if old is None:
        item["note"] = "only one launch recorded"
    return item


def _format_diff_item(item: Mapping[str, Any]) -> str:
    sim = " SIMULATED" if item["simulated"] else ""
    if item["from_id"] is None:
        return f"{item['backend']}: only one launch recorded (#{item['to_id']})"
    head = f"{item['backend']}: #{item['from_id']} → #{item['to_id']}"
    if not item["changes"]:
        return head + ": no change"
    lines = [head]
    for c in item["changes"]:
        line = "  " + describe_change(c)
        if c["area"] == "gpu":
            line += sim
        lines.append(line)
    return "\n".join(lines)


@ledger.command("export")
@click.option(
    "--format", "fmt", type=click.Choice(["markdown", "jsonl"]), default="markdown", show_default=True
)
@click.pass_context
def export(ctx: click.Context, fmt: str) -> None:
    """The whole ledger: a per-machine deployment README (markdown) or one JSON record per line
    (jsonl, oldest first)."""

    def body() -> None:
        config, led = _open(ctx)
        if fmt == "jsonl":
            out = sys.stdout
            for rec in led.iter_all():
                out.write(json.dumps(rec.to_dict(), ensure_ascii=False, default=str) + "\n")
            for rec in led.pending_records():
                d = rec.to_dict()
                d["pending_write"] = True
                out.write(json.dumps(d, ensure_ascii=False, default=str) + "\n")
            return
        click.echo(export_markdown(led, config), nl=False)

    _run(ctx, body)


@ledger.command("verify")
@click.option("--json", "as_json", is_flag=True, help="The result as JSON.")
@click.pass_context
def verify(ctx: click.Context, as_json: bool) -> None:
    """Check the hash chain and the head file; name the first bad row."""

    def body() -> None:
        _config, led = _open(ctx)
        res = led.verify()
        if as_json:
            click.echo(json.dumps(res.to_dict(), indent=2))
        elif res.ok:
            click.echo(res.describe())
        if not res.ok:
            raise _Fail(res.describe(), _ledger_error_code())

    _run(ctx, body)


# --------------------------------------------------------------------------- show


def format_record(rec: SwitchRecord) -> str:
    """``ledger show``: every field of one record, grouped, for a person."""
    lines: list[str] = []

    def kv(key: str, value: Any) -> None:
        lines.append(f"  {key:<20} {value if value not in (None, '') else '-'}")

    sim = _sim(rec)
    lines.append(f"Switch {rec.id}" + (f"  (ticket {rec.ticket})" if rec.ticket else ""))
    kv("outcome", rec.outcome)
    kv("from → to", f"{rec.from_backend or '-'} → {rec.to_backend}")
    kv("started", f"{_local(rec.started_at, True)} local ({rec.started_at.isoformat()})")
    kv("finished", f"{_local(rec.finished_at, True)} (took {_duration(rec)})" if rec.finished_at else None)
    who = rec.requested_by + (f" (uid {rec.uid})" if rec.uid is not None else "")
    kv("trigger", f"{rec.trigger}, by {who}")
    kv("reason", rec.reason)
    kv("failed phase", rec.failed_phase)
    kv("message", rec.message)
    kv("systemd result", rec.systemd_result)

    li = _launch(rec)
    unit = _sub(li, "unit")
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
        if m.get("error"):
            kv(f"model {m.get('flag')}", f"{m.get('path')}  ({m['error']})")
        else:
            kv(
                f"model {m.get('flag')}",
                f"{m.get('resolved') or m.get('path')}  {_size(m.get('size_bytes'))}  mtime {m.get('mtime')}  "
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
    host = _sub(li, "host")
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
                f"{_size((g.get('total_mib') or 0) * (1 << 20))}  {ecc_text}{sim}",
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
    others = {k: v for k, v in rec.extra.items() if k not in ("launch", "launch_error")}
    if others:
        lines.append("Other")
        for k, v in sorted(others.items()):
            kv(k, json.dumps(v, ensure_ascii=False, default=str))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- markdown export


def _md(text: Any) -> str:
    """Text safe inside a markdown table cell or list item."""
    return _one_line(text).replace("|", "\\|").replace("`", "'") or "-"


def export_markdown(led: SqliteLedger, config: Config | None = None, recent: int = 20) -> str:
    """The per-machine deployment README: per backend its current launch command and versions, and
    the history of changes (what changed, when, who, why); then the latest switches."""
    from .. import __version__

    history: dict[str, list[tuple[SwitchRecord, list[dict[str, Any]] | None]]] = {}
    last_launch: dict[str, SwitchRecord] = {}
    current: dict[str, SwitchRecord] = {}
    unchanged: dict[str, int] = {}
    attempts: dict[str, int] = {}
    host: dict[str, Any] = {}  # from the newest record that described its host
    gpu_facts: dict[str, Any] = {}  # likewise for the GPUs
    recent_rows: list[SwitchRecord] = []
    total = 0
    for rec in led.iter_all():  # oldest first, streamed: 100,000 rows are fine
        total += 1
        if _sub(_launch(rec), "host"):
            host = _sub(_launch(rec), "host")
        if rec.gpu_facts:
            gpu_facts = rec.gpu_facts
        recent_rows.append(rec)
        if len(recent_rows) > recent:
            recent_rows.pop(0)
        b = rec.to_backend
        if not _is_launch(rec, b):
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
        f"Written by `gpushift ledger export` (gpushift {__version__}) on {_stamp(datetime.now(timezone.utc))} "
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
            who = _md(rec.requested_by) + (f" (uid {rec.uid})" if rec.uid is not None else "")
            out.append(
                f"- **#{rec.id}** {_stamp(rec.started_at)}, {who}, {rec.trigger}: "
                f"“{_md(rec.reason)}” → {rec.outcome}"
            )
            if rec.outcome != "ok" and rec.message:
                out.append(f"  - {_md(rec.message)}")
            if changes is None:
                out.append("  - first launch recorded")
            for c in changes or []:
                out.append(f"  - {_md(describe_change(c, width=0))}")
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
            f"| {rec.id} | {_stamp(rec.started_at)} | {_md(rec.from_backend)} → {_md(rec.to_backend)} | "
            f"{_md(rec.trigger)} | {_md(rec.requested_by)} | {_md(rec.reason)} | {_md(rec.outcome)} |"
        )
    out.append("")
    return "\n".join(out)


def _md_current(rec: SwitchRecord) -> list[str]:
    li = _launch(rec)
    unit = _sub(li, "unit")
    gf = rec.gpu_facts or {}
    sim = " (SIMULATED GPUs)" if gf.get("simulated") else ""
    out = [
        f"Current launch: **#{rec.id}**, {_stamp(rec.started_at)}, by {_md(rec.requested_by)}: “{_md(rec.reason)}”.",
        "",
    ]
    out.append("```sh")
    out.append(command_line(_argv(rec), wrap=True))
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
        out.append(f"- Unit file: `{path or '?'}` (sha256 {_short(sha, 16)})")
    for d in unit.get("drop_ins") or []:
        out.append(f"- Drop-in: `{d.get('path')}` (sha256 {_short(d.get('sha256'), 16)})")
    if unit.get("user") or unit.get("working_directory"):
        out.append(
            f"- User {unit.get('user') or '-'}, working directory `{unit.get('working_directory') or '-'}`"
        )
    env = unit.get("environment") or {}
    if env:
        out.append("- Environment: " + ", ".join(f"`{k}={v}`" for k, v in sorted(env.items())))
    for m in li.get("models") or []:
        if m.get("error"):
            out.append(f"- Model `{m.get('path')}` ({m.get('flag')}): {m['error']}")
        else:
            out.append(
                f"- Model `{m.get('resolved') or m.get('path')}` ({m.get('flag')}): {_size(m.get('size_bytes'))}, "
                f"modified {m.get('mtime')}, fingerprint `{_short(m.get('fingerprint'), 24)}`"
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


if __name__ == "__main__":  # python -m gpushift.cli.ledger (before the main CLI wires it in)
    ledger(obj={})

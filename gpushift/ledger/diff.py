"""What changed between two launches of a backend (``gpushift ledger diff``, and the history of
changes in the markdown export).

A launch is a switch to a backend that started it (not refused, not left pending) with a command
line.  Its facts come from the record and the launch info the switcher stored with it
(``extra["launch"]``: unit file, drop-ins, environment, model files, host).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpushift.backends import cmdline
from gpushift.errors import LedgerError
from gpushift.ledger.reader import LedgerReader
from gpushift.ledger.text import short, size
from gpushift.safetext import terminal
from gpushift.safetext.redact import redact_argv
from gpushift.values import SwitchRecord

#: Outcomes whose row did not launch the target (nothing to compare in ``diff``).
_NOT_A_LAUNCH = ("refused", "pending")


def launch_info(rec: SwitchRecord) -> dict[str, Any]:
    """The launch info stored with the record (empty when it has none)."""
    li = rec.extra.get("launch")
    return li if isinstance(li, dict) else {}


def sub(d: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``d[key]`` when it is an object, else empty."""
    v = d.get(key)
    return v if isinstance(v, dict) else {}


def launch_argv(rec: SwitchRecord) -> list[str]:
    """The command line of the launch: as it ran, or as configured when it was not read."""
    return list(rec.argv_running or rec.argv_configured)


def is_launch(rec: SwitchRecord, backend: str) -> bool:
    return rec.to_backend == backend and rec.outcome not in _NOT_A_LAUNCH and bool(launch_argv(rec))


def launch_facts(rec: SwitchRecord) -> dict[str, Any]:
    """What ``diff`` compares, gathered from the record and its launch info."""
    li = launch_info(rec)
    unit = sub(li, "unit")
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
    host = sub(li, "host")
    return {
        "argv": launch_argv(rec),
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
    drop_in, user, working_directory, model, gpu, host, instance)."""
    a, b = launch_facts(old), launch_facts(new)
    out: list[dict[str, Any]] = []

    def add(area: str, change: str, name: str, o: Any, n: Any) -> None:
        out.append({"area": area, "change": change, "name": name, "old": o, "new": n})

    # Digests, not masks: a changed --api-key shows as changed (its value never does).
    ca, cb = cmdline.parse(redact_argv(a["argv"], "digest")), cmdline.parse(redact_argv(b["argv"], "digest"))
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
    _diff_instances(add, old, new)
    return out


def instances(rec: SwitchRecord) -> dict[str, dict[str, Any]]:
    """The instances of a launch of a backend of several (``extra.instances``), by unit."""
    v = rec.extra.get("instances")
    return {str(e.get("unit")): e for e in v if isinstance(e, dict)} if isinstance(v, list) else {}


def _instance_text(e: Mapping[str, Any]) -> str:
    gpus = e.get("gpus")
    shown = ",".join(map(str, gpus)) if isinstance(gpus, list) else str(gpus)
    return f"GPU {shown}, port {e.get('port')}, {e.get('outcome')}"


def _diff_instances(add: Callable[..., None], old: SwitchRecord, new: SwitchRecord) -> None:
    """Instance by instance (a backend of several, issue 23): which came or went, and each one's
    GPUs, port, outcome and command line as it ran (secrets as digests)."""
    ia, ib = instances(old), instances(new)
    for unit in sorted(set(ia) | set(ib)):
        a, b = ia.get(unit), ib.get(unit)
        if a is None or b is None:
            add("instance", "added" if a is None else "removed", unit, a and _instance_text(a),
                b and _instance_text(b))  # fmt: skip
            continue
        for k in ("gpus", "port", "outcome"):
            if a.get(k) != b.get(k):
                add("instance", "changed", f"{unit} {k}", a.get(k), b.get(k))
        argv = [" ".join(redact_argv([str(x) for x in e.get("argv") or []], "digest")) for e in (a, b)]
        if argv[0] != argv[1]:
            add("instance", "changed", f"{unit} argv", argv[0] or None, argv[1] or None)


def _flag_text(values: list[str | None]) -> str | None:
    shown = [v for v in values if v is not None]
    if not shown:
        return None
    return ", ".join(v for v in shown if v is not None)


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
    if m.get("error") or m.get("skipped"):
        return f"({m.get('error') or m.get('skipped')})"
    return f"{size(m.get('size_bytes'))}, {short(m.get('fingerprint'), 20)}"


def describe_change(c: Mapping[str, Any], width: int = 15) -> str:
    """One change as a line for a person (``width`` pads the label into a column)."""
    area, change, name, o, n = c["area"], c["change"], c["name"], c["old"], c["new"]
    if area in ("unit", "drop_in") and ("sha256" in name or area == "drop_in"):
        o, n = short(o), short(n)
    if area == "model" and name.endswith(" fingerprint"):
        o, n = short(o, 20), short(n, 20)
    if area == "model" and name.endswith(" size_bytes"):
        o, n = size(o), size(n)
    label = {
        "flag": f"flag {change}",
        "env": f"env {change}",
        "version": "version",
        "drop_in": f"drop-in {change}",
        "model": f"model {change}" if change != "changed" else "model",
        "instance": f"instance {change}" if change != "changed" else "instance",
    }.get(area, area.replace("_", " "))
    if change == "added":
        return f"{label:<{width}} {name}" + (f" {n}" if n is not None else "")
    if change == "removed":
        return f"{label:<{width}} {name}" + (f" {o}" if o is not None else "")
    return f"{label:<{width}} {name}: {o if o is not None else '-'} → {n if n is not None else '-'}"


# --------------------------------------------------------------------------- `gpushift ledger diff`


def diff_pair(led: LedgerReader, old_id: int, new_id: int) -> dict[str, Any]:
    """Launch ``old_id`` against launch ``new_id`` (one backend's).

    Raises:
        LedgerError: an id is not in the ledger, or the two switches went to different backends.
    """
    a, b = led.get(old_id), led.get(new_id)
    for i, r in ((old_id, a), (new_id, b)):
        if r is None:
            raise LedgerError(f"no switch with id {i} in the ledger")
    assert a is not None and b is not None
    if a.to_backend != b.to_backend:
        raise LedgerError(
            f"switches {a.id} and {b.id} launched different backends ({a.to_backend}, {b.to_backend}); "
            f"diff compares launches of one backend"
        )
    return diff_item(a.to_backend, a, b)


def diff_latest(led: LedgerReader, backends: list[str]) -> list[dict[str, Any]]:
    """Each backend's last launch against its previous one (``backends`` first, then the ledger's)."""
    items = []
    for name in dict.fromkeys(backends + led.backends()):
        launches = last_launches(led, name, 2)
        if launches:
            items.append(diff_item(name, launches[1] if len(launches) > 1 else None, launches[0]))
    return items


def last_launches(led: LedgerReader, backend: str, limit: int) -> list[SwitchRecord]:
    """The newest ``limit`` launches of ``backend``, newest first."""
    out: list[SwitchRecord] = []
    for rec in led.iter_to(backend):
        if is_launch(rec, backend):
            out.append(rec)
            if len(out) >= limit:
                break
    return out


def diff_item(backend: str, old: SwitchRecord | None, new: SwitchRecord) -> dict[str, Any]:
    """The JSON form of one comparison (``old`` None: only one launch recorded)."""
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


def format_diff_item(item: Mapping[str, Any]) -> str:
    """One comparison as text: a head line, then one line per change (every value escaped)."""
    item = terminal.escape_tree(item)
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

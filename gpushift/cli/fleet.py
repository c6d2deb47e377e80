"""``gpushift fleet`` — every host of the fleet, read from the central database (docs/fleet.md).

``status``, ``ledger`` and ``verify`` read only the database ``[mirror] url`` names (with its
password source and deadlines), or ``--url``; no host is contacted and nothing is written.  An
expected failure (the database cannot be reached, no config, no tables yet) is one line on stderr
and the error's exit status (``FleetError``: 12), never a traceback; ``verify`` exits 1 when it finds
a problem.  Each command ends, once its output is out and its connection closed, without the
interpreter's teardown (``output.leave``: freeing the driver's modules costs more than the query).  This module imports click, the standard library and the error classes at the top; the
driver and the fleet package inside the commands (``gpushift --help`` stays fast).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from gpushift.cli.output import leave, say, say_json
from gpushift.cli.params import LIMIT, parse_since
from gpushift.errors import FleetError, GpushiftError
from gpushift.values import Outcome

OUTCOMES = tuple(o.value for o in Outcome)
#: Most rows ``fleet ledger`` prints.
LIST_MAX = 10_000


class _FleetGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GpushiftError as e:
            say(f"gpushift fleet: {e}", err=True)
            ctx.exit(e.code)


@contextmanager
def _connection(ctx: click.Context, url: str | None) -> Iterator[tuple[Any, Any]]:
    """(connection, the [mirror] settings): the config's, or defaults when ``--url`` is given and
    there is no config to read."""
    from gpushift.config.mirror import MirrorConfig
    from gpushift.config.schema import load
    from gpushift.errors import ConfigError
    from gpushift.fleet import db, queries

    obj = ctx.find_root().obj
    try:
        mirror = load(obj.get("config_path") if isinstance(obj, dict) else None).mirror
    except ConfigError:
        if url is None:
            raise
        mirror = MirrorConfig()
    # Reads only: each statement on its own (no transaction to open and end), and no round trips
    # to ask for the schema first: a database without the tables says so at the first statement.
    conn = db.connect(mirror, url, application="gpushift-fleet", autocommit=True)
    try:
        try:
            yield conn, mirror
        except db.DatabaseError as e:
            if e.sqlstate == db.UNDEFINED_TABLE:
                raise FleetError(queries.NO_TABLES) from None
            raise FleetError(
                f"the central database {db.where(url or mirror.url)}: {db.one_line(e)}"
            ) from None
    finally:
        conn.close()


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


URL = click.option(
    "--url",
    metavar="URL",
    help="The central database instead of [mirror] url (postgresql://USER@HOST:PORT/DB).",
)


@click.group(name="fleet", cls=_FleetGroup, short_help="All hosts of the fleet, from one database.")
def fleet() -> None:
    """Every host of the fleet, read from the central database ([mirror], docs/fleet.md).

    No host is contacted: each host's daemon mirrors its ledger and its state there.

    \b
    Examples:
      gpushift fleet status
      gpushift fleet ledger --host gpu-2 --since 1d --outcome failed
      gpushift fleet verify
    """


# --------------------------------------------------------------------------- status


def _host_view(h: dict[str, Any], stale_after_s: float) -> dict[str, Any]:
    st = h["state"]
    age = h["age_s"]
    mirror = st.get("mirror") or {}
    return {
        "host": h["host"],
        "stale": age is None or age > stale_after_s,
        "age_s": round(age, 1) if age is not None else None,
        "updated_at": h["updated_at"],
        "serving": st.get("serving"),
        "mode": st.get("mode"),
        "switching": st.get("switching"),
        "next_switch": st.get("next_switch"),
        "last_switch": st.get("last_switch"),
        "mirror": {
            "lag_rows": mirror.get("lag_rows"),
            "state": mirror.get("state"),
            "problems": mirror.get("problems"),
        },
        "stagger": st.get("stagger"),
        "machine_id": h["machine_id"],
        "gpushift_version": st.get("gpushift_version") or h["gpushift_version"],
        "reports": h["reports"],
    }


def _shared_ids(hosts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_id: dict[str, list[str]] = {}
    for h in hosts:
        if h["machine_id"]:
            by_id.setdefault(h["machine_id"], []).append(h["host"])
    return [{"machine_id": k, "hosts": v} for k, v in sorted(by_id.items()) if len(v) > 1]


@fleet.command("status", short_help="Every host: serving, mode, next, lag.")
@URL
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def status(ctx: click.Context, url: str | None, as_json: bool) -> None:
    """Every host: who serves, the mode, the next switch, the last outcome, the mirror's lag.

    A host whose state row is older than [mirror] stale_after_s is marked stale (its daemon is
    down, or cannot reach the database).

    \b
    Examples:
      gpushift fleet status
      gpushift fleet status --json | jq '.hosts[] | select(.stale)'
    """
    from gpushift.fleet import queries

    with _connection(ctx, url) as (conn, mirror):
        hosts = queries.hosts(conn)
        recent = queries.reports(conn, 10)
    views = [_host_view(h, mirror.stale_after_s) for h in hosts]
    shared = _shared_ids(hosts)
    if as_json:
        say_json(_json({"stale_after_s": mirror.stale_after_s, "hosts": views, "machine_id_shared": shared,
                        "reports": recent}))  # fmt: skip
    else:
        _print_status(views, shared, recent)
    leave(0)


def _when(v: Any) -> str:
    from gpushift.cli.status_text import local_time

    return local_time(v) if v else "-"


def _print_status(
    views: list[dict[str, Any]], shared: list[dict[str, Any]], recent: list[dict[str, Any]]
) -> None:
    if not views:
        say("No host has mirrored to the central database yet.")
        return
    rows: list[tuple[str, ...]] = [
        ("HOST", "STATE", "SERVING", "MODE", "NEXT SWITCH", "LAST SWITCH", "MIRROR")
    ]
    for v in views:
        nxt = v["next_switch"] or {}
        last = v["last_switch"] or {}
        lag = v["mirror"].get("lag_rows")
        rows.append((
            str(v["host"]),
            "stale" if v["stale"] else "up",
            str(v["serving"] or "?"),
            str(v["mode"] or "?"),
            f"{nxt.get('target')} at {_when(nxt.get('at'))}" if nxt else "-",
            f"{last.get('outcome')} ({last.get('from') or '-'} -> {last.get('to')}, {_when(last.get('finished_at') or last.get('started_at'))})" if last else "-",
            f"{lag} rows behind" if lag else str(v["mirror"].get("state") or "?"),
        ))  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, r in enumerate(rows):
        line = "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        if n and views[n - 1]["stale"]:
            age = views[n - 1]["age_s"]
            line += f"  (state {age:.0f} s old)" if age is not None else "  (no state yet)"
        say(line)
    for s in shared:
        say(f"WARNING: machine-id {s['machine_id']} is shared by {', '.join(s['hosts'])} (cloned images?)")
    for rep in recent[:5]:
        say(f"reported by {rep['host']}: {rep['kind']}: {rep['what']}")


# --------------------------------------------------------------------------- ledger


@fleet.command("ledger", short_help="Every host's ledger rows, newest first.")
@URL
@click.option("--host", "host", metavar="HOST", help="Only this host's rows.")
@click.option(
    "--since", metavar="DATE", help="Only switches started since: 2025-03-01, 2025-03-01T08:00, 7d, 12h."
)
@click.option("--outcome", type=click.Choice(OUTCOMES), help="Only switches that ended so.")
@click.option(
    "--limit", "-n", type=LIMIT, default=20, show_default=True, help=f"Rows to show (at most {LIST_MAX:,})."
)
@click.option("--json", "as_json", is_flag=True, help="A JSON list (with each row's record), newest first.")
@click.pass_context
def ledger(
    ctx: click.Context, url: str | None, host: str | None, since: str | None, outcome: str | None, limit: int,
    as_json: bool,
) -> None:  # fmt: skip
    """Every host's ledger rows, newest first (by start), from the central copy.

    \b
    Examples:
      gpushift fleet ledger                       # the last 20 switches of the fleet
      gpushift fleet ledger --host gpu-2 --since 7d
      gpushift fleet ledger --outcome rolled_back --json
    """
    from gpushift.fleet import queries

    when = parse_since(since) if since else None
    with _connection(ctx, url) as (conn, _mirror):
        rows = queries.ledger(conn, min(limit, LIST_MAX), host, when, outcome, with_record=as_json)
    if as_json:
        say_json(_json([_row_json(r) for r in rows]))
    else:
        _print_rows(rows)
    leave(0)  # the connection is closed: no teardown of the driver's modules (docs/benchmarks.md)


def _row_json(r: dict[str, Any]) -> dict[str, Any]:
    out = dict(r.get("record") or {})
    out.update(host=r["host"], chain=r["chain"], id=r["id"])
    return out


def _print_rows(rows: list[dict[str, Any]]) -> None:
    from gpushift.ledger.text import local_time
    from gpushift.safetext import terminal

    if not rows:
        say("No rows.")
        return
    table: list[tuple[str, ...]] = [("HOST", "ID", "STARTED", "TRIGGER", "BY", "FROM", "TO", "OUTCOME")]
    for r in rows:
        table.append(tuple(terminal.escape(str(x)) for x in (
            r["host"], r["id"], local_time(r["started_at"]), r["trigger"] or "-", r["requested_by"] or "-",
            r["from_backend"] or "-", r["to_backend"] or "-", r["outcome"] or "-",
        )))  # fmt: skip
    widths = [max(len(t[i]) for t in table) for i in range(len(table[0]))]
    for t in table:
        say("  ".join(c.ljust(w) for c, w in zip(t, widths, strict=True)).rstrip())


# --------------------------------------------------------------------------- verify


@fleet.command("verify", short_help="Check every host's chain in the central copy.")
@URL
@click.option("--host", "only", metavar="HOST", help="Only this host's chains.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: every chain with its problems.")
@click.pass_context
def verify(ctx: click.Context, url: str | None, only: str | None, as_json: bool) -> None:
    """Check every host's chain in the central copy: rows missing, altered or out of order are named.

    Exits 0 when every chain verifies, 1 when one does not.

    \b
    Examples:
      gpushift fleet verify
      gpushift fleet verify --host gpu-2 --json
    """
    from gpushift.fleet import queries
    from gpushift.fleet.verify import check_chain

    reports = []
    with _connection(ctx, url) as (conn, _mirror):
        sent = {h["host"]: h["state"].get("mirror") or {} for h in queries.hosts(conn)}
        for host, chain in queries.chains(conn):
            if only is not None and host != only:
                continue
            m = sent.get(host) or {}
            through = m.get("sent") if m.get("chain") == chain and isinstance(m.get("sent"), int) else None
            reports.append(check_chain(host, chain, queries.chain_rows(conn, host, chain), through))
    ok = all(r.ok for r in reports)
    if as_json:
        say_json(_json({"ok": ok, "chains": [r.to_dict() for r in reports]}))
    else:
        for r in reports:
            for p in r.problems:
                say(f"{r.host} chain {r.chain[:12]}: {p}")
        rows = sum(r.rows for r in reports)
        hosts = len({r.host for r in reports})
        verdict = "ok" if ok else "FAILED"
        say(f"fleet verify {verdict}: {hosts} host(s), {len(reports)} chain(s), {rows} row(s)")
    leave(0 if ok else 1)

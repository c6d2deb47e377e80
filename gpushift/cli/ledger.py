"""``gpushift ledger`` — read the deployment ledger (no daemon needed).

The main CLI adds this group with ``main.add_command(ledger)``.  Every command opens the database
read-only (the daemon may be writing; WAL lets both proceed) and also shows records still waiting
in the pending spool.  What the commands show is built in ``gpushift.ledger.reports`` and
``gpushift.ledger.diff``; this module parses arguments and prints.

Errors: a command raises a :class:`~gpushift.errors.GpushiftError` (``LedgerError``,
``ConfigError``, ...) for every expected failure; the group prints it as one line on stderr and
exits with the error's ``code``.  Malformed arguments are click's usage errors (exit 2).

Memory stays bounded: ``--json`` and ``export`` stream the rows (≤ 100 MB at a million rows,
bench/ledger_stream.py); the table, built whole, shows at most :data:`TEXT_LIMIT_MAX` rows.

Start-up time matters (``gpushift ledger --limit 20`` ≤ 0.2 s on 100,000 rows, bench/ledger_list.py):
this module imports only click, the standard library and the error classes at the top; the
config and the ledger package are imported inside the commands.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import click

from gpushift.cli.output import painter, say, say_json
from gpushift.cli.params import BACKEND, LIMIT, LIMIT_MAX, ROW_ID, parse_since
from gpushift.errors import GpushiftError, LedgerError
from gpushift.values import Outcome

__all__ = ["ledger", "parse_since"]

if TYPE_CHECKING:
    from gpushift.config.schema import Config
    from gpushift.ledger import SqliteLedger

OUTCOMES = tuple(o.value for o in Outcome)
#: Most rows the table of ``gpushift ledger`` shows: it is built whole (its columns fit the widest
#: cell), while ``--json`` streams up to ``LIMIT_MAX`` rows in bounded memory.
TEXT_LIMIT_MAX = 10_000


class _LedgerGroup(click.Group):
    """The one exit for expected failures: ``gpushift ledger: <message>`` on stderr, the error's code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except GpushiftError as e:
            say(f"gpushift ledger: {e}", err=True)
            ctx.exit(e.code)


def _open(ctx: click.Context, check: bool = True) -> tuple[Config, SqliteLedger]:
    """The config and the ledger, read-only.  With ``check`` a database that cannot be read (not
    a database, unreadable, deleted) is a ``LedgerError`` here, before anything is printed."""
    from gpushift.config.schema import load
    from gpushift.ledger import SqliteLedger

    obj = ctx.obj if isinstance(ctx.obj, dict) else {}
    config = load(obj.get("config_path"))
    led = SqliteLedger.open_readonly(config.ledger_path, spool_dir=config.daemon.runtime_dir)
    if check:
        led.check_readable()
    return config, led


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _write_json(parts: Iterable[str]) -> None:
    """``say_json`` of the text ``parts`` make, written a part at a time (the whole is never held)."""
    from gpushift.safetext import terminal

    sys.stdout.writelines(terminal.json_safe(part) for part in parts)
    sys.stdout.write("\n")


# --------------------------------------------------------------------------- the commands


@click.group(
    name="ledger",
    cls=_LedgerGroup,
    invoke_without_command=True,
    short_help="List the ledger of every switch and launch.",
)
@click.option(
    "--limit",
    "-n",
    type=LIMIT,
    default=20,
    show_default=True,
    help=f"Rows to show: the table at most {TEXT_LIMIT_MAX:,}, --json at most {LIMIT_MAX:,} (streamed).",
)
@click.option("--backend", metavar="NAME", type=BACKEND, help="Only switches to or away from this backend.")
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

    \b
    Examples:
      gpushift ledger                 # the last 20 switches
      gpushift ledger -n 50 --backend llama --since 7d
      gpushift ledger --outcome rolled_back --json
    """
    if ctx.invoked_subcommand is not None:
        return
    if limit > TEXT_LIMIT_MAX and not as_json:
        raise click.BadParameter(
            f"{limit} is more rows than the table shows (at most {TEXT_LIMIT_MAX}); --json streams up to "
            f"{LIMIT_MAX}",
            param_hint="'--limit' / '-n'",
        )
    since_dt = parse_since(since) if since else None
    from gpushift.ledger import reports

    _config, led = _open(ctx)
    pending_ids = {r.id for r in led.pending_records()}
    if as_json:  # streamed: a million rows in bounded memory (bench/ledger_stream.py)
        _write_json(reports.json_list(led.iter_list(limit, backend, since_dt, outcome), pending_ids))
        return
    rows = led.list(limit=limit, backend=backend, since=since_dt, outcome=outcome)
    note = reports.degraded_note(led)
    if note:
        say(note, err=True)
    if not rows:
        say("no switches recorded" + (" that match" if backend or since or outcome else " yet"))
        return
    say(reports.format_list(rows, pending_ids, painter()))


@ledger.command("show", short_help="Show one switch and the launch it made.")
@click.argument("row_id", metavar="ID", type=ROW_ID)
@click.option("--json", "as_json", is_flag=True, help="The full record as JSON.")
@click.pass_context
def show(ctx: click.Context, row_id: int, as_json: bool) -> None:
    """Everything about one switch and the launch it made.

    \b
    Examples:
      gpushift ledger show 42
      gpushift ledger show 42 --json
    """
    from gpushift.ledger import reports

    _config, led = _open(ctx)
    rec = led.get(row_id)
    if rec is None:
        raise LedgerError(f"no switch with id {row_id} in the ledger")
    if as_json:
        say_json(_json(rec.to_dict()))
    else:
        say(reports.format_record(rec, painter()))


@ledger.command("diff", short_help="Show what changed between two launches.")
@click.argument("ids", metavar="[ID1 ID2]", nargs=-1, type=ROW_ID)
@click.option("--json", "as_json", is_flag=True, help="Changes as JSON.")
@click.pass_context
def diff(ctx: click.Context, ids: tuple[int, ...], as_json: bool) -> None:
    """What changed between two launches of the same backend.

    Without IDs: the last launch of each backend against its previous one.

    \b
    Examples:
      gpushift ledger diff            # each backend's last launch against its previous one
      gpushift ledger diff 40 42
    """
    if len(ids) not in (0, 2):
        raise click.UsageError("give two ids (older, newer), or none")
    from gpushift.ledger import diff as ledger_diff

    config, led = _open(ctx)
    if ids:
        item = ledger_diff.diff_pair(led, ids[0], ids[1])
        result: Any = item
        items = [item]
    else:
        result = items = ledger_diff.diff_latest(led, list(config.backends))
    if as_json:
        say_json(_json(result))
        return
    if not items:
        say("no launches recorded yet")
    for item in items:
        say(ledger_diff.format_diff_item(item))


@ledger.command("export", short_help="Export the whole ledger (markdown or jsonl).")
@click.option(
    "--format", "fmt", type=click.Choice(["markdown", "jsonl"]), default="markdown", show_default=True
)
@click.pass_context
def export(ctx: click.Context, fmt: str) -> None:
    """The whole ledger: a per-machine deployment README (markdown) or one JSON record per line
    (jsonl, oldest first).

    \b
    Examples:
      gpushift ledger export > DEPLOYMENTS.md
      gpushift ledger export --format jsonl > ledger.jsonl
    """
    from gpushift.ledger import reports

    config, led = _open(ctx)
    if fmt == "jsonl":
        from gpushift.safetext import terminal

        sys.stdout.writelines(terminal.json_safe(line) for line in reports.export_jsonl(led))
        return
    say(reports.export_markdown(led, config), nl=False)


@ledger.command("verify", short_help="Check the ledger's hash chain and head file.")
@click.option("--json", "as_json", is_flag=True, help="The result as JSON.")
@click.pass_context
def verify(ctx: click.Context, as_json: bool) -> None:
    """Check the hash chain and the head file; name the first bad row, or a break in the chain
    (recorded by the daemon or not).  Exits 11 on anything but an intact, unbroken chain.

    \b
    Examples:
      gpushift ledger verify
      gpushift ledger verify --json
    """
    _config, led = _open(ctx, check=False)  # verify names a bad database itself
    res = led.verify()
    if as_json:
        say_json(json.dumps(res.to_dict(), indent=2))
    elif res.ok:
        say(res.describe())
    if not res.ok:
        raise LedgerError(res.describe())


if __name__ == "__main__":  # python -m gpushift.cli.ledger (before the main CLI wires it in)
    ledger(obj={})

"""``gpushift schedule`` (the coming switches, or ``--week``: the days as a timeline) and
``gpushift schedule check [FILE] [--week]``.

Both work without a daemon: they read the config (for the schedule's path and the backend names)
and the schedule file themselves.  The main CLI adds the group with ``main.add_command(schedule)``;
``ctx.obj`` is a dict whose ``"config_path"`` may be ``None`` (then ``$GPUSHIFT_CONFIG`` or the
default path).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any, NoReturn

import click

from gpushift.cli.output import say, say_json
from gpushift.cli.params import parse_day, parse_from
from gpushift.config import schema as config_mod
from gpushift.errors import ConfigError, GpushiftError
from gpushift.schedule import DEFAULT_SCHEDULE_PATH, Fire, Schedule, Span, load_schedule
from gpushift.schedule.week import DAYS_MAX

UTC = timezone.utc


WEEK = click.option(
    "--week", is_flag=True, help="Draw the days as a timeline: one line per day, the hours across."
)
DAYS = click.option(
    "--days",
    type=click.IntRange(1, DAYS_MAX),
    metavar="N",
    help=f"With --week: how many days to draw (1 to {DAYS_MAX}; default 7).",
)


def _given(ctx: click.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source is not click.core.ParameterSource.DEFAULT


def _week_options(
    ctx: click.Context, week: bool, days: int | None, start_given: bool = False, next_given: bool = False
) -> None:
    """``--days`` (and ``check --from``) only with ``--week``; ``--next`` not with it."""
    if not week and days is not None:
        raise click.UsageError(f"--days {days} needs --week", ctx)
    if not week and start_given:
        raise click.UsageError("--from needs --week", ctx)
    if week and next_given:
        raise click.UsageError("--next counts switches, --week draws days: give one of them", ctx)


def _config_path(ctx: click.Context) -> str | None:
    obj = ctx.find_root().obj
    return obj.get("config_path") if isinstance(obj, dict) else None


def _fail(e: GpushiftError) -> NoReturn:
    say(f"gpushift: {e}", err=True)
    raise click.exceptions.Exit(e.code)


def _schedule_path(cfg: config_mod.Config) -> str:
    return cfg.daemon.schedule or DEFAULT_SCHEDULE_PATH


def _local(t: datetime, sched: Schedule) -> str:
    lt = t.astimezone(sched.tz)
    return f"{lt:%a %Y-%m-%d %H:%M}" + (f":{lt:%S}" if lt.second else "") + f" {lt.tzname()}"


def _utc(t: datetime) -> str:
    u = t.astimezone(UTC)  # seconds only where a stagger put some ([daemon] stagger_s)
    return f"{u:%Y-%m-%d %H:%M}" + (f":{u:%S}" if u.second else "") + " UTC"


def _zone_source(sched: Schedule) -> str:
    return f"TZ= on line {sched.tz_line}" if sched.tz_line is not None else "the host's zone"


def _utc_json(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fire_json(f: Fire, sched: Schedule) -> dict[str, Any]:
    return {
        "utc": _utc_json(f.at),
        "local": f.at.astimezone(sched.tz).isoformat(),
        "target": f.target,
        "line": f.entry.line,
        "entry": f.entry.fields,
        # the calendar exception that begins (is in force) here, or that ends here
        "exception": f.exception,
        "exception_ends": f.span.label if f.span is not None and f.ends else None,
    }


def _span_state(span: Span, at: datetime) -> str:
    return "passed" if span.end <= at else "in force" if span.start <= at else "coming"


def _span_json(span: Span, sched: Schedule, at: datetime) -> dict[str, Any]:
    return {
        "line": span.line,
        "name": span.name,
        "target": span.target,
        "range": span.written,
        "from_utc": _utc_json(span.start),
        "from_local": span.start.astimezone(sched.tz).isoformat(),
        "until_utc": _utc_json(span.end),
        "until_local": span.end.astimezone(sched.tz).isoformat(),
        "state": _span_state(span, at),
    }


def _fire_note(f: Fire, changes: bool) -> str:
    parts = []
    if f.span is not None:
        which = f.span.name or f"on line {f.span.line}"
        parts.append(f"exception {which} {'ends' if f.ends else 'begins'}")
    if not changes:
        parts.append("(already in effect)")
    return " ".join(parts)


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        say("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())


def _echo_spans(sched: Schedule, at: datetime) -> None:
    """The calendar exceptions not yet passed at ``at`` (a passed one is ignored: only counted)."""
    shown = [s for s in sched.spans if s.end > at]
    passed = len(sched.spans) - len(shown)
    gone = f" ({passed} passed, ignored)" if passed else ""
    if not shown:
        if passed:
            say(f"Calendar exceptions: none to come{gone}.")
        return
    say(f"Calendar exceptions{gone}:")
    rows = [("LINE", "NAME", "BACKEND", "FROM", "UNTIL", "FROM (UTC)", "UNTIL (UTC)", "")]
    for s in shown:
        rows.append(
            (
                str(s.line),
                s.name or "-",
                s.target,
                _local(s.start, sched),
                _local(s.end, sched),
                _utc(s.start),
                _utc(s.end),
                _span_state(s, at),
            )
        )
    _table(rows)


def _staggered(cfg: config_mod.Config, sched: Schedule) -> tuple[Schedule, dict[str, Any] | None]:
    """The schedule as this host's daemon fires it (``[daemon] stagger_s``) and the stagger."""
    from gpushift.host.identity import stagger as stagger_of

    stagger = stagger_of(cfg)
    return (sched.staggered(stagger["offset_s"]) if stagger is not None else sched), stagger


@click.group("schedule", invoke_without_command=True, short_help="List the next switches of the schedule.")
@click.option(
    "--next", "count", type=click.IntRange(1, 10000), default=10, show_default=True, help="How many to list."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option(
    "--from",
    "start",
    metavar="TIME",
    help="List from TIME instead of now ('2026-12-01 08:00' in the schedule's zone, or ISO 8601 with "
    "offset); with --week, the first day ('2026-12-21').",
)
@WEEK
@DAYS
@click.pass_context
def schedule(
    ctx: click.Context, count: int, as_json: bool, start: str | None, week: bool, days: int | None
) -> None:
    """List the next switches of the schedule (local and UTC times, and the entry behind each).

    With --week, draw the days instead: one line per day, the hours across (3 columns an hour),
    each backend in its letter and colour, a calendar exception, an override or a hold in UPPER
    CASE, now and the clock's changes marked under their day (docs/schedule.md "The week at a
    glance").  The override or hold is the daemon's, or read from override.json when it does not
    answer.

    Reads the config for the schedule file and the backend names; no daemon is needed.

    \b
    Examples:
      gpushift schedule               # the next 10 switches
      gpushift schedule --next 30 --from "2026-12-24 00:00"
      gpushift schedule --json
      gpushift schedule --week        # today and the next 6 days
      gpushift schedule --week --from 2026-12-21 --days 14
    """
    if ctx.invoked_subcommand is not None:
        return
    _week_options(ctx, week, days, next_given=_given(ctx, "count"))
    try:
        cfg = config_mod.load(_config_path(ctx))
        sched = load_schedule(_schedule_path(cfg), backends=cfg.backends.keys())
    except GpushiftError as e:
        _fail(e)
    sched, stagger = _staggered(cfg, sched)
    if week:
        from gpushift.cli import schedule_week

        first = parse_day(start, sched.tz) if start else None
        overlay, source = schedule_week.overlay_now(cfg)
        schedule_week.draw(
            sched, list(cfg.backends), first, days or 7, overlay, source, as_json, _zone_source(sched)
        )
        return
    _list(sched, parse_from(start, sched.tz) if start else datetime.now(UTC), count, as_json, stagger)


def _list(sched: Schedule, at: datetime, count: int, as_json: bool, stagger: dict[str, Any] | None) -> None:
    """The switches from ``at``: what is in effect, the exceptions to come, the next ``count`` fires."""
    current = sched.in_effect(at)
    fires = sched.next(at, count)
    previous = current.target if current else None
    changes: list[bool] = []
    for f in fires:
        changes.append(f.target != previous)
        previous = f.target

    if as_json:
        doc = {
            "schedule": sched.path,
            "tz": str(sched.tz),
            "tz_line": sched.tz_line,
            "at": at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "stagger": stagger,
            "in_effect": _fire_json(current, sched) if current else None,
            "exceptions": [_span_json(s, sched, at) for s in sched.spans],
            "next": [{**_fire_json(f, sched), "changes": c} for f, c in zip(fires, changes, strict=True)],
        }
        say_json(json.dumps(doc, indent=2))
        return

    say(f"Schedule {sched.path} (time zone {sched.tz}, {_zone_source(sched)})")
    if stagger is not None:
        say(f"Staggered: every boundary {stagger['offset_s']} s later on this host ({stagger['host_name']}; "
            f"[daemon] stagger_s = {stagger['stagger_s']})")  # fmt: skip
    if not sched.entries and not sched.spans:
        say("The schedule has no entries: it never switches.")
        return
    if current:
        exc = ""
        if current.span is not None and not current.ends:
            exc = f", calendar exception {current.span.label} until {_local(current.span.end, sched)}"
        say(
            f"In effect at {_local(at, sched)}: {current.target}, since {_local(current.at, sched)} "
            f"(line {current.entry.line}: {current.entry.fields}){exc}"
        )
    _echo_spans(sched, at)
    say(f"Next {len(fires)} times the schedule fires:")
    rows = [("LOCAL", "UTC", "BACKEND", "LINE", "ENTRY", "")]
    for f, c in zip(fires, changes, strict=True):
        rows.append(
            (_local(f.at, sched), _utc(f.at), f.target, str(f.entry.line), f.entry.fields, _fire_note(f, c))
        )
    _table(rows)


@schedule.command("check", short_help="Validate a schedule file, without a daemon.")
@click.argument("file", required=False, metavar="[FILE]")
@WEEK
@click.option(
    "--from", "start", metavar="DATE", help="With --week: the first day ('2026-12-21'; default today)."
)
@DAYS
@click.pass_context
def check(ctx: click.Context, file: str | None, week: bool, start: str | None, days: int | None) -> None:
    """Validate a schedule file (default: the one the config names) without a daemon.

    Exits 0 with a summary, or non-zero with the error naming file, line and field.  Backend names
    are checked against the config; when the config cannot be read, FILE is still checked and the
    output says that backend names were not.  With --week the file is also drawn as
    `gpushift schedule --week` draws the installed one (without an override: it is not in effect
    yet), so a change can be seen before it takes effect.

    \b
    Examples:
      gpushift schedule check         # the schedule the config names
      gpushift schedule check ./schedule.new
      gpushift schedule check ./schedule.new --week --from 2026-12-21
    """
    _week_options(ctx, week, days, start_given=start is not None)
    cfg: config_mod.Config | None = None
    cfg_error: ConfigError | None = None
    try:
        cfg = config_mod.load(_config_path(ctx))
    except ConfigError as e:
        cfg_error = e
    if file is None:
        if cfg is None:
            assert cfg_error is not None
            _fail(ConfigError(f"{cfg_error} (or name the file: gpushift schedule check FILE)"))
        file = _schedule_path(cfg)
    try:
        sched = load_schedule(file, backends=cfg.backends.keys() if cfg else None)
    except GpushiftError as e:
        _fail(e)

    n, k = len(sched.entries), len(sched.spans)
    spans = f"{k} calendar exception{'' if k == 1 else 's'}, " if k else ""
    say(
        f"{file}: OK: {n} entr{'y' if n == 1 else 'ies'}, {spans}time zone {sched.tz} ({_zone_source(sched)})"
    )
    lines = [(e.line, f"{e.fields} -> {e.target}") for e in sched.entries]
    for s in sched.spans:
        name = f" ({s.name})" if s.name else ""
        when = f"{_local(s.start, sched)} .. {_local(s.end, sched)}"
        lines.append((s.line, f"except {s.written} -> {s.target}{name}: {when}"))
    for lineno, text in sorted(lines):
        say(f"  line {lineno}: {text}")
    if cfg is not None:
        say(f"backend names checked against {cfg.path}")
    else:
        say(f"note: backend names were NOT checked: {cfg_error}", err=True)
    now = datetime.now(UTC)
    for s in sched.passed(now):
        say(
            f"note: line {s.line}: calendar exception {s.label} has passed (it ended "
            f"{_local(s.end, sched)}); it is ignored, the line can go",
            err=True,
        )
    current = sched.in_effect(now)
    nxt = sched.next_change(now)
    if current:
        exc = f", calendar exception {current.exception}" if current.exception else ""
        say(f"in effect now: {current.target} (line {current.entry.line}{exc})")
    if nxt:
        say(f"next switch: {nxt.target} at {_local(nxt.at, sched)} ({_utc(nxt.at)})")
    if week:
        from gpushift.cli import schedule_week

        say("")
        first = parse_day(start, sched.tz) if start else None
        names = list(cfg.backends) if cfg is not None else []
        schedule_week.draw(sched, names, first, days or 7, None, None, False, _zone_source(sched))

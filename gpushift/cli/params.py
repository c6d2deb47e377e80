"""The command line's argument types — every value bounded before anything is asked of the
daemon, the ledger or the schedule.

The rules are ``gpushift.config.validate``'s (the daemon applies the same ones to a D-Bus call); here a
value that breaks one is a click usage error (exit 2, naming the option), never a traceback:

* a backend name (``switch BACKEND``, ``ledger --backend``): :func:`gpushift.config.validate.name_problem`;
* ``--reason``: one plain line of at most :data:`~gpushift.config.validate.REASON_MAX` characters;
* ``--until``: one plain line of at most :data:`~gpushift.config.validate.UNTIL_MAX` characters (the
  daemon reads the time);
* ``ledger --limit``: 1 to :data:`LIMIT_MAX`; a ledger id: 1 to 2^63-1 (SQLite's integer);
* ``ledger --since``: a time, ``today``/``yesterday`` or an age of at most :data:`AGE_MAX_DAYS` days;
* ``schedule --from``: a time from the year :data:`YEAR_MIN` to :data:`YEAR_MAX` (with ``--week``, a date).
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone, tzinfo
from typing import Any

import click
import click.shell_completion

from gpushift.config import validate

#: Most rows ``gpushift ledger --limit`` shows.
LIMIT_MAX = 1_000_000
#: Oldest age ``--since`` takes (about 100 years).
AGE_MAX_DAYS = 36_525
#: The years ``schedule --from`` takes (the schedule's next times stay inside what a datetime holds).
YEAR_MIN, YEAR_MAX = 1970, 9000

LIMIT = click.IntRange(1, LIMIT_MAX)
ROW_ID = click.IntRange(1, validate.ROW_ID_MAX)


class _Checked(click.ParamType):  # type: ignore[type-arg]  # generic in newer click
    """A string that a rule of ``gpushift.config.validate`` accepts (``problem`` returns why not, or None)."""

    def __init__(self, name: str, limit: int = 0) -> None:
        self.name = name
        self.limit = limit

    def problem(self, value: str) -> str | None:
        if self.name == "backend":
            return validate.name_problem(value)
        return validate.line_problem(value, self.limit)

    def shell_complete(
        self, ctx: click.Context, param: click.Parameter, incomplete: str
    ) -> list[click.shell_completion.CompletionItem]:
        """Backend names complete from the config (``--config``, ``$GPUSHIFT_CONFIG``, the default
        path) and ``off``; nothing, silently, when the config cannot be read."""
        if self.name != "backend":
            return []
        names = [n for n in configured_backends(ctx) if n.startswith(incomplete)]
        return [click.shell_completion.CompletionItem(n) for n in names]

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value)
        why = self.problem(text)
        if why is not None:
            self.fail(f"{validate.shown(text)}: {why}", param, ctx)
        return text


def configured_backends(ctx: click.Context) -> list[str]:
    """The backend names of the config the command would read, for completion (``[]`` when it
    cannot be read).  During completion click runs no group callback: the ``--config`` typed so far
    is in the root context's params."""
    from gpushift.config import schema

    root = ctx.find_root()
    explicit = root.params.get("config_path") if root.params else None
    try:
        cfg = schema.load(explicit if isinstance(explicit, str) else None)
    except Exception:  # a completion never prints a traceback into the shell
        return []
    return [*sorted(cfg.backends), "off"]


BACKEND = _Checked("backend")
REASON = _Checked("reason", validate.REASON_MAX)
UNTIL = _Checked("time", validate.UNTIL_MAX)


def _bad(text: str, hint: str, why: str) -> click.BadParameter:
    return click.BadParameter(f"{validate.shown(text)}: {why}", param_hint=hint)


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """``--since``: an ISO date/time (local time unless it has an offset), ``today``,
    ``yesterday``, or an age such as ``30m``, ``12h``, ``7d``, ``2w``.  Returns an aware instant.

    Raises:
        click.BadParameter: not one of these, or an age over :data:`AGE_MAX_DAYS` days.
    """
    now = now or datetime.now(timezone.utc)
    t = text.strip().lower()
    m = re.fullmatch(r"(\d{1,12})\s*([mhdw])", t)
    if m:
        minutes = int(m.group(1)) * {"m": 1, "h": 60, "d": 1440, "w": 10080}[m.group(2)]
        if minutes > AGE_MAX_DAYS * 1440:
            raise _bad(text, "--since", f"expected an age of at most {AGE_MAX_DAYS} days")
        return now - timedelta(minutes=minutes)
    if t in ("today", "yesterday"):
        local_midnight = now.astimezone().replace(hour=0, minute=0, second=0, microsecond=0)
        return local_midnight - timedelta(days=1 if t == "yesterday" else 0)
    s = text.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(s)
        return dt if dt.tzinfo is not None else dt.astimezone()  # naive: the user's local time
    except (ValueError, OverflowError):
        raise _bad(
            text,
            "--since",
            "expected a date (2025-03-01), a date and time (2025-03-01T08:00), "
            "'today', 'yesterday' or an age (30m, 12h, 7d, 2w)",
        ) from None


def parse_from(text: str, tz: tzinfo) -> datetime:
    """``schedule --from``: a time in the schedule's zone ``tz``, or ISO 8601 with an offset.

    Raises:
        click.BadParameter: not a time, or outside the years :data:`YEAR_MIN`-:data:`YEAR_MAX`.
    """
    try:
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise _bad(
            text,
            "--from",
            "not a time (expected e.g. '2026-12-01 08:00' in the schedule's zone, or ISO 8601 with an offset)",
        ) from None
    if not YEAR_MIN <= t.year <= YEAR_MAX:
        raise _bad(text, "--from", f"expected a time from the year {YEAR_MIN} to {YEAR_MAX}")
    return t.replace(tzinfo=tz) if t.tzinfo is None else t


def parse_day(text: str, tz: tzinfo) -> date:
    """``schedule --week --from``: a date (``2026-03-23``), or a time as :func:`parse_from` reads it
    (its date in the schedule's zone ``tz``).

    Raises:
        click.BadParameter: neither, or outside the years :data:`YEAR_MIN`-:data:`YEAR_MAX`.
    """
    s = text.strip()
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", s):
        try:
            d = date.fromisoformat(s)
        except ValueError as e:
            raise _bad(text, "--from", f"not a date ({e})") from None
    else:
        try:
            t = datetime.fromisoformat(s.replace("Z", "+00:00"))
        except ValueError:
            raise _bad(
                text,
                "--from",
                "not a date (expected e.g. '2026-03-23', or a time such as '2026-03-23 08:00')",
            ) from None
        d = (t.astimezone(tz) if t.tzinfo is not None else t).date()
    if not YEAR_MIN <= d.year <= YEAR_MAX:
        raise _bad(text, "--from", f"expected a date from the year {YEAR_MIN} to {YEAR_MAX}")
    return d

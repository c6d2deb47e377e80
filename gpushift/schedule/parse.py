"""Reading a schedule file: crontab(5) lines, their five time fields, the @-forms, the one
``TZ=`` line, the ``except`` lines (calendar exceptions, read by ``parse_span``); every error names
the file, the line, the field and what was expected."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpushift.config import textfile, validate
from gpushift.errors import ConfigError
from gpushift.schedule.entry import Entry
from gpushift.schedule.evaluate import Schedule
from gpushift.schedule.parse_span import SpanSet, is_except_line, parse_span
from gpushift.schedule.zones import ZONE_KEY, host_timezone
from gpushift.values import OFF

DEFAULT_SCHEDULE_PATH = "/etc/gpushift/schedule"

FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
_LINE_FORMAT = "minute hour day-of-month month day-of-week backend"

_MONTH_NAMES = {
    "jan": 1, "feb": 2, "mar": 3, "apr": 4, "may": 5, "jun": 6,
    "jul": 7, "aug": 8, "sep": 9, "oct": 10, "nov": 11, "dec": 12,
}  # fmt: skip
_DAY_NAMES = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}

# crontab(5)'s @-forms; @reboot has no meaning here (the schedule is re-applied at every start).
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_NUMBER = re.compile(r"[0-9]+")
_SETTING = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)")
_BACKEND_NAME = re.compile(r"[A-Za-z0-9_-]+")

# parse_schedule's per-line error factory: (field, what was expected) → ConfigError naming file:line.
_ErrFactory = Callable[[str, str], ConfigError]


@dataclass(frozen=True)
class _FieldSpec:
    name: str
    low: int
    high: int
    names: Mapping[str, int]
    expected: str


_FIELDS = (
    _FieldSpec("minute", 0, 59, {}, "0-59"),
    _FieldSpec("hour", 0, 23, {}, "0-23"),
    _FieldSpec("day-of-month", 1, 31, {}, "1-31"),
    _FieldSpec("month", 1, 12, _MONTH_NAMES, "1-12 or jan..dec"),
    # 7 is Sunday too (crontab(5)); it is folded onto 0 after parsing.
    _FieldSpec("day-of-week", 0, 7, _DAY_NAMES, "0-7 (0 and 7 = Sunday) or sun..sat"),
)

# The longest month (a leap February counts) for the "can this entry ever fire" check.
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def parse_schedule(
    text: str,
    path: str = "<schedule>",
    backends: Collection[str] | None = None,
    default_tz: ZoneInfo | None = None,
) -> Schedule:
    """Parse a schedule file's text.

    Args:
        text: the file's contents.
        path: the file name used in error messages.
        backends: the configured backend names; every entry's (and exception's) target must be
            one of them or ``off``.  ``None`` checks only that targets are well-formed names.
        default_tz: the zone used when the file has no ``TZ=`` line; ``None`` means the host's zone
            (:func:`host_timezone`).

    Returns:
        The schedule.

    Raises:
        ConfigError: naming the file, line, field and what was expected.
    """
    tz: ZoneInfo | None = None
    tz_line: int | None = None
    first_line: int | None = None  # of the first entry or exception: TZ= must come before it
    entries: list[Entry] = []
    spans = SpanSet()
    # Lines end at a newline only (str.splitlines would also end one at a form feed or U+2028 and
    # shift every line number after it); a CR before the newline is an editor's, not the line's.
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.removesuffix("\r").strip()
        if not line or line.startswith("#"):
            continue

        def err(fld: str, msg: str, lineno: int = lineno) -> ConfigError:
            return ConfigError(f"{path}:{lineno}: {fld}: {msg}")

        # A tab separates fields like a space; any other control or formatting character, or a
        # line longer than LINE_MAX, cannot be part of an entry.
        problem = validate.line_problem(line, LINE_MAX, tabs=True)
        if problem is not None:
            raise err("line", problem)

        setting = _SETTING.fullmatch(line)
        if setting:
            name, value = setting.group(1), setting.group(2).strip()
            if name != "TZ":
                raise err(name, f"unknown setting {name}= (the only setting is TZ=Area/City)")
            if tz_line is not None:
                raise err("TZ", f"TZ= is given twice (first on line {tz_line})")
            if first_line is not None:
                raise err("TZ", f"TZ= must come before the first entry (line {first_line})")
            tz = _zone(value, err)
            tz_line = lineno
            continue
        if first_line is None:
            first_line = lineno
        if len(entries) + len(spans.spans) >= MAX_ENTRIES:
            raise err("entries", _too_many())
        if tz is None:  # no TZ= above: the default zone (a TZ= below is an error)
            tz = default_tz if default_tz is not None else host_timezone()
        if is_except_line(line):

            def check(target: str, err: _ErrFactory = err) -> None:
                _check_target(target, backends, err)

            spans.add(parse_span(line, lineno, tz, check, err, spans))
            continue
        entries.append(_parse_entry(line, lineno, backends, err))
    if tz is None:
        tz = default_tz if default_tz is not None else host_timezone()
    return Schedule(
        path=path,
        tz=tz,
        entries=tuple(entries),
        tz_line=tz_line,
        spans=tuple(sorted(spans.spans, key=lambda s: s.start)),
    )


def load_schedule(
    path: str = DEFAULT_SCHEDULE_PATH,
    backends: Collection[str] | None = None,
    default_tz: ZoneInfo | None = None,
) -> Schedule:
    """Read and parse a schedule file (see :func:`parse_schedule`).

    Raises:
        ConfigError: the file cannot be read, or it is invalid.
    """
    # A regular file of at most 1 MiB, UTF-8 (an editor's byte-order mark skipped): gpushift.config.textfile.
    text = textfile.read_text(path, "schedule file", "set [daemon] schedule in the config")
    return parse_schedule(text, path, backends, default_tz)


#: Longest line of a schedule outside comments.
LINE_MAX = 1000

#: Most entries and calendar exceptions (together) a schedule may hold (docs/schedule.md "How big a
#: schedule may be"): every line of a week's hours is 168, every day of a year as an exception 366.
MAX_ENTRIES = 1000


def _too_many() -> str:
    return (
        f"more than {MAX_ENTRIES} entries and calendar exceptions: a schedule holds at most "
        f"{MAX_ENTRIES} (this line would be number {MAX_ENTRIES + 1}; one entry can name many times "
        "with lists, ranges and steps, e.g. 0 8,20 * * 1-5)"
    )


def _zone(value: str, err: _ErrFactory) -> ZoneInfo:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1].strip()  # crontab allows quoted values
    expected = "an IANA zone name such as Asia/Shanghai or Europe/Berlin"
    if not value:
        raise err("TZ", f"missing zone (expected {expected})")
    if not ZONE_KEY.fullmatch(value):
        raise err("TZ", f"{value!r} is not a zone name (expected {expected})")
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise err("TZ", f"unknown time zone {value!r} (expected {expected})") from None


def _parse_entry(line: str, lineno: int, backends: Collection[str] | None, err: _ErrFactory) -> Entry:
    tokens = line.split()
    if tokens[0].startswith("@"):
        macro = tokens[0].lower()
        if macro == "@reboot":
            raise err(tokens[0], "@reboot is not supported: the schedule is re-applied at every start anyway")
        if macro not in _MACROS:
            raise err(tokens[0], f"unknown @-form (expected one of: {', '.join(_MACROS)})")
        if len(tokens) < 2:
            raise err("backend", f"missing (expected: {tokens[0]} backend)")
        time_tokens, written = _MACROS[macro].split(), tokens[0]
        rest = tokens[1:]
    else:
        if len(tokens) < 6:
            missing = (*FIELD_NAMES, "backend")[len(tokens)]
            raise err(missing, f"missing (expected: {_LINE_FORMAT})")
        time_tokens, written, rest = tokens[:5], " ".join(tokens[:5]), tokens[5:]
    if len(rest) > 1:
        raise err(
            "backend",
            f"unexpected text {rest[1]!r} after the backend name (comments go on their own line, starting with '#')",
        )
    parsed = [_parse_field(tok, spec, err) for tok, spec in zip(time_tokens, _FIELDS, strict=True)]
    target = rest[0]
    _check_target(target, backends, err)
    (minutes, _), (hours, _), (days, dom_r), (months, _), (weekdays, dow_r) = parsed
    weekdays = {0 if d == 7 else d for d in weekdays}
    entry = Entry(
        line=lineno,
        fields=written,
        target=target,
        minutes=tuple(sorted(minutes)),
        hours=tuple(sorted(hours)),
        days=frozenset(days),
        months=frozenset(months),
        weekdays=frozenset(weekdays),
        dom_restricted=dom_r,
        dow_restricted=dow_r,
    )
    # Cron silently accepts "0 8 31 2 *" and never runs it; here that is surely a mistake.  With both
    # day fields restricted the weekday alone can fire it, so only the other case can be empty.
    if not (dom_r and dow_r) and not any(d <= _MONTH_DAYS[m - 1] for m in months for d in days):
        raise err(
            "day-of-month",
            f"{time_tokens[2]!r} never occurs in month {time_tokens[3]!r}: the entry would never fire",
        )
    return entry


def _check_target(target: str, backends: Collection[str] | None, err: _ErrFactory) -> None:
    if target == OFF:
        return
    if backends is None:
        if not _BACKEND_NAME.fullmatch(target):
            raise err("backend", f"{target!r} is not a backend name (letters, digits, '-' and '_' only)")
        return
    if target not in backends:
        known = ", ".join([*sorted(backends), OFF])
        raise err("backend", f"{target!r} is not a configured backend (expected one of: {known})")


def _parse_field(token: str, spec: _FieldSpec, err: _ErrFactory) -> tuple[set[int], bool]:
    """One time field → (its set of values, restricted?).  Restricted means "does not start with *"."""
    values: set[int] = set()
    for item in token.split(","):
        if not item:
            raise err(
                spec.name, f"empty list item in {token!r} (expected {spec.expected}, separated by commas)"
            )
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not _NUMBER.fullmatch(step_text) or len(step_text) > 3 or int(step_text) == 0:
                raise err(spec.name, f"bad step {step_text!r} in {item!r} (expected a whole number >= 1)")
            step = int(step_text)
        if base == "*":
            # '*' spans 0-6 on the weekday field: 7 would only repeat Sunday.
            lo, hi = spec.low, (6 if spec.names is _DAY_NAMES else spec.high)
        else:
            first, dash, last = base.partition("-")
            if not dash and slash:
                raise err(spec.name, f"a step needs a range or '*' in {item!r} (e.g. */15 or 1-10/2)")
            lo = _value(first, spec, item, err)
            hi = _value(last, spec, item, err) if dash else lo
            if spec.names is _DAY_NAMES and last.lower() == "sun" and lo > 0:
                hi = 7  # "mon-sun": the NAME sun ending a range is day 7, so the range runs forwards
            if lo > hi:
                raise err(spec.name, f"range {base!r} runs backwards (expected start <= end)")
        values.update(range(lo, hi + 1, step))
    return values, not token.startswith("*")


def _value(text: str, spec: _FieldSpec, item: str, err: _ErrFactory) -> int:
    if _NUMBER.fullmatch(text):
        v = int(text) if len(text) <= 4 else spec.high + 1
        if not spec.low <= v <= spec.high:
            what = repr(text) if text == item else f"{text!r} in {item!r}"
            raise err(spec.name, f"{what} is out of range (expected {spec.expected})")
        return v
    name = text.lower()
    if name in spec.names:
        return spec.names[name]
    what = (
        f"a missing value in {item!r}"
        if not text
        else repr(text)
        if text == item
        else f"{text!r} in {item!r}"
    )
    raise err(spec.name, f"{what} is not valid (expected {spec.expected})")

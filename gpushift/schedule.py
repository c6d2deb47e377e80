"""L2: the schedule file (crontab(5) semantics) → "which backend is in effect now" and "what comes next".

The file is a small crontab: comment lines, one optional ``TZ=Area/City`` line before the first entry,
and entries ``minute hour day-of-month month day-of-week backend``.  Everything outside this module
sees plain aware datetimes: :meth:`Schedule.in_effect`, :meth:`Schedule.next`,
:meth:`Schedule.next_boundary`, :meth:`Schedule.next_change`.

Why the fire times are computed here, per field, instead of through APScheduler's ``CronTrigger``
(docs/schedule.md says more):

* ``CronTrigger.from_crontab`` reads weekday 0 as Monday, rejects 7 and ANDs the two day fields
  (agronholm/apscheduler#286); crontab(5) says 0 and 7 are Sunday and the day fields are ORed.
* APScheduler has no "previous fire time", which is exactly what "the backend in effect now" needs,
  for yearly entries too (``0 8 29 2 *`` last fired up to eight years ago).
* Its DST behaviour (fires twice on the fall-back night) is not the one we want.

So an entry is matched against local wall-clock times (naive datetimes, where the calendar is exact),
and each matching wall-clock time is mapped to ONE UTC instant by a single rule (:func:`_to_utc`):
the instant itself; the first occurrence when the time exists twice (fall-back night); the first
instant after the gap when it does not exist (spring-forward night).  That mapping never goes
backwards in time, so "the latest fire at or before T" and "the first fire after T" are both exact
searches over the calendar and always agree with each other.
"""

from __future__ import annotations

import os
import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import ConfigError
from .model import OFF

DEFAULT_SCHEDULE_PATH = "/etc/gpushift/schedule"

UTC = timezone.utc
_MINUTE = timedelta(minutes=1)
# Upper bound of a UTC-offset change at one transition (DST is 1 h, Lord Howe 0.5 h, historic
# "double summer time" 2 h): used to bound the search when a time falls in a repeated hour.
_MAX_SHIFT = timedelta(hours=3)
# Every (month, day) combination, Feb 29 included, falls on every weekday within one 400-year
# Gregorian cycle, so a feasible entry fires at least once in any 401 years.
_SEARCH_YEARS = 401
# next_change() gives up after this many schedule fires without a change of target (it only
# happens when every entry naming another backend is shadowed by a later line at the same instant).
_CHANGE_SEARCH_FIRES = 2000

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
_ZONE_KEY = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*")
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


@dataclass(frozen=True)
class Entry:
    """One schedule line: when it fires and which backend it names.

    ``dom_restricted``/``dow_restricted`` follow crontab(5): a day field is restricted when it does
    not start with ``*``.  When both are, a day matches if EITHER matches; otherwise both must.
    ``weekdays`` uses 0 = Sunday … 6 = Saturday (7 has been folded onto 0).
    """

    line: int
    fields: str  # the five time fields as written (single-spaced), or the @-form
    target: str  # a configured backend name or "off"
    minutes: tuple[int, ...] = field(repr=False, default=())
    hours: tuple[int, ...] = field(repr=False, default=())
    days: frozenset[int] = field(repr=False, default=frozenset())
    months: frozenset[int] = field(repr=False, default=frozenset())
    weekdays: frozenset[int] = field(repr=False, default=frozenset())
    dom_restricted: bool = field(repr=False, default=False)
    dow_restricted: bool = field(repr=False, default=False)

    def day_matches(self, d: date) -> bool:
        """Whether the entry fires on calendar day ``d`` (at its hours and minutes)."""
        if d.month not in self.months:
            return False
        dom = d.day in self.days
        dow = d.isoweekday() % 7 in self.weekdays  # isoweekday: Monday 1 … Sunday 7 → Sunday 0
        if self.dom_restricted and self.dow_restricted:
            return dom or dow
        return dom and dow

    def matches(self, wall: datetime) -> bool:
        """Whether the local wall-clock minute ``wall`` (naive) matches the entry."""
        return wall.minute in self.minutes and wall.hour in self.hours and self.day_matches(wall.date())


@dataclass(frozen=True)
class Fire:
    """The schedule switching to ``target`` at instant ``at`` (aware, UTC) because ``entry`` fired."""

    entry: Entry
    at: datetime
    target: str


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule file.

    ``tz`` is the zone every entry is read in (the file's ``TZ=`` line, else the host's zone);
    ``tz_line`` is that line's number, or ``None`` when the host's zone is used.
    """

    path: str
    tz: ZoneInfo
    entries: tuple[Entry, ...]
    tz_line: int | None = None

    @property
    def targets(self) -> frozenset[str]:
        """Every backend name (and ``off``) the schedule can switch to."""
        return frozenset(e.target for e in self.entries)

    def in_effect(self, at: datetime) -> Fire | None:
        """The fire that decides what runs at ``at``: the latest one at or before ``at``.

        Any entry counts, however rarely it fires.  When several entries fire at the same instant the
        later written time wins, then the later line (see :meth:`next`).  ``None`` when no entry has
        ever fired (an empty schedule).

        Args:
            at: an aware datetime (any zone; compared in UTC).
        """
        at_utc = _as_utc(at)
        best: tuple[datetime, datetime, int] | None = None
        winner: Entry | None = None
        for e in self.entries:
            p = _prev_fire(e, self.tz, at_utc)
            if p is None:
                continue
            key = (p[0], p[1], e.line)
            if best is None or key > best:
                best, winner = key, e
        if best is None or winner is None:
            return None
        return Fire(winner, best[0], winner.target)

    def next(self, after: datetime, n: int) -> list[Fire]:
        """The next ``n`` fires strictly after ``after``, in time order, one per instant.

        When several entries fire at the same instant only one fire is listed: the entry whose
        written time is later wins (this only differs on a spring-forward night, where several
        written times collapse onto the first instant after the gap), and among equal written times
        the later line in the file wins.  A fire may name the backend that is already in effect.

        Args:
            after: an aware datetime (any zone; compared in UTC).
            n: how many fires to return (fewer only if the calendar ends, i.e. year 9999).
        """
        after_utc = _as_utc(after)
        heads: list[datetime | None] = [_next_fire(e, self.tz, after_utc) for e in self.entries]
        out: list[Fire] = []
        while len(out) < n:
            live = [u for u in heads if u is not None]
            if not live:
                break
            t = min(live)
            group = [i for i, u in enumerate(heads) if u == t]
            out.append(self._winner(group, t))
            for i in group:
                heads[i] = _next_fire(self.entries[i], self.tz, t)
        return out

    def next_boundary(self, after: datetime) -> Fire | None:
        """The next instant strictly after ``after`` at which the schedule speaks (any entry fires).

        This is where a default manual override ends, and where the daemon's timer should be armed,
        even if the fire names the backend that already runs.
        """
        fires = self.next(after, 1)
        return fires[0] if fires else None

    def next_change(self, after: datetime) -> Fire | None:
        """The next fire strictly after ``after`` whose target differs from the one in effect then.

        What ``status`` calls "the next switch".  ``None`` when no such fire exists (every entry
        names the same backend, or entries naming others are always shadowed by later lines).
        """
        after_utc = _as_utc(after)
        current = self.in_effect(after_utc)
        target = current.target if current else None
        others = [e for e in self.entries if e.target != target]
        t = after_utc
        for _ in range(_CHANGE_SEARCH_FIRES):
            times = [u for u in (_next_fire(e, self.tz, t) for e in others) if u is not None]
            if not times:
                return None
            t = min(times)
            # A later line firing at the same instant may name the current target again.
            won = self.in_effect(t)
            if won is not None and won.target != target:
                return won
        return None

    def _winner(self, group: list[int], t: datetime) -> Fire:
        if len(group) == 1:
            e = self.entries[group[0]]
            return Fire(e, t, e.target)

        def key(i: int) -> tuple[datetime, int]:
            e = self.entries[i]
            p = _prev_fire(e, self.tz, t)
            assert p is not None and p[0] == t  # e fires at t, so its latest fire at or before t is t
            return (p[1], e.line)

        e = self.entries[max(group, key=key)]
        return Fire(e, t, e.target)


# --------------------------------------------------------------------------------------------------
# Parsing


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
        backends: the configured backend names; every entry's target must be one of them or
            ``off``.  ``None`` checks only that targets are well-formed names.
        default_tz: the zone used when the file has no ``TZ=`` line; ``None`` means the host's zone
            (:func:`host_timezone`).

    Returns:
        The schedule.

    Raises:
        ConfigError: naming the file, line, field and what was expected.
    """
    tz: ZoneInfo | None = None
    tz_line: int | None = None
    entries: list[Entry] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue

        def err(fld: str, msg: str, lineno: int = lineno) -> ConfigError:
            return ConfigError(f"{path}:{lineno}: {fld}: {msg}")

        setting = _SETTING.fullmatch(line)
        if setting:
            name, value = setting.group(1), setting.group(2).strip()
            if name != "TZ":
                raise err(name, f"unknown setting {name}= (the only setting is TZ=Area/City)")
            if tz_line is not None:
                raise err("TZ", f"TZ= is given twice (first on line {tz_line})")
            if entries:
                raise err("TZ", f"TZ= must come before the first entry (line {entries[0].line})")
            tz = _zone(value, err)
            tz_line = lineno
            continue
        entries.append(_parse_entry(line, lineno, backends, err))
    if tz is None:
        tz = default_tz if default_tz is not None else host_timezone()
    return Schedule(path=path, tz=tz, entries=tuple(entries), tz_line=tz_line)


def load_schedule(
    path: str = DEFAULT_SCHEDULE_PATH,
    backends: Collection[str] | None = None,
    default_tz: ZoneInfo | None = None,
) -> Schedule:
    """Read and parse a schedule file (see :func:`parse_schedule`).

    Raises:
        ConfigError: the file cannot be read, or it is invalid.
    """
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: schedule file not found (set [daemon] schedule in the config)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read schedule file: {e.strerror or e}") from None
    # utf-8-sig: an editor's byte-order mark must not turn the first line into garbage.
    return parse_schedule(raw.decode("utf-8-sig", errors="replace"), path, backends, default_tz)


def _zone(value: str, err: _ErrFactory) -> ZoneInfo:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1].strip()  # crontab allows quoted values
    expected = "an IANA zone name such as Asia/Shanghai or Europe/Berlin"
    if not value:
        raise err("TZ", f"missing zone (expected {expected})")
    if not _ZONE_KEY.fullmatch(value):
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


# --------------------------------------------------------------------------------------------------
# The host's zone


def host_timezone(environ: Mapping[str, str] | None = None, root: str = "/") -> ZoneInfo:
    """The host's time zone: ``$TZ``, then ``/etc/localtime``, then ``/etc/timezone``, else UTC.

    ``/etc/localtime`` comes before ``/etc/timezone`` because it is what glibc (``date``, the
    journal's timestamps) and ``timedatectl`` use; ``/etc/timezone`` is a Debian copy that can be
    stale.  A source that does not name a zone the zone database knows is skipped.

    Args:
        environ: the environment to read ``TZ`` from (default: ``os.environ``).
        root: the file-system root (tests point it at a temporary directory).
    """
    env = os.environ if environ is None else environ
    tz_env = env.get("TZ", "").strip().lstrip(":")
    if tz_env:
        zone = _zone_from_path(tz_env) if tz_env.startswith("/") else _try_zone(tz_env)
        if zone is not None:
            return zone
    localtime = os.path.join(root, "etc/localtime")
    if os.path.islink(localtime):
        zone = _zone_from_path(os.path.realpath(localtime))
        if zone is not None:
            return zone
    try:
        first = Path(root, "etc/timezone").read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        first = []
    if first:
        zone = _try_zone(first[0])
        if zone is not None:
            return zone
    if os.path.isfile(localtime):  # a copied zone file, not a link: usable, just without a name
        try:
            with open(localtime, "rb") as f:
                return ZoneInfo.from_file(f, key="localtime")
        except (OSError, ValueError):
            pass
    zone = _try_zone("UTC")
    if zone is None:
        raise ConfigError("no time zone database found (install the tzdata package)")
    return zone


def _try_zone(key: str) -> ZoneInfo | None:
    if not _ZONE_KEY.fullmatch(key):
        return None
    try:
        return ZoneInfo(key)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


def _zone_from_path(path: str) -> ZoneInfo | None:
    # /usr/share/zoneinfo/Asia/Shanghai → Asia/Shanghai (also .../zoneinfo/posix/Asia/Shanghai)
    marker = "/zoneinfo/"
    i = path.rfind(marker)
    if i < 0:
        return None
    key = path[i + len(marker) :]
    for prefix in ("posix/", "right/"):
        key = key.removeprefix(prefix)
    return _try_zone(key)


# --------------------------------------------------------------------------------------------------
# Fire times.  Wall-clock times are naive datetimes in the schedule's zone, minute-aligned.


def _as_utc(t: datetime) -> datetime:
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"expected an aware datetime, got naive {t!r}")
    return t.astimezone(UTC)


def _to_utc(wall: datetime, tz: ZoneInfo) -> datetime:
    """The one instant a matching wall-clock time fires at (the DST rule lives here).

    * exists once → that instant;
    * exists twice (fall-back night) → the first occurrence (PEP 495 ``fold=0``);
    * does not exist (spring-forward night) → the first instant after the gap.

    The mapping never goes backwards, which keeps :func:`_prev_fire` and :func:`_next_fire` exact.
    """
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if _wall(first, tz) == wall:
        return first
    # In a gap: fold=0 maps with the offset before the transition, fold=1 with the one after, so the
    # transition lies between the two.  Zone transitions fall on whole seconds: bisect for the first
    # second whose local time is at or past ``wall``.
    other = wall.replace(tzinfo=tz, fold=1).astimezone(UTC)
    lo, hi = int(min(first, other).timestamp()), int(max(first, other).timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _wall(datetime.fromtimestamp(mid, UTC), tz) >= wall:
            hi = mid
        else:
            lo = mid
    return datetime.fromtimestamp(hi, UTC)


def _wall(u: datetime, tz: ZoneInfo) -> datetime:
    return u.astimezone(tz).replace(tzinfo=None, fold=0)


def _prev_fire(e: Entry, tz: ZoneInfo, at: datetime) -> tuple[datetime, datetime] | None:
    """(instant, wall-clock time) of ``e``'s latest fire at or before ``at`` (UTC).

    Of several wall-clock times firing at one instant (a gap), the latest is returned.
    """
    try:
        local = at.astimezone(tz)
    except OverflowError:
        return None
    wall = local.replace(tzinfo=None, second=0, microsecond=0, fold=0)
    # In the second pass of a repeated hour, wall-clock times later than now already fired (at their
    # first occurrence): start beyond them and step back.
    start = wall + _MAX_SHIFT if local.fold else wall
    w = _prev_wall(e, start)
    while w is not None:
        try:
            u = _to_utc(w, tz)
        except OverflowError:
            u = None
        if u is not None and u <= at:
            return u, w
        w = _prev_wall(e, w - _MINUTE)
    return None


def _next_fire(e: Entry, tz: ZoneInfo, after: datetime) -> datetime | None:
    """The instant of ``e``'s first fire strictly after ``after`` (UTC)."""
    try:
        wall = after.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0, fold=0)
    except OverflowError:
        return None
    w = _next_wall(e, wall + _MINUTE)
    while w is not None:
        try:
            u = _to_utc(w, tz)
        except OverflowError:
            return None
        # Skips times whose first occurrence is already past (``after`` in a repeated hour).
        if u > after:
            return u
        w = _next_wall(e, w + _MINUTE)
    return None


def _next_wall(e: Entry, t: datetime) -> datetime | None:
    """The earliest matching wall-clock minute at or after ``t``."""
    d = t.date()
    if e.day_matches(d):
        hm = _first_time_from(e, t.hour, t.minute)
        if hm is not None:
            return datetime(d.year, d.month, d.day, *hm)
    nd = _next_day(e, d)
    return None if nd is None else datetime(nd.year, nd.month, nd.day, e.hours[0], e.minutes[0])


def _prev_wall(e: Entry, t: datetime) -> datetime | None:
    """The latest matching wall-clock minute at or before ``t``."""
    d = t.date()
    if e.day_matches(d):
        hm = _last_time_until(e, t.hour, t.minute)
        if hm is not None:
            return datetime(d.year, d.month, d.day, *hm)
    pd = _prev_day(e, d)
    return None if pd is None else datetime(pd.year, pd.month, pd.day, e.hours[-1], e.minutes[-1])


def _first_time_from(e: Entry, h: int, m: int) -> tuple[int, int] | None:
    i = bisect_left(e.hours, h)
    if i < len(e.hours) and e.hours[i] == h:
        j = bisect_left(e.minutes, m)
        if j < len(e.minutes):
            return h, e.minutes[j]
        i += 1
    return (e.hours[i], e.minutes[0]) if i < len(e.hours) else None


def _last_time_until(e: Entry, h: int, m: int) -> tuple[int, int] | None:
    i = bisect_right(e.hours, h) - 1
    if i >= 0 and e.hours[i] == h:
        j = bisect_right(e.minutes, m) - 1
        if j >= 0:
            return h, e.minutes[j]
        i -= 1
    return (e.hours[i], e.minutes[-1]) if i >= 0 else None


def _next_day(e: Entry, d: date) -> date | None:
    """The first day after ``d`` the entry fires on."""
    limit = d.year + _SEARCH_YEARS
    try:
        d += timedelta(days=1)
        while d.year <= limit:
            if d.month not in e.months:
                d = (d.replace(day=1) + timedelta(days=32)).replace(day=1)  # first of next month
            elif e.day_matches(d):
                return d
            else:
                d += timedelta(days=1)
    except OverflowError:  # past year 9999
        pass
    return None


def _prev_day(e: Entry, d: date) -> date | None:
    """The last day before ``d`` the entry fires on."""
    limit = d.year - _SEARCH_YEARS
    try:
        d -= timedelta(days=1)
        while d.year >= limit:
            if d.month not in e.months:
                d = d.replace(day=1) - timedelta(days=1)  # last of previous month
            elif e.day_matches(d):
                return d
            else:
                d -= timedelta(days=1)
    except OverflowError:  # before year 1
        pass
    return None

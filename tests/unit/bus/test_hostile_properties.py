"""Property tests at the borders (fixed seed: tests/conftest.py): whatever arrives — a config or
schedule file, an override.json, ledger CLI arguments, D-Bus switch arguments, a reloaded config —
the only outcomes are success or the documented error for that input (ConfigError naming file and
line, InvalidArgument, a click usage error), never another exception; and a refused input changes
nothing."""

from __future__ import annotations

import json
import re
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushift.bus import args as dbus_args
from gpushift.cli.ledger import ledger
from gpushift.config import validate
from gpushift.config.schema import parse
from gpushift.daemon.settings import flat, needs_restart, reloadable
from gpushift.errors import ConfigError, InvalidArgument
from gpushift.keeper import Override
from gpushift.keeper.store import JsonOverrideStore
from gpushift.schedule import parse_schedule

UTC = timezone.utc
BASE = """\
[daemon]
bus = "session"
poll_interval_s = 0.5
log_level = "info"
[gpu]
provider = "simulated"
residual_mib = 256
[backends.day]
unit = "day.service"
health_url = "http://127.0.0.1:8000/health"
start_timeout_s = 300
"""
KEYS = [  # (line of BASE, key) whose value the tests replace
    (3, "daemon.poll_interval_s"),
    (4, "daemon.log_level"),
    (7, "gpu.residual_mib"),
    (9, "backends.day.unit"),
    (10, "backends.day.health_url"),
    (11, "backends.day.start_timeout_s"),
]
_WEIRD = st.characters(codec="utf-8")  # every code point that UTF-8 can carry (no lone surrogates)

toml_values = st.one_of(
    st.integers(min_value=-(10**400), max_value=10**400).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(
        lambda f: {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(f), repr(f))
    ),
    st.booleans().map(lambda b: "true" if b else "false"),
    st.text(_WEIRD, max_size=300).map(json.dumps),  # a TOML basic string (JSON escapes are TOML's)
    st.lists(st.integers(-5, 2000), max_size=4).map(str),
    st.text(_WEIRD, max_size=40),  # anything at all after the '='
)


def config_error_is_placed(msg: str, path: str, lines: int) -> None:
    """``path:LINE: key: ...`` or ``path:LINE:COL: not valid TOML: ...``, LINE within the file."""
    m = re.match(rf"{re.escape(path)}:(\d+)(:\d+)?: ", msg)
    assert m, msg
    assert 1 <= int(m.group(1)) <= max(lines, 1), msg


@given(st.sampled_from(KEYS), toml_values)
@settings(max_examples=150)
def test_config_with_any_value_for_a_key_parses_or_names_the_line(where: tuple[int, str], value: str) -> None:
    line, key = where
    lines = BASE.split("\n")
    name = key.rsplit(".", 1)[1]
    lines[line - 1] = f"{name} = {value}"
    text = "\n".join(lines)
    try:
        cfg = parse(text, "/c.toml")
    except ConfigError as e:
        config_error_is_placed(str(e), "/c.toml", text.count("\n") + 1)
        return
    assert flat(cfg)  # a config that parsed is whole


@given(st.text(_WEIRD, max_size=400))
@settings(max_examples=150)
def test_config_of_any_text_parses_or_names_the_line(text: str) -> None:
    try:
        parse(text, "/c.toml")
    except ConfigError as e:
        config_error_is_placed(str(e), "/c.toml", text.count("\n") + 1)


schedule_lines = st.lists(
    st.one_of(
        st.sampled_from(["TZ=UTC", "TZ=Asia/Tokyo", "0 8 * * * day", "*/5 1-3 * 1,6 mon-fri off", "# c"]),
        st.text(_WEIRD, max_size=60),
        st.from_regex(r"except \d{4}-\d\d-\d\d( \d\d:\d\d)?\.\.\d{4}-\d\d-\d\d day", fullmatch=True),
    ),
    max_size=8,
)


@given(schedule_lines, st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)))
@settings(max_examples=150)
def test_schedule_of_any_lines_parses_or_names_the_line_and_never_overflows(
    lines: list[str], at: datetime
) -> None:
    text = "\n".join(lines)
    try:
        s = parse_schedule(text, "/s", backends={"day"})
    except ConfigError as e:
        m = re.match(r"/s:(\d+): ", str(e))
        assert m and 1 <= int(m.group(1)) <= len(text.split("\n")), str(e)
        return
    when = at.replace(tzinfo=UTC)
    s.next(when, 3)
    s.in_effect(when)
    s.next_boundary(when)


GOOD_OVERRIDE = Override.from_dict(
    {"mode": "hold", "backend": "day", "set_by": "a", "set_at": "2026-03-02T11:00:00+00:00"}
).to_dict()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(_WEIRD, max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
override_files = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(sorted(GOOD_OVERRIDE)), json_values).map(
        lambda d: json.dumps({**GOOD_OVERRIDE, **d}).encode()
    ),
)
_TMP = Path(tempfile.mkdtemp(prefix="gpushift-props-"))


@given(override_files)
@settings(max_examples=200)
def test_override_file_of_any_content_is_used_or_ignored_never_raises(content: bytes) -> None:
    path = _TMP / "override.json"
    path.write_bytes(content)
    store = JsonOverrideStore(path, backends={"day"})
    ov = store.load()
    if ov is None:
        assert store.ignored is not None or json.loads(content) in ({}, None) or content.strip() == b"{}"
    else:
        assert store.ignored is None
        assert ov.set_at.utcoffset() is not None and (ov.until is None or ov.until.utcoffset() is not None)
        ov.ended(datetime.now(UTC))  # comparable with the clock: the crash of a naive time
    assert path.read_bytes() == content  # reading never rewrites it


_LEDGER_CFG = _TMP / "gpushift.toml"
_LEDGER_CFG.write_text(
    f'[daemon]\nstate_dir = "{_TMP}/state"\nruntime_dir = "{_TMP}/run"\nschedule = ""\n'
    '[backends.day]\nunit = "day.service"\nhealth_url = "http://127.0.0.1:1/h"\n',
    encoding="utf-8",
)
cli_args = st.one_of(
    st.tuples(st.just("--limit"), st.one_of(st.integers().map(str), st.text(max_size=10))),
    st.tuples(
        st.just("--since"), st.one_of(st.from_regex(r"\d{1,30}[mhdw]", fullmatch=True), st.text(max_size=20))
    ),
    st.tuples(st.just("--backend"), st.text(_WEIRD, max_size=70)),
    st.tuples(st.just("show"), st.one_of(st.integers().map(str), st.text(max_size=10))),
    st.tuples(st.just("diff"), st.integers().map(str), st.integers().map(str)),
)


@given(cli_args)
@settings(max_examples=120)
def test_ledger_cli_arguments_end_in_an_answer_or_a_usage_error(args: tuple[str, ...]) -> None:
    r = CliRunner().invoke(ledger, list(args), obj={"config_path": str(_LEDGER_CFG)})
    assert r.exit_code in (0, 2, 11), (args, r.exit_code, r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, repr(r.exception))


@given(
    st.text(_WEIRD, max_size=70),
    st.one_of(
        st.text(_WEIRD, max_size=80),
        json_values.map(json.dumps),
        st.dictionaries(
            st.sampled_from(["reason", "now", "hold", "until", "restart", "when_idle", "x"]), json_values
        ).map(json.dumps),
    ),
)
@settings(max_examples=200)
def test_dbus_switch_arguments_are_checked_options_or_invalid_argument(backend: str, extra: str) -> None:
    """What Switch and SwitchWithOptions run before anything changes (``dbus_args.check``; the
    handlers' use of it: tests/contract/bus/test_dbus_arguments.py)."""
    for method in ("Switch", "SwitchWithOptions"):
        try:
            options = dbus_args.check(method, backend, extra)
        except InvalidArgument as e:
            assert str(e) and len(str(e)) < 400
            continue
        assert validate.name_problem(backend) is None
        assert set(options) <= set(validate.SWITCH_OPTIONS)
        assert validate.line_problem(options["reason"], validate.REASON_MAX) is None


RELOAD_CHANGES = {
    "poll_interval_s = 0.5": ["poll_interval_s = 1.5", "daemon.poll_interval_s"],
    'log_level = "info"': ['log_level = "debug"', "daemon.log_level"],
    "residual_mib = 256": ["residual_mib = 512", "gpu.residual_mib"],
    'bus = "session"': ['bus = "system"', "daemon.bus"],
    "start_timeout_s = 300": ["start_timeout_s = 30", "backends.day"],
}


@given(st.sets(st.sampled_from(sorted(RELOAD_CHANGES))))
@settings(max_examples=40)
def test_reload_applies_exactly_what_changed_or_names_what_needs_a_restart(changes: set[str]) -> None:
    text = BASE.replace('provider = "simulated"', 'provider = "nvml"')
    old = parse(text, "/c.toml")
    for line in changes:
        text = text.replace(line, RELOAD_CHANGES[line][0])
    new = parse(text, "/c.toml")
    keys = sorted(RELOAD_CHANGES[line][1] for line in changes)
    restart = [k for k in keys if needs_restart(k)]
    try:
        assert reloadable(old, new) == keys and not restart
    except ConfigError as e:
        assert restart and all(k in str(e) for k in restart), str(e)
    assert flat(old) == flat(parse(BASE.replace('provider = "simulated"', 'provider = "nvml"'), "/c.toml"))


def test_the_fixed_seed_profile_is_loaded() -> None:
    assert settings().derandomize and settings().database is None

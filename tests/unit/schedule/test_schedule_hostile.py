"""A schedule file as a careless admin or a hostile user writes it: line numbers in errors stay
right whatever the file holds, control characters and overlong lines outside comments are refused
with their line, and computing the next switch near the end of what a datetime holds ends the
list instead of raising OverflowError."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest

from gpushift.errors import ConfigError
from gpushift.schedule import parse_schedule

UTC = timezone.utc
BACKENDS = {"day", "night"}


def error(text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_schedule(text, "/etc/gpushift/schedule", backends=BACKENDS)
    return str(exc.value)


@pytest.mark.parametrize("odd", ["\x0c", "\u2028", "\u2029", "\x1c", "\x1d", "\x1e", "\x85", "\x0b"])
def test_line_numbers_count_newlines_only(odd: str) -> None:
    """A form feed, a vertical tab or U+2028 in a comment ended a line for str.splitlines, so every
    error after it named the wrong line."""
    msg = error(f"TZ=UTC\n# a comment{odd}with more\n0 8 * * * nosuch\n")
    assert msg.startswith("/etc/gpushift/schedule:3: backend: "), msg


@pytest.mark.parametrize("bad", ["\x1b[2J", "\x00", "\x7f", "\u202e", "\x0c", "\u2028"])
def test_control_characters_outside_comments_are_refused_with_their_line(bad: str) -> None:
    msg = error(f"TZ=UTC\n0 8 * * * day\n0 20 * * * ni{bad}ght\n")
    assert re.match(r"/etc/gpushift/schedule:3: line: control or formatting character U\+[0-9A-F]{4}", msg), (
        msg
    )


def test_a_line_over_1000_characters_is_refused() -> None:
    msg = error("TZ=UTC\n0 8 * * * day" + " " * 1000 + "x\n")
    assert msg.startswith("/etc/gpushift/schedule:2: line: longer than 1000 characters"), msg
    # a long comment is a comment
    assert parse_schedule("# " + "x" * 5000 + "\n0 8 * * * day\n", "s", backends=BACKENDS).entries


def test_tabs_and_crlf_are_what_editors_write() -> None:
    s = parse_schedule("TZ=UTC\r\n0\t8\t*\t*\t*\tday\r\n", "s", backends=BACKENDS)
    assert s.entries[0].target == "day"


@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Pacific/Kiritimati"])
def test_next_switch_near_year_9999_ends_the_list_instead_of_overflowing(zone: str) -> None:
    s = parse_schedule(f"TZ={zone}\n0 8 * * * day\n0 20 * * * night\n", "s", backends=BACKENDS)
    end = datetime(9999, 12, 31, 23, 59, tzinfo=UTC)
    assert s.next(end, 5) == []
    assert s.next_boundary(end) is None
    assert len(s.next(end - timedelta(days=2), 50)) < 50
    s.in_effect(datetime(1, 1, 1, tzinfo=UTC))  # the other end: no OverflowError either

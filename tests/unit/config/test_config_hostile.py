"""The config file as a careless admin or a hostile user writes it: names by their rules, every
number bounded, strings of one plain line, URLs with a host and a port, and files that are not
what they seem.  Every refusal is a ConfigError naming file, line and key (TOML errors: line and
column); nothing ends in a traceback or blocks."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from gpushift.config.schema import load, parse
from gpushift.errors import ConfigError

PATH = "/etc/gpushift/t.toml"


def backend(unit: str = "x.service", url: str = "http://127.0.0.1:8000/health", name: str = "x") -> str:
    return f'[backends.{name}]\nunit = "{unit}"\nhealth_url = "{url}"\n'


def refused(text: str) -> str:
    with pytest.raises(ConfigError) as exc:
        parse(text, PATH)
    assert exc.value.code == 2
    return str(exc.value)


@pytest.mark.parametrize(
    "unit", ["a.service", "foo@bar.service", "x-y_z:1.service", "a\\\\x2d.service", "u" * 247 + ".service"]
)
def test_unit_names_systemd_accepts_are_accepted(unit: str) -> None:
    assert parse(backend(unit), PATH).backends["x"].unit == unit.replace("\\\\", "\\")


@pytest.mark.parametrize(
    ("unit", "why"),
    [
        ("../x.service", "ASCII letters"),
        ("x y.service", "ASCII letters"),
        ("foo@.service", "template"),
        ("@x.service", "a name before"),
        ("x.socket", "ending in .service"),
        ("gpushift-x", "ending in .service"),
        ("a@b@c.service", "at most one '@'"),
        ("u" * 248 + ".service", "longer than 255"),
        ("é.service", "ASCII letters"),
    ],
)
def test_unit_names_outside_systemd_s_rules_are_refused(unit: str, why: str) -> None:
    msg = refused(backend(unit))
    assert re.match(rf"{PATH}:2: backends\.x\.unit: ", msg) and why in msg, msg


@pytest.mark.parametrize("name", ["-h", "--now", "-", "a" * 65, '"a b"', '"é"'])
def test_backend_names_that_read_as_options_or_break_the_rule_are_refused(name: str) -> None:
    msg = refused(backend(name=name))
    assert re.match(rf"{PATH}:1: backends\.", msg) and "backend name" in msg, msg


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[gpu]\nresidual_mib = 1e300\n", "gpu.residual_mib"),
        ("[daemon]\npoll_interval_s = 1e10\n", "daemon.poll_interval_s"),
        ("[daemon]\nstop_timeout_s = 86401\n", "daemon.stop_timeout_s"),
        ("[gpu]\nresidual_mib = " + "9" * 400 + "\n", "gpu.residual_mib"),
        ("[daemon]\nmax_attempts = -" + "9" * 400 + "\n", "daemon.max_attempts"),
    ],
)
def test_numbers_beyond_their_maximum_are_refused_without_overflow(text: str, key: str) -> None:
    msg = refused(text + backend())
    assert re.match(rf"{PATH}:2: {re.escape(key)}: expected a value [<>]=", msg), msg
    assert len(msg) < 300  # a number of hundreds of digits is not repeated in full


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('[daemon]\nallowed_group = "gpu\\u001b[2J"\n', "daemon.allowed_group"),
        ('[daemon]\nstate_dir = "/var/lib/x\\ny"\n', "daemon.state_dir"),
        ('[daemon]\nschedule = "/etc/s\\u202e"\n', "daemon.schedule"),
        ('[gpu]\naccepted_gpu_uuids = ["GPU-1\\u0007"]\n', "gpu.accepted_gpu_uuids"),
        ('[hooks]\nafter_ready = ["/bin/echo", "a\\nb"]\n', "hooks.after_ready"),
    ],
)
def test_strings_of_more_than_one_plain_line_are_refused(text: str, key: str) -> None:
    msg = refused(text + backend())
    assert re.match(rf"{PATH}:2: {re.escape(key)}: ", msg) and "control or formatting character" in msg, msg


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://", "host"),
        ("http://:8000/health", "host"),
        ("http://127.0.0.1:99999/health", "port"),
        ("http://127.0.0.1:0/health", "port"),
        ("ftp://h/x", "http://"),
        ("http://h/ x", "spaces"),
    ],
)
def test_urls_need_a_host_and_a_valid_port(url: str, why: str) -> None:
    msg = refused(backend(url=url))
    assert re.match(rf"{PATH}:3: backends\.x\.health_url: ", msg) and why in msg, msg


def test_errors_name_the_key_s_line_or_the_table_s_line() -> None:
    text = "# comment\n\n[daemon]\nbus = 'session'\non_failure = 'retry'\n" + backend()
    assert refused(text).startswith(f"{PATH}:5: daemon.on_failure: ")
    missing = "[daemon]\nbus = 'session'\n\n[backends.x]\nhealth_url = 'http://h:1/'\n"
    assert refused(missing).startswith(f"{PATH}:4: backends.x.unit: missing")
    assert refused("[daemon]\nbus = \n").startswith(f"{PATH}:2:7: not valid TOML: ")


def test_a_bom_is_accepted(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_bytes(b"\xef\xbb\xbf" + backend().encode())
    assert list(load(str(f)).backends) == ["x"]


def test_bytes_that_are_not_utf8_are_named_by_line_and_offset(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_bytes(b"[daemon]\nallowed_group = 'g\xff'\n" + backend().encode())
    with pytest.raises(ConfigError) as exc:
        load(str(f))
    assert str(exc.value) == f"{f}:2: not UTF-8: byte 0xff at offset 27"


def test_nesting_that_exhausts_the_parser_is_a_clean_error() -> None:
    for deep in ("a = " + "[" * 100000 + "]" * 100000, "a = " + "{b = " * 5000 + "1" + "}" * 5000):
        assert refused(deep).startswith(f"{PATH}:1:1: not valid TOML: ")


@pytest.mark.timeout(20)
def test_files_that_are_not_regular_files_are_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # nobody writes: an open for reading without O_NONBLOCK would block
    for path, what in (
        (str(fifo), "a FIFO"),
        (str(tmp_path), "a directory"),
        ("/dev/zero", "a character device"),
    ):
        with pytest.raises(ConfigError, match=f"is {what}, not a regular file"):
            load(path)
    big = tmp_path / "big.toml"
    big.write_bytes(b"# " + b"x" * (1024 * 1024) + b"\n")
    with pytest.raises(ConfigError, match="larger than 1048576 bytes"):
        load(str(big))
    with pytest.raises(ConfigError, match="holds a NUL"):
        load(str(tmp_path) + "/a\0b.toml")

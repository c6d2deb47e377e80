"""gpushift.config.validate: the one set of rules for names, reasons and a switch's options (the D-Bus
methods, the command line and the config apply them)."""

from __future__ import annotations

import json

import pytest

from gpushift.config import validate
from gpushift.errors import InvalidArgument


@pytest.mark.parametrize("name", ["a", "vllm", "llama_2-b", "A9", "_x", "off", "9", "x" * 64])
def test_backend_names_accepted(name: str) -> None:
    assert validate.name_problem(name) is None
    assert validate.backend_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "-h", "--now", "a b", "a.b", "../x", "x" * 65, "é", "a\x00", "a\n", "ａ", "a/b", 5, None]
)
def test_backend_names_refused(name: object) -> None:
    assert validate.name_problem(name) is not None
    with pytest.raises(InvalidArgument, match="backend"):
        validate.backend_name(name)


@pytest.mark.parametrize(
    "text",
    ["\x1b[2J", "a\nb", "a\rb", "\t", "\x7f", "\x9b", "\u202e", "\u2066", "\u2028", "\ud800", "x" * 1001],
)
def test_reasons_refused(text: str) -> None:
    with pytest.raises(InvalidArgument, match="reason"):
        validate.reason(text)


def test_reasons_accepted() -> None:
    for text in ("", "nightly batch", "r" * 1000, "déjà vu 日本", "a\\x1b"):
        assert validate.reason(text) == text


def test_options_json_nested_deeply_is_invalid_argument_not_recursion_error() -> None:
    deep = "[" * 4000 + "]" * 4000
    with pytest.raises(InvalidArgument, match="nested deeper than 64|longer than"):
        validate.options_json('{"reason": ' + deep[:4000] + "}")
    with pytest.raises(InvalidArgument):
        validate.options_json("[" * 3000 + "]" * 3000)


def test_switch_options_known_keys_and_types() -> None:
    assert validate.switch_options({}) == {"reason": ""}
    assert validate.options_json(json.dumps({"now": True, "until": None})) == {"now": True, "reason": ""}
    with pytest.raises(InvalidArgument, match="option 'x': unknown"):
        validate.switch_options({"x": 1})
    with pytest.raises(InvalidArgument, match="option hold: expected bool"):
        validate.switch_options({"hold": 1})
    with pytest.raises(InvalidArgument, match="exclude"):
        validate.switch_options({"hold": True, "until": "2030-01-01"})


def test_nesting_is_counted_outside_strings_and_comments() -> None:
    assert validate.nesting_problem('{"reason": "' + "[" * 200 + '"}') is None
    assert validate.nesting_problem('{"r": "\\"' + "[" * 200 + '"}') is None
    assert validate.nesting_problem("[" * 64 + "]" * 64) is None
    assert validate.nesting_problem("[" * 65) == "nested deeper than 64 levels"
    toml = "# " + "[" * 100 + "\na = '" + "{" * 100 + "'\nb = [[1]]\n"
    assert validate.nesting_problem(toml, comments=True) is None
    assert validate.nesting_problem(toml) is not None  # in JSON, # and ' are not special
    assert validate.options_json(json.dumps({"reason": "[" * 500})) == {"reason": "[" * 500}

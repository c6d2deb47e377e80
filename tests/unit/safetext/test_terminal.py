"""Text from outside made safe for a terminal (gpushift/safetext/terminal.py): every character a terminal
obeys comes out as a visible escape, nothing else changes, and JSON stays the same JSON."""

from __future__ import annotations

import json
import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from gpushift.safetext import terminal

BIDI_AND_SEPARATORS = "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def obeyed(c: str) -> bool:
    """A character a terminal may act on: a control (C0, DEL, C1), a separator or bidi control, a
    lone surrogate."""
    return unicodedata.category(c) in ("Cc", "Cs") or c in BIDI_AND_SEPARATORS


def test_terminal_escape_shows_escape_sequences_as_text() -> None:
    hostile = "night\x1b]52;c;ZXZpbA==\x07 \x1b[2J\x1b]0;owned\x07\r\nfake line\x9b31m\x7f"
    assert terminal.escape(hostile) == (
        "night\\x1b]52;c;ZXZpbA==\\x07 \\x1b[2J\\x1b]0;owned\\x07\\r\\nfake line\\x9b31m\\x7f"
    )


def test_terminal_escape_bidi_controls_and_undecodable_bytes() -> None:
    assert terminal.escape("abc\u202edcba\u2028") == "abc\\u202edcba\\u2028"
    raw = b"llama\xff\xfe".decode("utf-8", "surrogateescape")  # an argv that was not UTF-8
    assert terminal.escape(raw) == "llama\\xff\\xfe"


def test_terminal_escape_leaves_ordinary_text_alone() -> None:
    for text in ("vllm → llama", "Qwen2.5-7B-Instruct", "日本語 ok", "C:\\path", "tab-free", ""):
        assert terminal.escape(text) == text


def test_terminal_escape_keep_newlines_for_a_whole_output() -> None:
    assert terminal.escape("line 1\nline\x1b 2\n", keep_newlines=True) == "line 1\nline\\x1b 2\n"


def test_terminal_escape_tree_escapes_keys_and_values_keeps_numbers() -> None:
    tree = {"a\x1b": ["x\ny", 3, None, {"k": "\x07"}], "n": 1.5}
    assert terminal.escape_tree(tree) == {"a\\x1b": ["x\\ny", 3, None, {"k": "\\x07"}], "n": 1.5}


def test_terminal_json_safe_keeps_the_value_and_hides_what_json_leaves_raw() -> None:
    value = {"reason": "x\x7f\x9b[31m\u202e\x1b\n", "by": "名前"}
    text = json.dumps(value, ensure_ascii=False)
    assert "\x9b" in text  # what json.dumps leaves raw with ensure_ascii=False
    safe = terminal.json_safe(text)
    assert json.loads(safe) == value and not any(obeyed(c) for c in safe)
    assert "名前" in safe  # ordinary non-ASCII stays readable


@given(st.text())
def test_terminal_escaped_text_never_holds_a_character_a_terminal_obeys(text: str) -> None:
    out = terminal.escape(text)
    assert not any(obeyed(c) for c in out)
    if not any(obeyed(c) for c in text):
        assert out == text


@given(st.text())
def test_terminal_keep_newlines_holds_no_control_but_newlines(text: str) -> None:
    assert not any(obeyed(c) and c != "\n" for c in terminal.escape(text, keep_newlines=True))


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    )
)
def test_terminal_json_safe_is_the_same_json_with_nothing_a_terminal_obeys(value: object) -> None:
    text = terminal.json_safe(json.dumps(value, ensure_ascii=False))
    assert json.loads(text) == value
    assert not any(obeyed(c) for c in text)


JSON_LIKE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
)


@given(JSON_LIKE)
def test_terminal_needs_escape_is_false_only_when_escaping_changes_nothing(value: object) -> None:
    # the fast path of the ledger's reports: a record whose JSON text needs no escape is shown as it is
    if not terminal.needs_escape(json.dumps(value, ensure_ascii=False)):
        assert terminal.escape_tree(value) == value

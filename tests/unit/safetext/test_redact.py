"""Credentials hidden wherever they could surface (gpushift/safetext/redact.py): command lines, environments,
URLs, free text, whole JSON-like values; masked or digested, idempotently — and (property tests) no
output format of a redacted value ever holds the secret."""

from __future__ import annotations

import json

from hypothesis import example, given
from hypothesis import strategies as st

from gpushift.safetext import redact
from gpushift.safetext.redact import MASK, digest

ARGV = ["/opt/vllm/bin/vllm", "serve", "/m", "--api-key", "s3cret", "--hf-token=hf_x", "--port", "8000"]


def test_redact_argv_digest_keeps_a_change_visible_and_is_idempotent() -> None:
    once = redact.redact_argv(ARGV, "digest")
    assert once[4] == digest("s3cret") and once[5] == "--hf-token=" + digest("hf_x")
    assert redact.redact_argv(once, "digest") == once  # a new row's digest stays as it is
    assert redact.redact_argv(once) == once  # masking a digest changes nothing either
    assert redact.redact_argv(["x", "--api-key", "other"], "digest")[2] != once[4]


def test_redact_argv_variables_and_urls_on_the_command_line() -> None:
    argv = ["env", "HF_TOKEN=hf_x", "OMP_NUM_THREADS=4", "vllm", "--model", "https://me:pw@hub.example/m"]
    assert redact.redact_argv(argv) == [
        "env",
        f"HF_TOKEN={MASK}",
        "OMP_NUM_THREADS=4",
        "vllm",
        "--model",
        f"https://{MASK}@hub.example/m",
    ]


def test_redact_environment_masks_secret_names_only() -> None:
    env = {"HF_TOKEN": "hf_x", "DB_PASSWORD": "pw", "CUDA_VISIBLE_DEVICES": "0,1", "EMPTY_KEY": ""}
    assert redact.redact_environment(env) == {
        "HF_TOKEN": MASK,
        "DB_PASSWORD": MASK,
        "CUDA_VISIBLE_DEVICES": "0,1",
        "EMPTY_KEY": "",
    }


def test_redact_text_every_form_a_credential_takes_in_prose() -> None:
    cases = {
        "ExecStart=vllm serve m --api-key s3cret --port 8000": "ExecStart=vllm serve m --api-key *** --port 8000",
        "--hf-token=hf_x": "--hf-token=***",
        "Environment=HF_TOKEN=hf_x": "Environment=HF_TOKEN=***",
        "HF_TOKEN='a b' next": "HF_TOKEN='***' next",
        "GET http://probe:pw@127.0.0.1:8000/health": "GET http://***@127.0.0.1:8000/health",
        "Authorization: Bearer sk-abcdef123": "Authorization: Bearer ***",
        '{"api_key": "sk-1", "port": 8000}': '{"api_key": "***", "port": 8000}',
        "non-default args: {'api_key': ['sk-1'], 'port': 8000}": "non-default args: {'api_key': '***', 'port': 8000}",
        "Launch(argv=['vllm', '--api-key', 'sk-1', '--port', '1'])": "Launch(argv=['vllm', '--api-key', '***', '--port', '1'])",
    }
    for text, want in cases.items():
        assert redact.redact_text(text) == want, text


def test_redact_text_leaves_look_alikes_and_digests() -> None:
    for text in (
        "--max-num-batched-tokens 8192 --ssl-keyfile /k.pem",
        "max_tokens=4",
        "--api-key --port 1",  # no value: the next word is an option
        f"--api-key '{digest('s3cret')}'",  # a digest shows that it changed: it stays
        "plain words, 12:00, a-b",
    ):
        assert redact.redact_text(text) == text, text


def test_redact_tree_covers_records_status_and_diff_items() -> None:
    tree = {
        "argv_running": ARGV,
        "gpus": [{"holders": [{"command": "vllm", "cmdline": ARGV}]}],
        "extra": {"launch": {"unit": {"environment": {"HF_TOKEN": "hf_x", "A": "1"}}}},
        "message": "vllm exited: --api-key s3cret refused",
        "changes": [{"area": "env", "name": "HF_TOKEN", "old": "hf_old", "new": "hf_x"}],
        "count": 3,
    }
    out = redact.redact_tree(tree, "digest")
    text = json.dumps(out)
    for secret in ("s3cret", "hf_x", "hf_old"):
        assert secret not in text
    assert out["extra"]["launch"]["unit"]["environment"] == {"HF_TOKEN": digest("hf_x"), "A": "1"}
    assert out["changes"][0]["old"] != out["changes"][0]["new"]  # the change still shows
    assert out["count"] == 3 and tree["argv_running"][4] == "s3cret"  # the input is not changed
    assert redact.redact_tree(out, "digest") == out


# --------------------------------------------------------------------------- properties

SECRET = st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=6, max_size=24).map(lambda s: "Zq9" + s)
WORD = st.text("abcdefghijklmnopqrstuvwxyz0123456789/.:-_", min_size=1, max_size=12).filter(
    lambda w: not redact.is_secret_name(w)
)
SECRET_OPTION = st.sampled_from(["--api-key", "--hf-token", "--api_key", "--db-password", "--client-secret"])
SECRET_VAR = st.sampled_from(["HF_TOKEN", "OPENAI_API_KEY", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY"])


@st.composite
def argv_with_secret(draw: st.DrawFn) -> tuple[list[str], str]:
    secret = draw(SECRET)
    words = draw(st.lists(WORD, max_size=8))
    form = draw(st.sampled_from(["split", "equals", "var", "url"]))
    if form == "split":
        inserted = [draw(SECRET_OPTION), secret]
    elif form == "equals":
        inserted = [f"{draw(SECRET_OPTION)}={secret}"]
    elif form == "var":
        inserted = [f"{draw(SECRET_VAR)}={secret}"]
    else:
        inserted = [f"http://user:{secret}@127.0.0.1:8000/health"]
    at = draw(st.integers(0, len(words)))
    return words[:at] + inserted + words[at:], secret


@given(argv_with_secret(), st.sampled_from(["mask", "digest"]))
# Found by this test: a short option before the secret one took it as its value (in list form).
@example((["-a", "--api-key", "Zq9000000"], "Zq9000000"), "mask")
def test_redact_no_output_format_of_a_redacted_argv_holds_the_secret(
    case: tuple[list[str], str], how: redact.How
) -> None:
    argv, secret = case
    shown = redact.redact_argv(argv, how)
    joined = " ".join(argv)
    outputs = [
        " ".join(shown),
        json.dumps(shown),
        json.dumps(redact.redact_tree({"argv": argv, "nested": [{"cmdline": argv}]}, how)),
        redact.redact_text(joined),  # the command line as one line of prose (a log, a message)
        redact.redact_text(json.dumps(argv)),  # ... printed as a JSON list
        redact.redact_text(repr(argv)),  # ... as a Python list (an object's text in a log line)
        json.dumps(redact.redact_tree({"message": f"exited: {joined}"}, how)),
    ]
    for out in outputs:
        assert secret not in out, out


@given(SECRET_VAR, SECRET, st.sampled_from(["mask", "digest"]))
def test_redact_no_output_of_an_environment_holds_the_secret(name: str, secret: str, how: redact.How) -> None:
    tree = {"unit": {"environment": {name: secret, "PATH": "/usr/bin"}}, "env": [f"{name}={secret}"]}
    out = redact.redact_tree(tree, how)
    assert secret not in json.dumps(out) and out["unit"]["environment"]["PATH"] == "/usr/bin"


@given(st.text())
def test_redact_text_is_idempotent(text: str) -> None:
    once = redact.redact_text(text)
    assert redact.redact_text(once) == once


JSON_LIKE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | argv_with_secret().map(lambda c: c[0]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text() | SECRET_VAR | SECRET_OPTION | st.just("name"), inner, max_size=4)
    ),
)


@given(JSON_LIKE)
def test_redact_may_hold_secret_is_false_only_when_redaction_changes_nothing(value: object) -> None:
    # the fast path of the ledger's reader: a record whose text holds no secret-looking word is kept
    if not redact.may_hold_secret(json.dumps(value, ensure_ascii=False)):
        assert redact.redact_tree(value, "digest") == redact.redact_tree(value) == _lists(value)


def _lists(value: object) -> object:
    """``value`` with tuples as lists (what redact_tree returns)."""
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    return value

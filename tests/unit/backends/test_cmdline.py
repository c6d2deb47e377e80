"""The one parser of a backend's command line (gpushift/backends/cmdline.py) and the secret patterns
(gpushift/safetext/redact.py): pure functions, plain values."""

from __future__ import annotations

import pytest

from gpushift.backends import cmdline
from gpushift.safetext import redact


def test_cmdline_expand_follows_systemd_rules() -> None:
    env = {"MODEL": "/models/a b", "ARGS": "--dtype float16  -tp 2", "PORT": "8000"}
    argv = [
        "/bin/x",
        "--model",
        "${MODEL}",
        "$ARGS",
        "--port=${PORT}",
        "$$HOME",
        "${UNSET}",
        "$UNSET",
        "a$ARGS",
    ]
    assert cmdline.expand(argv, env) == [
        "/bin/x",
        "--model",
        "/models/a b",  # ${VAR}: one word, whitespace kept
        "--dtype",  # $VAR as a word: split at whitespace
        "float16",
        "-tp",
        "2",
        "--port=8000",
        "$HOME",  # $$ is a literal $
        "",  # ${UNSET}: an empty word
        "a$ARGS",  # $VAR inside a word is not expanded
    ]


def test_cmdline_value_forms_and_last_wins() -> None:
    argv = ["prog", "--dtype", "bfloat16", "--port=1", "--dtype=float16", "--trailing"]
    assert cmdline.parse(argv).value(["--dtype"]) == "float16"
    assert cmdline.parse(argv).value(["--port"]) == "1"
    assert cmdline.parse(argv).value(["--trailing"]) is None
    assert cmdline.parse(["--dtype", "x"]).value(["--dtype"]) is None  # argv[0] is the program


def test_cmdline_parse_forms() -> None:
    cl = cmdline.parse(["python3", "-m", "vllm.x", "serve", "--a=1", "--b", "2", "--flag", "-c", "-5"])
    assert cl.program == "python3 -m vllm.x" and cl.positional == ("serve",)
    assert cl.flags() == {"--a": ["1"], "--b": ["2"], "--flag": [None], "-c": ["-5"]}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["llama-server", "-m", "/m/q.gguf", "-ngl", "99"], [("-m", "/m/q.gguf")]),
        (
            ["llama-server", "--model=/m/q.gguf", "--mmproj", "/m/p.gguf"],
            [("--model", "/m/q.gguf"), ("--mmproj", "/m/p.gguf")],
        ),
        (["llama-server", "-m", "a.gguf", "-mm", "b.gguf"], [("-m", "a.gguf"), ("-mm", "b.gguf")]),
        # python's own -m names a module, not a model
        (
            ["/opt/v/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m/Qwen"],
            [("--model", "/m/Qwen")],
        ),
        (["/opt/v/bin/python3.11", "-u", "-m", "mod", "-m", "/m/x.gguf"], [("-m", "/m/x.gguf")]),
        (["vllm", "serve", "/m/Qwen", "--dtype", "float16"], [("serve", "/m/Qwen")]),
        (["llama-server", "-ngl", "99"], []),
    ],
)
def test_cmdline_model_files_forms(argv: list[str], expected: list[tuple[str, str]]) -> None:
    assert cmdline.model_files(argv) == expected


def test_cmdline_vllm_reads_underscores_as_dashes_and_serve_model() -> None:
    argv = ["vllm", "serve", "/m/Qwen", "--tensor_parallel_size", "2"]
    assert cmdline.parse(argv, "vllm").value(["--tensor-parallel-size", "-tp"]) == "2"
    assert cmdline.parse(argv).value(["--tensor-parallel-size"]) is None  # other kinds: as written
    assert cmdline.vllm_model(argv) == "/m/Qwen"
    assert cmdline.vllm_model([*argv, "--model", "/m/Other"]) == "/m/Other"


def test_cmdline_interpreter_m_is_not_a_model_flag() -> None:
    cl = cmdline.parse(["python3", "-u", "-m", "srv", "-m", "/m/x.gguf"], "llama-server")
    assert cl.program == "python3 -u -m srv"
    assert cl.values(cmdline.MODEL_FILE_FLAGS) == ["/m/x.gguf"]


def test_cmdline_join_quotes_for_a_shell_and_wraps_options() -> None:
    argv = ["llama-server", "-m", "/m/a b.gguf", "--alias", "it's"]
    assert cmdline.join(argv) == "llama-server -m '/m/a b.gguf' --alias 'it'\"'\"'s'"
    assert cmdline.join(argv, wrap=True) == "llama-server \\\n  -m '/m/a b.gguf' \\\n  --alias 'it'\"'\"'s'"


@pytest.mark.parametrize(
    "name",
    [
        "--api-key",
        "--hf-token",
        "HF_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "PASSWD",
        "OPENAI_API_KEY",
        "GOOGLE_APPLICATION_CREDENTIALS",
    ],
)
def test_redact_secret_names(name: str) -> None:
    assert redact.is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    ["--model", "--port", "MODEL", "CUDA_VISIBLE_DEVICES", "--max-num-batched-tokens", "--ssl-keyfile"],
)
def test_redact_plain_names(name: str) -> None:
    assert not redact.is_secret_name(name)


def test_redact_argv_masks_values_of_credential_options() -> None:
    argv = ["vllm", "serve", "m", "--api-key", "s3cret", "--hf-token=hf_x", "--port", "8000"]
    assert redact.redact_argv(argv) == [
        "vllm",
        "serve",
        "m",
        "--api-key",
        "***",
        "--hf-token=***",
        "--port",
        "8000",
    ]
    assert redact.digest("a") == redact.digest("a") != redact.digest("b")


def test_cmdline_environment_file_reads_what_systemd_reads() -> None:
    text = (
        "# a comment\n"
        "; another\n"
        "\n"
        "PORT=8081\n"
        "  MODEL = /models/q.gguf  \n"
        'QUOTED="a b"\n'
        "SINGLE='c d'\n"
        "LONG=one \\\n"
        "two\n"
        "not a variable=1\n"
        "NOEQUALS\n"
        "PORT=8082\n"
    )
    assert cmdline.environment_file(text) == {
        "PORT": "8082",
        "MODEL": "/models/q.gguf",
        "QUOTED": "a b",
        "SINGLE": "c d",
        "LONG": "one two",
    }

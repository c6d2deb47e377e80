"""A backend's model names (gpushift/backends/models.py): the config's ``models`` wins; else the
kind reads them from the unit's command line through the one parser; compared with /v1/models."""

from __future__ import annotations

import pytest

from gpushift.backends import cmdline, models
from gpushift.backends.kinds import kind_of

VLLM = ["/opt/vllm/bin/vllm", "serve", "/models/qwen2.5-7b", "--port", "8001"]


def test_a_multi_value_option_takes_every_word_up_to_the_next_flag() -> None:
    cl = cmdline.parse([*VLLM, "--served-model-name", "qwen", "qwen-7b", "--dtype", "float16"], "vllm")
    assert cl.group(["--served-model-name"]) == ("qwen", "qwen-7b")
    assert cl.value(["--dtype"]) == "float16"
    assert cl.subcommand_argument == "/models/qwen2.5-7b"
    assert "qwen-7b" not in cl.positional  # not taken for a positional word any more
    # argparse keeps the last occurrence's list; the underscore spelling is the same option
    cl = cmdline.parse([*VLLM, "--served-model-name", "a", "--served_model_name=b"], "vllm")
    assert cl.group(["--served-model-name"]) == ("b",)
    assert cmdline.parse(VLLM, "vllm").group(["--served-model-name"]) is None
    # other kinds read it as a one-value option
    assert cmdline.parse(["/bin/x", "--served-model-name", "a", "b"]).positional == ("b",)


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        ([*VLLM, "--served-model-name", "qwen", "qwen-7b"], ("qwen", "qwen-7b")),
        (VLLM, ("/models/qwen2.5-7b",)),  # serve MODEL: the model as given
        (
            ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "Qwen/Qwen2.5-7B"],
            ("Qwen/Qwen2.5-7B",),
        ),
        (["/opt/vllm/bin/vllm", "serve"], ()),
    ],
)
def test_vllm_names(argv: list[str], names: tuple[str, ...]) -> None:
    assert kind_of("vllm").served_models(argv, {}) == names


@pytest.mark.parametrize(
    ("argv", "env", "names"),
    [
        (
            ["/bin/llama-server", "-m", "/m/llama.gguf", "--alias", "llama,llama-3b"],
            {},
            ("llama", "llama-3b"),
        ),
        (["/bin/llama-server", "-m", "/m/llama.gguf", "-a", "llama"], {}, ("llama",)),
        (["/bin/llama-server", "-m", "/m/llama.gguf"], {}, ("/m/llama.gguf",)),  # the file as given to -m
        (["/bin/llama-server", "--model", "../m/x.gguf"], {}, ("../m/x.gguf",)),
        (["/bin/llama-server"], {"LLAMA_ARG_ALIAS": "night", "LLAMA_ARG_MODEL": "/m/x.gguf"}, ("night",)),
        (["/bin/llama-server", "--alias", "flag"], {"LLAMA_ARG_ALIAS": "env"}, ("flag",)),  # the flag wins
        (["/bin/llama-server"], {"LLAMA_ARG_MODEL": "/m/x.gguf"}, ("/m/x.gguf",)),
        (["/bin/llama-server", "-hf", "org/repo"], {}, ()),  # a downloaded file: not known here
    ],
)
def test_llama_server_names(argv: list[str], env: dict[str, str], names: tuple[str, ...]) -> None:
    assert kind_of("llama-server").served_models(argv, env) == names


def test_generic_names_none_and_the_config_wins() -> None:
    assert kind_of("generic").served_models(["/bin/srv", "--model", "/m/x"], {}) == ()
    assert models.resolve("vllm", ("day",), VLLM, []) == ("day",)
    assert models.resolve("vllm", (), VLLM, []) == ()  # an empty list is the config's word too
    # ExecStart as systemd reports it (variables unexpanded), with its Environment=
    written = ["/bin/llama-server", "-m", "${MODEL}", "--alias", "${ALIAS}"]
    assert models.resolve("llama-server", None, written, ["MODEL=/m/x.gguf", "ALIAS=night"]) == ("night",)
    assert models.resolve("llama-server", None, written, ["MODEL=/m/x.gguf"]) == ("/m/x.gguf",)


def test_compare_with_v1_models() -> None:
    body = {"object": "list", "data": [{"id": "qwen", "aliases": ["qwen-7b"]}, {"id": 3}, "junk"]}
    assert models.listed(body) == ["qwen", "qwen-7b"]
    assert models.listed({"data": "x"}) is None and models.listed([]) is None
    assert models.compare(["qwen", "qwen-7b"], ["qwen", "qwen-7b"]) is None
    assert models.compare(["qwen"], ["qwen", "other"]) is None  # a name more on the server is fine
    assert models.compare(["day"], ["qwen"]) == {"expected": ["day"], "listed": ["qwen"], "missing": ["day"]}
    assert models.compare([], ["qwen"]) == {"expected": [], "listed": ["qwen"], "missing": []}
    assert models.compare([], []) is None


def test_the_models_query_carries_the_backends_api_key() -> None:
    from types import SimpleNamespace

    from gpushift.backends import warmup

    b = SimpleNamespace(kind="vllm", health_url="http://127.0.0.1:8001/health", warmup=None)
    assert warmup.models_query(b, [*VLLM, "--api-key", "k1"], {}) == (
        "http://127.0.0.1:8001/v1/models",
        {"Authorization": "Bearer k1"},
    )
    assert warmup.models_query(b, VLLM, {"VLLM_API_KEY": "k2"})[1] == {"Authorization": "Bearer k2"}
    assert warmup.models_query(b, VLLM, {})[1] == {}

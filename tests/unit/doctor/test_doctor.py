"""The preflight doctor's rules, against the GPU facts of four real boards.

V100 (sm_70, the seeds' 2-GPU host), A100 (sm_80), RTX 4090 (sm_89), H200 (sm_90).  The command
lines are the seeds' own (2xV100: vLLM FP16 + fp8_e5m2 KV cache with TP 2; llama-server Q4_K_M
with --split-mode layer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from gpushift import doctor
from gpushift.backends import cmdline
from gpushift.config.schema import BACKEND_KINDS, BackendConfig
from gpushift.doctor import (
    BackendInput,
    CheckpointFacts,
    Finding,
    KindRules,
    check_all,
    check_backend,
    checkpoint_facts_from_config,
    has_errors,
    version_matches,
)
from gpushift.values import GpuInfo, Holder, HostGpuFacts, UnitState

VLLM_UNIT = "gpushift-vllm.service"
LLAMA_UNIT = "gpushift-llama.service"


def _gpu(index: int, name: str, cc: tuple[int, int], **kw: Any) -> GpuInfo:
    return GpuInfo(
        index=index,
        name=name,
        uuid=f"GPU-{name.replace(' ', '-').lower()}-{index}",
        total_mib=16384,
        compute_capability=cc,
        ecc_enabled=True,
        ecc_uncorrected=0,
        ecc_corrected=0,
        **kw,
    )


def _host(*gpus: GpuInfo) -> HostGpuFacts:
    return HostGpuFacts(simulated=False, driver_version="550.120", cuda_version="12.4", gpus=tuple(gpus))


V100X2 = _host(_gpu(0, "Tesla V100-PCIE-16GB", (7, 0)), _gpu(1, "Tesla V100-PCIE-16GB", (7, 0)))
A100 = _host(_gpu(0, "NVIDIA A100-SXM4-80GB", (8, 0)))
RTX4090 = _host(_gpu(0, "NVIDIA GeForce RTX 4090", (8, 9)))
H200 = _host(_gpu(0, "NVIDIA H200", (9, 0)))
BOARDS = {"V100": V100X2, "A100": A100, "RTX4090": RTX4090, "H200": H200}

VLLM_SEED = [
    "/opt/vllm/bin/python",
    "-m",
    "vllm.entrypoints.openai.api_server",
    "--model",
    "/models/Qwen2.5-7B-Instruct",
    "--tensor-parallel-size",
    "2",
    "--dtype",
    "float16",
    "--kv-cache-dtype",
    "fp8_e5m2",
    "--max-model-len",
    "8192",
    "--gpu-memory-utilization",
    "0.92",
    "--port",
    "8000",
]
LLAMA_SEED = [
    "/opt/llama.cpp/bin/llama-server",
    "-m",
    "/models/Qwen2.5-7B-Instruct-Q4_K_M.gguf",
    "-ngl",
    "99",
    "--split-mode",
    "layer",
    "--main-gpu",
    "0",
    "-c",
    "8192",
    "--port",
    "8080",
]


def _vllm(**kw: Any) -> BackendConfig:
    base: dict[str, Any] = dict(
        name="vllm", unit=VLLM_UNIT, health_url="http://127.0.0.1:8000/health", kind="vllm"
    )
    base.update(kw)
    return BackendConfig(**base)


def _llama(**kw: Any) -> BackendConfig:
    base: dict[str, Any] = dict(
        name="llama", unit=LLAMA_UNIT, health_url="http://127.0.0.1:8080/health", kind="llama-server"
    )
    base.update(kw)
    return BackendConfig(**base)


def _unit(name: str = VLLM_UNIT, **kw: Any) -> UnitState:
    other = LLAMA_UNIT if name == VLLM_UNIT else VLLM_UNIT
    base: dict[str, Any] = dict(
        name=name,
        load_state="loaded",
        active_state="inactive",
        sub_state="dead",
        kill_mode="control-group",
        send_sigkill=True,
        timeout_stop_usec=90_000_000,
        conflicts=(other,),
    )
    base.update(kw)
    return UnitState(**base)


def _check(
    backend: BackendConfig,
    argv: Sequence[str],
    facts: HostGpuFacts = V100X2,
    *,
    env: dict[str, str] | None = None,
    unit: UnitState | None = None,
    **kw: Any,
) -> list[Finding]:
    kw.setdefault("path_exists", lambda p: True)
    kw.setdefault("other_units", [LLAMA_UNIT if backend.unit == VLLM_UNIT else VLLM_UNIT])
    return check_backend(
        backend, argv, env or {}, facts, unit if unit is not None else _unit(backend.unit), **kw
    )


def _codes(findings: Sequence[Finding]) -> list[str]:
    return [f.code for f in findings]


def _only(findings: Sequence[Finding], code: str) -> Finding:
    hits = [f for f in findings if f.code == code]
    assert len(hits) == 1, f"expected one {code}, got {findings}"
    return hits[0]


def _set(argv: Sequence[str], flag: str, value: str) -> list[str]:
    """The argv with ``flag``'s value replaced (or the flag appended)."""
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


# --- the seeds' working setups are clean -------------------------------------------------------


def test_doctor_seed_vllm_command_on_v100_has_no_findings() -> None:
    assert _check(_vllm(), VLLM_SEED) == []


def test_doctor_seed_llama_command_on_v100_has_no_findings() -> None:
    assert _check(_llama(), LLAMA_SEED) == []


# --- FP8 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("board", "fires"), [("V100", True), ("A100", True), ("RTX4090", False), ("H200", False)]
)
@pytest.mark.parametrize("form", ["separate", "equals"])
def test_doctor_fp8_quantization_refused_below_sm89(board: str, fires: bool, form: str) -> None:
    argv = _set(VLLM_SEED, "--tensor-parallel-size", "1")
    argv += ["--quantization", "fp8"] if form == "separate" else ["--quantization=fp8"]
    findings = _check(_vllm(), argv, BOARDS[board])
    assert (doctor.FP8_UNSUPPORTED in _codes(findings)) is fires
    if fires:
        f = _only(findings, doctor.FP8_UNSUPPORTED)
        assert f.severity == "error" and f.backend == "vllm"
        assert "no FP8 support" in f.message and "8.9" in f.message
        assert "--kv-cache-dtype fp8_e5m2" in f.hint and "FP16" in f.hint
        assert has_errors(findings)


def test_doctor_fp8_message_names_the_sm_version_like_vllm_does() -> None:
    f = _only(_check(_vllm(), [*VLLM_SEED, "-q", "fp8"]), doctor.FP8_UNSUPPORTED)
    assert "sm_70" in f.message and "Tesla V100" in f.message


def test_doctor_fp8_checkpoint_name_refused_on_v100() -> None:
    argv = _set(VLLM_SEED, "--model", "/models/DeepSeek-R1-Distill-Qwen-7B-FP8")
    f = _only(_check(_vllm(), argv), doctor.FP8_UNSUPPORTED)
    assert "DeepSeek-R1-Distill-Qwen-7B-FP8" in f.message


def test_doctor_fp8_checkpoint_name_allowed_on_h200() -> None:
    argv = _set(VLLM_SEED, "--model", "/models/DeepSeek-R1-Distill-Qwen-7B-FP8")
    argv = _set(argv, "--tensor-parallel-size", "1")
    assert _check(_vllm(), argv, H200) == []


def test_doctor_fp8_checkpoint_from_config_json_refused_on_a100() -> None:
    argv = _set(VLLM_SEED, "--model", "/models/qwen-quantized")
    argv = _set(argv, "--tensor-parallel-size", "1")
    cp = checkpoint_facts_from_config(
        {"torch_dtype": "bfloat16", "quantization_config": {"quant_method": "fp8"}}
    )
    assert doctor.FP8_UNSUPPORTED in _codes(_check(_vllm(), argv, A100, checkpoint=cp))


def test_doctor_fp8_kv_cache_alone_is_not_fp8_weights() -> None:
    # The seeds' "half FP8" path: FP16 weights, fp8_e5m2 KV cache, works on Volta.
    assert "fp8" in " ".join(VLLM_SEED)
    assert doctor.FP8_UNSUPPORTED not in _codes(_check(_vllm(), VLLM_SEED))


def test_doctor_fp8_name_match_is_a_whole_token() -> None:
    argv = _set(VLLM_SEED, "--model", "/models/myfp8experiment")
    assert doctor.FP8_UNSUPPORTED not in _codes(_check(_vllm(), argv))


def test_doctor_fp8_rule_uses_the_backends_own_gpus() -> None:
    # A mixed host: the old card is GPU 1; a backend pinned to GPU 0 (an H200) may use FP8.
    mixed = _host(_gpu(0, "NVIDIA H200", (9, 0)), _gpu(1, "Tesla V100-PCIE-16GB", (7, 0)))
    argv = _set([*VLLM_SEED, "--quantization", "fp8"], "--tensor-parallel-size", "1")
    assert doctor.FP8_UNSUPPORTED not in _codes(_check(_vllm(gpus=(0,)), argv, mixed))
    assert doctor.FP8_UNSUPPORTED in _codes(_check(_vllm(gpus=(1,)), argv, mixed))
    assert doctor.FP8_UNSUPPORTED in _codes(_check(_vllm(), _set(argv, "-tp", "2"), mixed))


def test_doctor_rules_are_vllm_only_for_vllm_flags() -> None:
    generic = BackendConfig(name="x", unit=VLLM_UNIT, health_url="http://127.0.0.1:8000/health")
    assert _check(generic, [*VLLM_SEED, "--quantization", "fp8", "--tensor-parallel-size", "8"]) == []


# --- BF16 --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("board", "fires"), [("V100", True), ("A100", False), ("RTX4090", False), ("H200", False)]
)
def test_doctor_bf16_warns_below_sm80(board: str, fires: bool) -> None:
    argv = _set(_set(VLLM_SEED, "--dtype", "bfloat16"), "--tensor-parallel-size", "1")
    findings = _check(_vllm(), argv, BOARDS[board])
    assert (doctor.BF16_EMULATED in _codes(findings)) is fires
    if fires:
        f = _only(findings, doctor.BF16_EMULATED)
        assert f.severity == "warning" and "--dtype float16" in f.hint
        assert not has_errors(findings)


def test_doctor_bf16_auto_with_bf16_checkpoint_warns_on_v100() -> None:
    argv = _set(VLLM_SEED, "--dtype", "auto")
    cp = CheckpointFacts(torch_dtype="bfloat16")
    assert doctor.BF16_EMULATED in _codes(_check(_vllm(), argv, checkpoint=cp))
    # Unknown checkpoint dtype: nothing to say.
    assert doctor.BF16_EMULATED not in _codes(_check(_vllm(), argv))
    # No --dtype at all means auto.
    no_dtype = [a for a in VLLM_SEED if a not in ("--dtype", "float16")]
    assert doctor.BF16_EMULATED in _codes(_check(_vllm(), no_dtype, checkpoint=cp))
    assert doctor.BF16_EMULATED not in _codes(
        _check(_vllm(), argv, checkpoint=CheckpointFacts(torch_dtype="float16"))
    )


# --- tensor parallel ----------------------------------------------------------------------------


def test_doctor_tensor_parallel_beyond_the_gpus_present_is_an_error() -> None:
    f = _only(
        _check(_vllm(), _set(VLLM_SEED, "--tensor-parallel-size", "4")), doctor.TENSOR_PARALLEL_TOO_LARGE
    )
    assert f.severity == "error" and "4 GPUs" in f.message and "has 2" in f.message


@pytest.mark.parametrize(
    "spelling", [["-tp", "2"], ["--tensor_parallel_size=2"], ["--tensor-parallel-size=2"]]
)
def test_doctor_tensor_parallel_spellings_on_one_a100(spelling: list[str]) -> None:
    argv = [a for a in VLLM_SEED if a not in ("--tensor-parallel-size", "2")] + spelling
    assert doctor.TENSOR_PARALLEL_TOO_LARGE in _codes(_check(_vllm(), argv, A100))


def test_doctor_tensor_parallel_counts_the_backends_gpus_not_the_hosts() -> None:
    assert doctor.TENSOR_PARALLEL_TOO_LARGE in _codes(_check(_vllm(gpus=(0,)), VLLM_SEED))
    env = {"CUDA_VISIBLE_DEVICES": "1"}
    assert doctor.TENSOR_PARALLEL_TOO_LARGE in _codes(_check(_vllm(), VLLM_SEED, env=env))
    assert doctor.TENSOR_PARALLEL_TOO_LARGE not in _codes(_check(_vllm(gpus=(0, 1)), VLLM_SEED))


def test_doctor_tensor_times_pipeline_parallel_must_fit() -> None:
    argv = [*VLLM_SEED, "--pipeline-parallel-size", "2"]
    assert doctor.TENSOR_PARALLEL_TOO_LARGE in _codes(_check(_vllm(), argv))


# --- llama-server split mode ---------------------------------------------------------------------


@pytest.mark.parametrize("spelling", [["--split-mode", "none"], ["-sm", "none"], ["--split-mode=none"]])
def test_doctor_split_mode_none_on_two_gpus_warns(spelling: list[str]) -> None:
    argv = [a for a in LLAMA_SEED if a not in ("--split-mode", "layer")] + spelling
    f = _only(_check(_llama(), argv), doctor.SPLIT_MODE_NONE)
    assert f.severity == "warning" and "idle" in f.message


def test_doctor_split_mode_none_on_one_gpu_is_fine() -> None:
    argv = _set(LLAMA_SEED, "--split-mode", "none")
    assert doctor.SPLIT_MODE_NONE not in _codes(_check(_llama(), argv, A100))
    assert doctor.SPLIT_MODE_NONE not in _codes(_check(_llama(gpus=(1,)), argv))


# --- model paths ---------------------------------------------------------------------------------


def test_doctor_missing_model_path_is_an_error() -> None:
    present = {"/models/Qwen2.5-7B-Instruct"}
    f = _only(_check(_llama(), LLAMA_SEED, path_exists=present.__contains__), doctor.MODEL_PATH_MISSING)
    assert f.severity == "error" and "Qwen2.5-7B-Instruct-Q4_K_M.gguf" in f.message
    assert _check(_vllm(), VLLM_SEED, path_exists=present.__contains__) == []


def test_doctor_model_path_is_checked_after_expanding_the_units_environment() -> None:
    argv = _set(LLAMA_SEED, "-m", "${MODEL_DIR}/model.gguf")
    seen: list[str] = []

    def exists(p: str) -> bool:
        seen.append(p)
        return p == "/srv/models/model.gguf"

    assert _check(_llama(), argv, env={"MODEL_DIR": "/srv/models"}, path_exists=exists) == []
    assert seen == ["/srv/models/model.gguf"]
    assert doctor.MODEL_PATH_MISSING in _codes(
        _check(_llama(), argv, env={"MODEL_DIR": "/elsewhere"}, path_exists=exists)
    )


def test_doctor_relative_model_path_resolves_against_working_directory() -> None:
    argv = _set(LLAMA_SEED, "-m", "models/m.gguf")
    unit = _unit(LLAMA_UNIT, working_directory="/srv/llama")
    assert _check(_llama(), argv, unit=unit, path_exists={"/srv/llama/models/m.gguf"}.__contains__) == []


def test_doctor_hub_ids_and_container_paths_are_not_checked_as_paths() -> None:
    never = lambda p: False  # noqa: E731
    hub = _set(VLLM_SEED, "--model", "Qwen/Qwen2.5-7B-Instruct")
    assert _check(_vllm(), hub, path_exists=never) == []
    docker = ["/usr/bin/docker", "run", "--gpus", "all", "vllm/vllm-openai:v0.6.3.post1", *VLLM_SEED[3:]]
    assert doctor.MODEL_PATH_MISSING not in _codes(_check(_vllm(), docker, path_exists=never))


def test_doctor_vllm_serve_positional_model_is_checked() -> None:
    argv = ["/opt/vllm/bin/vllm", "serve", "/models/gone", "--port", "8000"]
    f = _only(_check(_vllm(), argv, path_exists=lambda p: False), doctor.MODEL_PATH_MISSING)
    assert "/models/gone" in f.message


def test_doctor_python_dash_m_is_not_a_vllm_model() -> None:
    # `python -m vllm.entrypoints...`: -m is python's module flag, not a model path.
    seen: list[str] = []
    _check(_vllm(), VLLM_SEED, path_exists=lambda p: seen.append(p) or True)
    assert seen == ["/models/Qwen2.5-7B-Instruct"]


# --- ECC -----------------------------------------------------------------------------------------


def _with_ecc(facts: HostGpuFacts, index: int, **kw: Any) -> HostGpuFacts:
    gpus = tuple(replace(g, **kw) if g.index == index else g for g in facts.gpus)
    return replace(facts, gpus=gpus)


def test_doctor_uncorrectable_ecc_is_an_error() -> None:
    facts = _with_ecc(V100X2, 1, ecc_uncorrected=1)
    f = _only(_check(_vllm(), VLLM_SEED, facts), doctor.ECC_UNCORRECTABLE)
    assert f.severity == "error" and "GPU 1" in f.message and "nvidia-smi -q -d ECC" in f.hint


def test_doctor_uncorrectable_ecc_on_a_gpu_the_backend_does_not_use_is_not_its_problem() -> None:
    facts = _with_ecc(V100X2, 1, ecc_uncorrected=1)
    assert doctor.ECC_UNCORRECTABLE not in _codes(_check(_llama(gpus=(0,)), LLAMA_SEED, facts))


def test_doctor_accepted_uncorrectable_ecc_count_does_not_refuse_until_it_grows() -> None:
    facts = _with_ecc(V100X2, 1, ecc_uncorrected=1)
    uuid = facts.gpus[1].uuid
    assert _check(_vllm(), VLLM_SEED, facts, accepted_ecc_uncorrected={uuid: 1}) == []
    grown = _with_ecc(V100X2, 1, ecc_uncorrected=2)
    assert doctor.ECC_UNCORRECTABLE in _codes(
        _check(_vllm(), VLLM_SEED, grown, accepted_ecc_uncorrected={uuid: 1})
    )


def test_doctor_ecc_not_supported_is_silent() -> None:
    facts = _with_ecc(RTX4090, 0, ecc_enabled=None, ecc_uncorrected=None, ecc_corrected=None)
    assert _check(_llama(), LLAMA_SEED, facts, previous_ecc_corrected={facts.gpus[0].uuid: 3}) == []


def test_doctor_correctable_ecc_growing_since_last_launch_warns() -> None:
    facts = _with_ecc(V100X2, 0, ecc_corrected=12)
    uuid = facts.gpus[0].uuid
    f = _only(
        _check(_vllm(), VLLM_SEED, facts, previous_ecc_corrected={uuid: 10}), doctor.ECC_CORRECTABLE_GROWING
    )
    assert f.severity == "warning" and "10 to 12" in f.message
    assert _check(_vllm(), VLLM_SEED, facts, previous_ecc_corrected={uuid: 12}) == []
    assert _check(_vllm(), VLLM_SEED, facts) == []  # no earlier launch: nothing to compare


# --- versions ------------------------------------------------------------------------------------


def test_doctor_version_other_than_pinned_warns() -> None:
    f = _only(
        _check(_vllm(pinned_version="0.6.3.post1"), VLLM_SEED, version="0.8.5"), doctor.VERSION_NOT_PINNED
    )
    assert f.severity == "warning" and "0.8.5" in f.message and "0.6.3.post1" in f.message
    assert _check(_vllm(pinned_version="0.6.3.post1"), VLLM_SEED, version="0.6.3.post1") == []
    assert _check(_vllm(pinned_version="0.6.3.post1"), VLLM_SEED, version=None) == []
    assert _check(_vllm(), VLLM_SEED, version="0.8.5") == []


@pytest.mark.parametrize(
    ("pinned", "actual", "same"),
    [
        ("0.32.0", "0.32.0", True),
        ("0.32.0", "0.32.0+cpu", True),
        ("v0.6.3.post1", "0.6.3.post1", True),
        ("0.6.3", "0.6.3.post1", False),
        ("0.6.3", "0.8.5", False),
        ("7312", "version: 7312 (a1b2c3d)", True),
        ("b7312", "7312 (a1b2c3d)", True),
        ("7312", "7313 (a1b2c3d)", False),
    ],
)
def test_doctor_version_matches(pinned: str, actual: str, same: bool) -> None:
    assert version_matches(pinned, actual) is same


# --- ports ---------------------------------------------------------------------------------------


def test_doctor_two_backends_on_one_port_is_an_error_for_both() -> None:
    llama_on_8000 = _set(LLAMA_SEED, "--port", "8000")
    inputs = [
        BackendInput(_vllm(), _unit(VLLM_UNIT, exec_start=tuple(VLLM_SEED))),
        BackendInput(
            _llama(health_url="http://127.0.0.1:8000/health"), _unit(LLAMA_UNIT), argv=llama_on_8000
        ),
    ]
    findings = check_all(inputs, V100X2)
    dup = [f for f in findings if f.code == doctor.PORT_DUPLICATE]
    assert sorted(f.backend for f in dup) == ["llama", "vllm"] and all(f.severity == "error" for f in dup)
    assert "8000" in dup[0].message


def test_doctor_default_ports_count_when_no_port_is_given() -> None:
    # vLLM defaults to 8000: a generic backend on 8000 collides with a vLLM started without --port.
    no_port = [a for a in VLLM_SEED if a not in ("--port", "8000")]
    inputs = [
        BackendInput(_vllm(), _unit(VLLM_UNIT), argv=no_port),
        BackendInput(
            BackendConfig(name="other", unit=LLAMA_UNIT, health_url="http://localhost:8000/ready"),
            _unit(LLAMA_UNIT),
            argv=["/usr/bin/other"],
        ),
    ]
    assert doctor.PORT_DUPLICATE in _codes(check_all(inputs, V100X2))


def test_doctor_port_taken_by_a_foreign_process_is_an_error() -> None:
    stranger = Holder(pid=4242, user="bob", command="python3", unit=None)
    f = _only(_check(_vllm(), VLLM_SEED, listeners={8000: stranger}), doctor.PORT_TAKEN)
    assert f.severity == "error" and "pid 4242" in f.message and "bob" in f.message


def test_doctor_port_held_by_the_backend_itself_or_a_peer_backend_is_fine() -> None:
    own = Holder(pid=10, user="vllm", command="python3", unit=VLLM_UNIT)
    peer = Holder(pid=11, user="llama", command="llama-server", unit=LLAMA_UNIT)
    assert _check(_vllm(), VLLM_SEED, listeners={8000: own}) == []
    assert doctor.PORT_TAKEN not in _codes(_check(_vllm(), VLLM_SEED, listeners={8000: peer}))


def test_doctor_health_url_on_another_port_than_the_server_warns() -> None:
    f = _only(_check(_vllm(health_url="http://127.0.0.1:9000/health"), VLLM_SEED), doctor.HEALTH_URL_PORT)
    assert "9000" in f.message and "8000" in f.message


# --- unit sanity ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"kill_mode": "process"}, doctor.UNIT_KILL_MODE),
        ({"kill_mode": "mixed"}, doctor.UNIT_KILL_MODE),
        ({"send_sigkill": False}, doctor.UNIT_NO_SIGKILL),
        ({"timeout_stop_usec": doctor.USEC_INFINITY}, doctor.UNIT_TIMEOUT_STOP_INFINITE),
        ({"conflicts": ()}, doctor.UNIT_NO_CONFLICTS),
        ({"conflicts": ("something-else.service",)}, doctor.UNIT_NO_CONFLICTS),
    ],
)
def test_doctor_unit_sanity_warnings(change: dict[str, Any], code: str) -> None:
    findings = _check(_vllm(), VLLM_SEED, unit=_unit(VLLM_UNIT, **change))
    assert _codes(findings) == [code]
    assert findings[0].severity == "warning"


def test_doctor_unit_missing_conflicts_names_the_other_backend_unit() -> None:
    f = _only(_check(_vllm(), VLLM_SEED, unit=_unit(VLLM_UNIT, conflicts=())), doctor.UNIT_NO_CONFLICTS)
    assert LLAMA_UNIT in f.message and f"Conflicts={LLAMA_UNIT}" in f.hint


def test_doctor_unit_stop_timeout_must_exceed_vllm_shutdown_timeout() -> None:
    argv = [*VLLM_SEED, "--shutdown-timeout", "120"]
    short = _unit(VLLM_UNIT, timeout_stop_usec=90_000_000)
    assert _codes(_check(_vllm(), argv, unit=short)) == [doctor.UNIT_TIMEOUT_STOP_SHORT]
    assert _check(_vllm(), argv, unit=_unit(VLLM_UNIT, timeout_stop_usec=150_000_000)) == []


def test_doctor_unit_not_found_is_an_error() -> None:
    findings = _check(_vllm(), VLLM_SEED, unit=_unit(VLLM_UNIT, load_state="not-found"))
    assert _codes(findings) == [doctor.UNIT_NOT_LOADED] and has_errors(findings)


def test_doctor_unknown_unit_skips_unit_rules() -> None:
    assert check_backend(_vllm(), VLLM_SEED, {}, V100X2, None) == []


# --- environment expansion and flag parsing ------------------------------------------------------


def test_doctor_undefined_variable_warns_and_flags_still_parse() -> None:
    argv = _set(VLLM_SEED, "--tensor-parallel-size", "${TP}")
    assert cmdline.undefined_variables(argv, {}) == ["TP"]
    f = _only(_check(_vllm(), argv), doctor.ENV_UNDEFINED)
    assert "$TP" in f.message and f.severity == "warning"
    assert doctor.TENSOR_PARALLEL_TOO_LARGE in _codes(_check(_vllm(), argv, env={"TP": "4"}))


def test_doctor_check_all_reads_argv_and_environment_from_the_unit() -> None:
    unit = _unit(
        VLLM_UNIT,
        exec_start=(
            "/opt/vllm/bin/python",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "${M}",
            "$QUANT",
        ),
        environment=("M=/models/Qwen-7B-FP8", "QUANT=--quantization fp8"),
    )
    findings = check_all(
        [BackendInput(_vllm(), unit)], V100X2, path_exists=lambda p: p == "/models/Qwen-7B-FP8"
    )
    assert _codes(findings) == [doctor.FP8_UNSUPPORTED]


# --- facts missing, JSON shape -------------------------------------------------------------------


def test_doctor_unreadable_gpu_facts_warn_and_skip_gpu_rules() -> None:
    facts = HostGpuFacts(
        simulated=False, driver_version=None, cuda_version=None, gpus=(), error="NVML: driver not loaded"
    )
    findings = _check(_vllm(), [*VLLM_SEED, "--quantization", "fp8"], facts)
    assert _codes(findings) == [doctor.GPU_FACTS_UNAVAILABLE]
    assert "driver not loaded" in findings[0].message and not has_errors(findings)


def test_doctor_finding_json_shape_is_stable() -> None:
    f = Finding("error", "fp8-unsupported", "vllm", "m", "h")
    assert f.to_dict() == {
        "severity": "error",
        "code": "fp8-unsupported",
        "backend": "vllm",
        "message": "m",
        "hint": "h",
    }


def test_checkpoint_facts_from_config_reads_dtype_and_quant_method() -> None:
    assert checkpoint_facts_from_config({"torch_dtype": "BFloat16"}) == CheckpointFacts("bfloat16", None)
    assert checkpoint_facts_from_config(
        {"dtype": "float16", "quantization_config": {"quant_method": "FP8"}}
    ) == (CheckpointFacts("float16", "fp8"))
    assert checkpoint_facts_from_config({"quantization_config": "odd"}) == CheckpointFacts(None, None)


# --- the table of kinds --------------------------------------------------------------------------


def test_doctor_has_rules_for_every_kind_the_config_accepts_but_generic() -> None:
    # A kind the config accepts but the table lacks would silently get only the common rules.
    assert set(doctor.KINDS) == set(BACKEND_KINDS) - {"generic"}


def test_doctor_a_kind_added_to_the_table_gets_its_rules_port_paths_and_stop_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[doctor.Launch] = []

    def launch_rules(launch: doctor.Launch) -> list[Finding]:
        seen.append(launch)
        return [Finding("warning", "demo-launch", launch.name, "from the demo kind's module")]

    def stop_rules(name: str, args: Sequence[str], timeout_stop_usec: int) -> list[Finding]:
        return [Finding("warning", "demo-stop", name, f"{timeout_stop_usec}")]

    demo = KindRules(7000, launch_rules, lambda args: [args[-1]], stop_rules)
    monkeypatch.setitem(doctor.KINDS, "demo", demo)
    backend = BackendConfig(
        name="demo", unit=VLLM_UNIT, health_url="http://127.0.0.1:7000/health", kind="demo", gpus=(1,)
    )
    stranger = Holder(pid=4242, user="bob", command="python3", unit=None)
    findings = _check(
        backend, ["demo-server", "${MODEL}"], env={"MODEL": "/m/x.bin"}, path_exists=lambda p: False,
        listeners={7000: stranger},
    )  # fmt: skip
    assert _codes(findings) == ["demo-launch", doctor.MODEL_PATH_MISSING, doctor.PORT_TAKEN, "demo-stop"]
    assert list(seen[0].args) == ["demo-server", "/m/x.bin"] and seen[0].gpus == (V100X2.gpus[1],)
    assert "'/m/x.bin'" in findings[1].message
    # Without --port the kind's default port is the one compared with the health URL.
    moved = replace(backend, health_url="http://127.0.0.1:7001/health")
    assert doctor.HEALTH_URL_PORT in _codes(_check(moved, ["demo-server"], path_exists=None))


class _OnlyAskedTable(Mapping[int, Holder]):
    """A host's listener table that may be asked about one port, never enumerated: enumerating it
    means mapping every socket of the host to its process (a scan of every process's open files)."""

    def __init__(self, table: dict[int, Holder]) -> None:
        self.table = table

    def __getitem__(self, port: int) -> Holder:
        return self.table[port]

    def __iter__(self) -> Any:
        raise AssertionError("the listener table was enumerated")

    def __len__(self) -> int:
        raise AssertionError("the listener table was enumerated (its length taken)")


def test_doctor_asks_the_listener_table_about_the_backends_port_only() -> None:
    stranger = Holder(pid=4242, user="bob", command="python3", unit=None)
    f = _only(_check(_vllm(), VLLM_SEED, listeners=_OnlyAskedTable({8000: stranger})), doctor.PORT_TAKEN)
    assert "pid 4242" in f.message
    assert doctor.PORT_TAKEN not in _codes(_check(_vllm(), VLLM_SEED, listeners=_OnlyAskedTable({})))


def test_doctor_check_all_only_one_backend_still_compares_it_with_the_others() -> None:
    inputs = [
        BackendInput(_vllm(), _unit(VLLM_UNIT), argv=VLLM_SEED),
        BackendInput(
            BackendConfig(name="other", unit=LLAMA_UNIT, health_url="http://localhost:8000/ready"),
            _unit(LLAMA_UNIT),
            argv=["/usr/bin/other", "--port", "8000"],
        ),
    ]
    both = check_all(inputs, V100X2)
    assert {f.backend for f in both if f.code == doctor.PORT_DUPLICATE} == {"vllm", "other"}
    only = check_all(inputs, V100X2, only="other")
    assert only and {f.backend for f in only} == {"other"}
    assert doctor.PORT_DUPLICATE in _codes(only)

"""The TOML config: the shipped example parses, every mistake is named (file, key, what was expected),
and --config > $GPUSHIFT_CONFIG > the default path."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushift.config.hooks import HooksConfig, NotifyConfig
from gpushift.config.mirror import MirrorConfig
from gpushift.config.schema import (
    DEFAULT_CONFIG_PATH,
    ENV_CONFIG,
    BackendConfig,
    Config,
    DaemonConfig,
    GpuConfig,
    MetricsConfig,
    config_path,
    load,
    parse,
)
from gpushift.config.types import FrontDoorConfig
from gpushift.errors import ConfigError

PATH = "/etc/gpushift/test.toml"

MINIMAL = """
[backends.day]
unit = "gpushift-day.service"
health_url = "http://127.0.0.1:18000/health"
"""

# The keys the issue asks for, with the names it gives them (backend names are the user's).
FULL = """
[daemon]
bus = "session"
state_dir = "/var/lib/gpushift-test"
on_failure = "stay"

[gpu]
provider = "simulated"
simulated_gpus = 2
simulated_total_mib = 16384
residual_mib = 300
release_timeout_s = 90

[backends.day]
unit = "gpushift-day.service"
health_url = "http://127.0.0.1:18000/health"
version_url = "http://127.0.0.1:18000/version"
start_timeout_s = 900
gpus = [0, 1]
simulated_vram_mib = 14500

[backends.night]
unit = "gpushift-night.service"
health_url = "http://127.0.0.1:18080/health"
version_command = ["night-server", "--version"]
start_timeout_s = 300
simulated_vram_mib = 6800
"""


def without_line(msg: str) -> str:
    """``file:LINE: key: ...`` (or ``file:LINE:COL: ...``) without its line and column."""
    return re.sub(r"^([^:]+):\d+(?::\d+)?: ", r"\1: ", msg)


def config_error(text: str, path: str = PATH) -> str:
    with pytest.raises(ConfigError) as exc:
        parse(text, path)
    assert exc.value.code == 2  # the CLI's exit code for a bad config
    return str(exc.value)


# --------------------------------------------------------------------------- good files


def test_config_shipped_example_parses(repo_root: Path) -> None:
    example = repo_root / "etc" / "gpushift" / "gpushift.toml"
    assert example.is_file(), f"the shipped example {example} is missing"
    cfg = load(str(example))
    assert cfg.path == str(example)
    assert len(cfg.backends) >= 2
    for b in cfg.backends.values():
        assert b.health_url.startswith("http")
        # every unit the example names is shipped beside it, so the two cannot drift apart
        assert (repo_root / "units" / b.unit).is_file(), f"{b.unit} of backend {b.name} is not in units/"


def test_config_minimal_file_gets_the_documented_defaults() -> None:
    cfg = parse(MINIMAL, PATH)
    assert cfg.daemon == DaemonConfig()
    assert cfg.gpu == GpuConfig()
    assert (cfg.daemon.bus, cfg.daemon.on_failure, cfg.gpu.provider) == ("system", "rollback", "nvml")
    assert (cfg.gpu.residual_mib, cfg.gpu.release_timeout_s) == (256.0, 120.0)
    day = cfg.backend("day")
    assert day == BackendConfig(
        name="day", unit="gpushift-day.service", health_url="http://127.0.0.1:18000/health"
    )
    assert day.gpus is None and day.kind == "generic"
    assert cfg.ledger_path == "/var/lib/gpushift/ledger.db"
    assert cfg.simulated_dir == "/var/lib/gpushift/simgpu"


def test_config_all_issue_keys_are_read() -> None:
    cfg = parse(FULL, PATH)
    assert (cfg.daemon.bus, cfg.daemon.state_dir, cfg.daemon.on_failure) == (
        "session",
        "/var/lib/gpushift-test",
        "stay",
    )
    assert (cfg.gpu.provider, cfg.gpu.simulated_gpus, cfg.gpu.simulated_total_mib) == ("simulated", 2, 16384)
    assert (cfg.gpu.residual_mib, cfg.gpu.release_timeout_s) == (300, 90)
    assert list(cfg.backends) == ["day", "night"]  # config order is kept
    day, night = cfg.backend("day"), cfg.backend("night")
    assert (day.version_url, day.start_timeout_s, day.gpus, day.simulated_vram_mib) == (
        "http://127.0.0.1:18000/version",
        900,
        (0, 1),
        14500,
    )
    assert night.version_command == ("night-server", "--version") and night.gpus is None
    assert cfg.gpus_of("night", (0, 1)) == (0, 1)
    assert cfg.gpus_of("day", (0, 1, 2)) == (0, 1)
    assert cfg.backend_for_unit("gpushift-night.service") == "night"
    assert cfg.backend_for_unit("sshd.service") is None
    assert cfg.ledger_path == "/var/lib/gpushift-test/ledger.db"


def test_config_sample_interval_defaults_to_2s_and_takes_the_ends_of_its_range() -> None:
    assert parse(MINIMAL).daemon.sample_interval_s == 2.0
    assert parse("[daemon]\nsample_interval_s = 0.5\n" + MINIMAL).daemon.sample_interval_s == 0.5
    assert parse("[daemon]\nsample_interval_s = 60\n" + MINIMAL).daemon.sample_interval_s == 60


def test_config_every_key_is_documented_in_docs_config_md(repo_root: Path) -> None:
    # docs/config.md has one table per config table; a key added to config/schema.py without a row there
    # (or a row whose key no longer exists) fails here.
    text = (repo_root / "docs" / "config.md").read_text()
    documented: dict[str, set[str]] = {}
    section = ""
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip().strip("`")
        elif line.startswith("| `") and section:
            documented.setdefault(section, set()).add(line.split("`")[1])
    assert documented == {
        "[daemon]": set(DaemonConfig.__dataclass_fields__),
        "[gpu]": set(GpuConfig.__dataclass_fields__),
        "[backends.NAME]": set(BackendConfig.__dataclass_fields__) - {"name"},
        "[metrics]": set(MetricsConfig.__dataclass_fields__),
        "[hooks]": set(HooksConfig.__dataclass_fields__),
        "[notify]": set(NotifyConfig.__dataclass_fields__),
        "[frontdoor]": set(FrontDoorConfig.__dataclass_fields__),
        "[mirror]": set(MirrorConfig.__dataclass_fields__),
    }
    assert "| key | type | default | range | meaning |" in text


def test_config_schedule_default_path_or_explicitly_none() -> None:
    assert parse(MINIMAL).daemon.schedule is None  # the default schedule file, if it exists
    assert parse("[daemon]\nschedule = ''\n" + MINIMAL).daemon.schedule == ""  # no schedule at all
    assert parse("[daemon]\nschedule = '/srv/s'\n" + MINIMAL).daemon.schedule == "/srv/s"


# --------------------------------------------------------------------------- unknown keys


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("[deamon]\nbus = 'system'\n" + MINIMAL, "deamon", "daemon"),
        ("[daemon]\non_failur = 'stay'\n" + MINIMAL, "daemon.on_failur", "on_failure"),
        ("[gpu]\nresidual = 256\n" + MINIMAL, "gpu.residual", "residual_mib"),
        (MINIMAL + "helth_url = 'http://127.0.0.1:1/health'\n", "backends.day.helth_url", "health_url"),
        (MINIMAL + "name = 'dusk'\n", "backends.day.name", "health_url"),
    ],
)
def test_config_unknown_key_is_named_with_the_allowed_ones(text: str, key: str, expected: str) -> None:
    msg = config_error(text)
    assert without_line(msg).startswith(f"{PATH}: {key}: unknown key"), msg
    assert expected in msg  # the list of what is allowed, so the typo is obvious


# --------------------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("[daemon]\non_failure = 'retry'\n" + MINIMAL, "daemon.on_failure", "'rollback', 'stay'"),
        ("[daemon]\nbus = 'tcp'\n" + MINIMAL, "daemon.bus", "'system', 'session'"),
        ("[daemon]\npoll_interval_s = 0\n" + MINIMAL, "daemon.poll_interval_s", ">= 0.05"),
        ("[daemon]\nsample_interval_s = 0.2\n" + MINIMAL, "daemon.sample_interval_s", ">= 0.5"),
        ("[daemon]\nsample_interval_s = 61\n" + MINIMAL, "daemon.sample_interval_s", "<= 60"),
        ("[daemon]\nsample_interval_s = '2'\n" + MINIMAL, "daemon.sample_interval_s", "a number"),
        ("[daemon]\nschedule = 5\n" + MINIMAL, "daemon.schedule", "expected a path"),
        ("[gpu]\nprovider = 'rocm'\n" + MINIMAL, "gpu.provider", "'nvml', 'simulated'"),
        ("[gpu]\nresidual_mib = '256'\n" + MINIMAL, "gpu.residual_mib", "a number"),
        ("[gpu]\nresidual_mib = -1\n" + MINIMAL, "gpu.residual_mib", ">= 0"),
        ("[gpu]\nrelease_timeout_s = 0\n" + MINIMAL, "gpu.release_timeout_s", ">= 0.1"),
        ("[gpu]\nsimulated_gpus = 1.5\n" + MINIMAL, "gpu.simulated_gpus", "an integer"),
        ("[gpu]\nsimulated_gpus = true\n" + MINIMAL, "gpu.simulated_gpus", "an integer"),
        ("[gpu]\nsimulated_gpus = 0\n" + MINIMAL, "gpu.simulated_gpus", ">= 1"),
        (MINIMAL + "start_timeout_s = true\n", "backends.day.start_timeout_s", "a number"),
        (MINIMAL + "kind = 'tgi'\n", "backends.day.kind", "'generic', 'vllm', 'llama-server'"),
        (MINIMAL + "version_url = 'localhost:8000/version'\n", "backends.day.version_url", "http://"),
        (
            MINIMAL + "version_command = 'server --version'\n",
            "backends.day.version_command",
            "list of strings",
        ),
        (MINIMAL + "version_command = []\n", "backends.day.version_command", "list of strings"),
        (MINIMAL + "gpus = []\n", "backends.day.gpus", "non-empty list of GPU indices"),
        (MINIMAL + "gpus = [-1]\n", "backends.day.gpus", "GPU indices"),
        (MINIMAL + "gpus = [0.5]\n", "backends.day.gpus", "GPU indices"),
        (MINIMAL + "gpus = [true]\n", "backends.day.gpus", "GPU indices"),
        (MINIMAL + "gpus = [0, 0]\n", "backends.day.gpus", "listed twice"),
        (MINIMAL + "gpus = 1\n", "backends.day.gpus", "GPU indices"),
        ("[backends.day]\nhealth_url = 'http://127.0.0.1:1/health'\n", "backends.day.unit", "missing"),
        (
            "[backends.day]\nunit = 'gpushift-day'\nhealth_url = 'http://h/health'\n",
            "backends.day.unit",
            ".service",
        ),
        (
            "[backends.day]\nunit = 5\nhealth_url = 'http://h/health'\n",
            "backends.day.unit",
            "non-empty string",
        ),
        ("[backends.day]\nunit = 'gpushift-day.service'\n", "backends.day.health_url", "missing"),
        (
            "[backends.day]\nunit = 'd.service'\nhealth_url = 'ftp://h/'\n",
            "backends.day.health_url",
            "http://",
        ),
        ("[backends]\nday = 1\n", "backends.day", "a table"),
        ("backends = 1\n", "backends", "a table"),
        ("daemon = 'x'\n" + MINIMAL, "daemon", "a table"),
        ("[daemon]\n", "backends", "no backend configured"),
    ],
)
def test_config_bad_value_names_file_key_and_expectation(text: str, key: str, expected: str) -> None:
    msg = config_error(text)
    assert without_line(msg).startswith(f"{PATH}: {key}: "), msg
    assert expected in msg, msg


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize(
    ("table", "key"),
    [("gpu", "release_timeout_s"), ("daemon", "poll_interval_s"), ("backends.day", "start_timeout_s")],
)
def test_config_non_finite_numbers_are_rejected(table: str, key: str, value: str) -> None:
    # A NaN timeout never compares as expired: the gate or the readiness wait would never end.
    if table == "backends.day":
        text = MINIMAL + f"{key} = {value}\n"
    else:
        text = f"[{table}]\n{key} = {value}\n" + MINIMAL
    msg = config_error(text)
    assert without_line(msg).startswith(f"{PATH}: {table}.{key}: "), msg
    assert "finite" in msg or ">=" in msg, msg


def test_config_invalid_toml_names_the_file() -> None:
    msg = config_error("[daemon\nbus = 'system'\n")
    assert without_line(msg).startswith(f"{PATH}: not valid TOML"), msg


def test_config_off_is_reserved_as_backend_name() -> None:
    msg = config_error(
        MINIMAL + "[backends.off]\nunit = 'gpushift-off.service'\nhealth_url = 'http://h/health'\n"
    )
    assert without_line(msg).startswith(f"{PATH}: backends.off: "), msg
    assert "reserved" in msg


@pytest.mark.parametrize("name", ["day night", "day/night", "day.night", ""])
def test_config_backend_name_with_odd_characters_is_rejected(name: str) -> None:
    msg = config_error(f'[backends."{name}"]\nunit = "x.service"\nhealth_url = "http://h/health"\n')
    assert without_line(msg).startswith(f"{PATH}: backends.{name}: "), msg
    assert "letters, digits" in msg, msg


def test_config_duplicate_unit_names_both_backends() -> None:
    msg = config_error(
        MINIMAL
        + "[backends.night]\nunit = 'gpushift-day.service'\nhealth_url = 'http://127.0.0.1:18080/health'\n"
    )
    assert without_line(msg).startswith(f"{PATH}: backends.night.unit: "), msg
    assert "'gpushift-day.service'" in msg and "'day'" in msg


def test_config_gpu_index_beyond_the_simulated_host_is_rejected() -> None:
    msg = config_error("[gpu]\nprovider = 'simulated'\nsimulated_gpus = 2\n" + MINIMAL + "gpus = [0, 2]\n")
    assert without_line(msg).startswith(f"{PATH}: backends.day.gpus: "), msg
    assert "GPU 2" in msg and "2 GPUs" in msg
    # the last GPU of the host is fine
    assert parse("[gpu]\nprovider = 'simulated'\nsimulated_gpus = 2\n" + MINIMAL + "gpus = [1]\n").backend(
        "day"
    ).gpus == (1,)


# --------------------------------------------------------------------------- where the file is


def test_config_path_explicit_beats_env_beats_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_CONFIG, raising=False)
    assert config_path(None) == DEFAULT_CONFIG_PATH == "/etc/gpushift/gpushift.toml"
    monkeypatch.setenv(ENV_CONFIG, "/srv/env.toml")
    assert config_path(None) == "/srv/env.toml"
    assert config_path("/srv/flag.toml") == "/srv/flag.toml"
    monkeypatch.setenv(ENV_CONFIG, "")  # an empty variable is as good as unset
    assert config_path(None) == DEFAULT_CONFIG_PATH


def test_config_load_reads_the_file_the_precedence_picks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    by_env, by_flag = tmp_path / "env.toml", tmp_path / "flag.toml"
    by_env.write_text(MINIMAL)
    by_flag.write_text(MINIMAL.replace("day", "dusk"))
    monkeypatch.setenv(ENV_CONFIG, str(by_env))
    assert list(load().backends) == ["day"]
    assert load().path == str(by_env)
    assert list(load(str(by_flag)).backends) == ["dusk"]


def test_config_load_missing_file_says_which_and_how_to_point_elsewhere(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as exc:
        load(str(missing))
    assert str(missing) in str(exc.value) and "not found" in str(exc.value)
    assert "--config" in str(exc.value) and ENV_CONFIG in str(exc.value)


def test_config_load_errors_name_the_real_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.toml"
    f.write_text("[daemon]\non_failure = 'retry'\n" + MINIMAL)
    with pytest.raises(ConfigError) as exc:
        load(str(f))
    assert str(exc.value).startswith(f"{f}:2: daemon.on_failure: ")


# --------------------------------------------------------------------------- fuzzing


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)  # finite numbers only: their Python repr is valid TOML
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    return "[" + ", ".join(_toml_value(x) for x in v) + "]"


_scalars = st.one_of(
    st.booleans(),
    st.integers(-5, 100000),
    st.floats(-10, 1e6, allow_nan=False),
    st.sampled_from(
        ["", "system", "session", "stay", "nvml", "simulated", "http://h/x", "a.service", "vllm"]
    ),
    st.text(max_size=8),
)
_values = st.one_of(_scalars, st.lists(_scalars, max_size=3))
_KEYS = {
    "daemon": sorted(DaemonConfig.__dataclass_fields__) + ["bogus"],
    "gpu": sorted(GpuConfig.__dataclass_fields__) + ["bogus"],
    "backends.day": sorted(set(BackendConfig.__dataclass_fields__) - {"name"}) + ["bogus"],
}


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(sorted(_KEYS)).flatmap(
        lambda t: st.tuples(st.just(t), st.sampled_from(_KEYS[t]), _values)
    )
)
def test_config_any_single_value_gives_a_config_or_a_config_error(case: tuple[str, str, Any]) -> None:
    table, key, value = case
    base = {
        "daemon": "",
        "gpu": "",
        "backends.day": "unit = 'gpushift-day.service'\nhealth_url = 'http://127.0.0.1:1/health'\n",
    }
    lines = [ln for ln in base[table].splitlines() if not ln.startswith(f"{key} ")]
    base[table] = "\n".join([*lines, f"{key} = {_toml_value(value)}"]) + "\n"
    text = "".join(f"[{t}]\n{body}" for t, body in base.items())
    try:
        cfg = parse(text, PATH)
    except ConfigError as e:
        assert without_line(str(e)).startswith(f"{PATH}: "), str(e)
        return
    assert isinstance(cfg, Config)


def test_config_accepted_ecc_uncorrected_reads_uuid_counts_and_rejects_bad_values() -> None:
    from gpushift.config.schema import parse as parse_config

    base = '[backends.day]\nunit = "d.service"\nhealth_url = "http://127.0.0.1:1/h"\n'
    cfg = parse_config('[gpu]\naccepted_ecc_uncorrected = { "GPU-1" = 2 }\n' + base, "/x.toml")
    assert cfg.gpu.accepted_ecc_uncorrected == {"GPU-1": 2}
    assert parse_config(base).gpu.accepted_ecc_uncorrected == {}
    with pytest.raises(ConfigError, match=r"/x.toml:\d+: gpu.accepted_ecc_uncorrected: expected a table"):
        parse_config('[gpu]\naccepted_ecc_uncorrected = { "GPU-1" = -1 }\n' + base, "/x.toml")

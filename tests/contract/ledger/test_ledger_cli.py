"""`gpushift ledger` against a temp database built through SqliteLedger (click's CliRunner).

The history: vllm and llama take turns on a simulated 2-GPU host; between two llama launches a
drop-in changes ``-c`` and llama-server reports a new version; between two vllm launches the model
file is replaced and an environment variable changes.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from gpushift.cli.ledger import ledger, parse_since
from gpushift.ledger import SqliteLedger
from gpushift.ledger.reports import diff_records
from gpushift.ledger.spool import SPOOL_SUBDIR
from gpushift.safetext import redact
from gpushift.values import SwitchRecord

T0 = datetime(2025, 3, 1, 8, 0, tzinfo=timezone.utc)

VLLM_ARGV = [
    "/opt/vllm/bin/python",
    "-m",
    "vllm.entrypoints.openai.api_server",
    "--model",
    "/models/Qwen2.5-7B-Instruct",
    "--dtype",
    "float16",
    "--kv-cache-dtype",
    "fp8_e5m2",
    "--tensor-parallel-size",
    "2",
    "--max-model-len",
    "8192",
    "--gpu-memory-utilization",
    "0.92",
    "--api-key",
    "sk-very-secret",
]
LLAMA_ARGV = [
    "/usr/local/bin/llama-server",
    "-m",
    "/models/qwen2.5-7b-q4_k_m.gguf",
    "-ngl",
    "99",
    "--split-mode",
    "layer",
    "-c",
    "8192",
    "--parallel",
    "4",
]

SIM_GPUS = {
    "simulated": True,
    "driver_version": "550.120",
    "cuda_version": "12.4",
    "error": None,
    "gpus": [
        {
            "index": i,
            "name": "Tesla V100-PCIE-16GB",
            "uuid": f"GPU-SIM-{i}",
            "total_mib": 16384.0,
            "compute_capability": "7.0",
            "ecc_enabled": True,
            "ecc_uncorrected": 0,
            "ecc_corrected": 0,
        }
        for i in range(2)
    ],
}


def launch(unit: str, drop_in_sha: str | None, env: dict[str, str], model: str, fp: str) -> dict[str, Any]:
    drop_ins = [{"path": f"/etc/systemd/system/{unit}.d/override.conf", "sha256": drop_in_sha, "error": None}]
    return {
        "format": 1,
        "host": {"hostname": "v100-box", "kernel": "5.15.0-105-generic", "os": "Ubuntu 22.04.4 LTS"},
        "unit": {
            "name": unit,
            "path": f"/etc/systemd/system/{unit}",
            "sha256": "1" * 64,
            "error": None,
            "drop_ins": drop_ins if drop_in_sha else [],
            "environment": env,
            "working_directory": "/srv/models",
            "user": "llm",
        },
        "models": [
            {
                "flag": "-m",
                "path": model,
                "resolved": model,
                "kind": "file",
                "size_bytes": 4_683_073_952,
                "mtime": "2025-02-20T10:00:00+00:00",
                "fingerprint": fp,
            }
        ],
        "redacted_env": [],
    }


def record(
    i: int,
    frm: str | None,
    to: str,
    argv: list[str],
    version: str,
    who: str,
    reason: str,
    li: dict[str, Any],
    outcome: str = "ok",
) -> SwitchRecord:
    rec = SwitchRecord(
        trigger="schedule" if who == "gpushift" else "manual",
        requested_by=who,
        reason=reason,
        from_backend=frm,
        to_backend=to,
        started_at=T0 + timedelta(hours=12 * i),
        ticket=f"t{i}",
        uid=None if who == "gpushift" else 1000 + i,
        gpushift_version="0.1.0",
        unit=f"gpushift-{to}.service",
        unit_path=f"/etc/systemd/system/gpushift-{to}.service",
        unit_sha256="1" * 64,
        argv_configured=list(argv),
        argv_running=list(argv),
        backend_version=version,
        version_source="command" if to == "llama" else "url",
        gpu_facts=SIM_GPUS,
    )
    rec.vram = {"before": [{"index": 0, "total_mib": 16384.0, "used_mib": 14500.0, "holders": []}]}
    rec.durations_s = {"preflight": 0.1, "stop": 2.0, "release": 0.6, "start": 0.2, "ready": 35.0}
    rec.extra["launch"] = li
    rec.outcome = outcome
    rec.finished_at = rec.started_at + timedelta(seconds=40)
    return rec


def build_history(db: Path, run: Path) -> SqliteLedger:
    led = SqliteLedger(db, run, log=lambda event, **kw: None)
    v_env = {"VLLM_ATTENTION_BACKEND": "XFORMERS"}
    l_env = {"LLAMA_ARG_THREADS": "16"}
    llama_c16k = [a if a != "8192" else "16384" for a in LLAMA_ARGV]
    history = [
        record(
            0,
            None,
            "vllm",
            VLLM_ARGV,
            "0.6.3.post1",
            "alice",
            "first day shift",
            launch("gpushift-vllm.service", None, v_env, "/models/Qwen2.5-7B-Instruct", "fp1:aaaa"),
        ),
        record(
            1,
            "vllm",
            "llama",
            LLAMA_ARGV,
            "b4100",
            "gpushift",
            "night",
            launch("gpushift-llama.service", "2" * 64, l_env, "/models/qwen2.5-7b-q4_k_m.gguf", "fp1:bbbb"),
        ),
        record(
            2,
            "llama",
            "vllm",
            VLLM_ARGV,
            "0.6.3.post1",
            "gpushift",
            "day",
            launch("gpushift-vllm.service", None, v_env, "/models/Qwen2.5-7B-Instruct", "fp1:aaaa"),
        ),
        record(
            3,
            "vllm",
            "llama",
            llama_c16k,
            "b4200",
            "bob",
            "longer context for the report",
            launch("gpushift-llama.service", "3" * 64, l_env, "/models/qwen2.5-7b-q4_k_m.gguf", "fp1:bbbb"),
        ),
        record(
            4,
            "llama",
            "vllm",
            VLLM_ARGV,
            "0.8.1",
            "carol",
            "try vllm 0.8",
            launch(
                "gpushift-vllm.service",
                None,
                {"VLLM_ATTENTION_BACKEND": "FLASH_ATTN"},
                "/models/Qwen2.5-7B-Instruct",
                "fp1:cccc",
            ),
            outcome="rolled_back",
        ),
        record(5, "vllm", "off", [], "", "dave", "maintenance", {}),
    ]
    for rec in history:
        led.begin(rec)
        led.finish(rec)
    return led


@pytest.fixture
def env(tmp_path: Path) -> dict[str, Any]:
    state, run = tmp_path / "state", tmp_path / "run"
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text(
        f"""
[daemon]
bus = "session"
state_dir = "{state}"
runtime_dir = "{run}"

[gpu]
provider = "simulated"

[backends.vllm]
unit = "gpushift-vllm.service"
health_url = "http://127.0.0.1:8000/health"

[backends.llama]
unit = "gpushift-llama.service"
health_url = "http://127.0.0.1:8080/health"
"""
    )
    db = state / "ledger.db"
    led = build_history(db, run)
    led.close()
    return {"config": str(cfg), "db": db, "run": run}


def cli(env: dict[str, Any], *args: str) -> Result:
    return CliRunner().invoke(ledger, list(args), obj={"config_path": env["config"]}, catch_exceptions=False)


# --------------------------------------------------------------------------- list


def test_ledger_cli_list_json_is_newest_first_with_the_user_keys(env: dict[str, Any]) -> None:
    res = cli(env, "--json")
    assert res.exit_code == 0, res.output
    items = json.loads(res.output)
    assert [i["id"] for i in items] == [6, 5, 4, 3, 2, 1]
    for key in ("id", "outcome", "from", "to", "argv", "backend_version"):
        assert key in items[0]
    assert items[2]["argv"][items[2]["argv"].index("-c") + 1] == "16384"


def test_ledger_cli_list_table_and_filters(env: dict[str, Any]) -> None:
    res = cli(env, "--limit", "2")
    assert res.exit_code == 0
    lines = res.output.splitlines()
    assert lines[0].split()[:4] == ["ID", "STARTED", "SWITCH", "OUTCOME"]
    assert len(lines) == 3 and lines[1].startswith("6 ") and "vllm → off" in lines[1]
    only = json.loads(cli(env, "--outcome", "rolled_back", "--json").output)
    assert [i["id"] for i in only] == [5]
    llama = json.loads(cli(env, "--backend", "llama", "--json").output)
    assert {i["id"] for i in llama} == {2, 3, 4, 5}
    since = json.loads(cli(env, "--since", (T0 + timedelta(hours=36)).isoformat(), "--json").output)
    assert [i["id"] for i in since] == [6, 5, 4]
    bad = cli(env, "--since", "last tuesday")
    assert bad.exit_code != 0 and "--since" in bad.output


def test_ledger_cli_shows_records_pending_in_the_spool(env: dict[str, Any]) -> None:
    with sqlite3.connect(env["db"]) as c:
        pages = int(c.execute("PRAGMA page_count").fetchone()[0])
    daemon = SqliteLedger(
        env["db"],
        env["run"],
        log=lambda e, **k: None,
        connect_hook=lambda conn: conn.execute(f"PRAGMA max_page_count = {pages}"),
    )
    rec = record(
        6,
        "off",
        "llama",
        LLAMA_ARGV,
        "b4200",
        "erin",
        "disk is full tonight",
        launch("gpushift-llama.service", "3" * 64, {}, "/m.gguf", "fp1:dddd"),
    )
    assert daemon.begin(rec) < 0
    res = cli(env)
    assert res.exit_code == 0
    assert "degraded (1 pending" in res.output and "disk is full tonight" in res.output
    items = json.loads(cli(env, "--json").output)
    assert items[0]["reason"] == "disk is full tonight" and items[0]["pending_write"] is True
    assert len(list((env["run"] / SPOOL_SUBDIR).iterdir())) == 1  # the reader replayed nothing


def test_ledger_cli_empty_ledger(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'[daemon]\nstate_dir = "{tmp_path}/s"\nruntime_dir = "{tmp_path}/r"\n'
        '[backends.a]\nunit = "a.service"\nhealth_url = "http://127.0.0.1:1/health"\n'
    )
    res = CliRunner().invoke(ledger, [], obj={"config_path": str(cfg)})
    assert res.exit_code == 0 and "no switches recorded yet" in res.output
    assert not (tmp_path / "s" / "ledger.db").exists()  # reading created nothing
    assert json.loads(CliRunner().invoke(ledger, ["--json"], obj={"config_path": str(cfg)}).output) == []


def test_ledger_cli_bad_config_is_one_line_and_nonzero(tmp_path: Path) -> None:
    res = CliRunner().invoke(ledger, [], obj={"config_path": str(tmp_path / "missing.toml")})
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "config file not found" in res.output


# --------------------------------------------------------------------------- show


def test_ledger_cli_show_everything_marks_simulated_gpus(env: dict[str, Any]) -> None:
    res = cli(env, "show", "4")
    assert res.exit_code == 0, res.output
    out = res.output
    for expected in (
        "Switch 4",
        "longer context for the report",
        "bob (uid 1003)",
        "b4200",
        "/etc/systemd/system/gpushift-llama.service.d/override.conf",
        "LLAMA_ARG_THREADS=16",
        "-c 16384",
        "fp1:bbbb",
        "Tesla V100-PCIE-16GB",
        "v100-box",
        "5.15.0-105-generic",
        "ready",
    ):
        assert expected in out, expected
    gpu_lines = [line for line in out.splitlines() if "GPU-SIM-0" in line or line.startswith("GPUs")]
    assert gpu_lines and all("SIMULATED" in line for line in gpu_lines)
    assert "SIMULATED" in next(line for line in out.splitlines() if line.strip().startswith("driver"))


def test_ledger_cli_show_hides_credential_flags(env: dict[str, Any]) -> None:
    # Rows store (and show, in every format) a digest in place of a credential: equal values give
    # equal digests, so a diff still tells that the key changed.
    shown = redact.digest("sk-very-secret")
    out = cli(env, "show", "1").output
    assert "sk-very-secret" not in out
    assert f"--api-key '{shown}'" in out
    as_json = cli(env, "show", "1", "--json").output
    assert "sk-very-secret" not in as_json and json.loads(as_json)["argv"][-1] == shown


def test_ledger_cli_show_unknown_id_fails_with_one_line(env: dict[str, Any]) -> None:
    res = cli(env, "show", "99")
    assert res.exit_code != 0
    assert res.output.strip() == "gpushift ledger: no switch with id 99 in the ledger"


# --------------------------------------------------------------------------- diff


def test_ledger_cli_diff_reports_changed_flag_and_version(env: dict[str, Any]) -> None:
    res = cli(env, "diff", "2", "4")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "llama: #2 → #4" in out
    assert "flag changed    -c: 8192 → 16384" in out
    assert "version         backend: b4100 → b4200" in out
    assert "drop-in changed /etc/systemd/system/gpushift-llama.service.d/override.conf" in out
    assert "--parallel" not in out  # unchanged flags are not reported
    changes = json.loads(cli(env, "diff", "2", "4", "--json").output)["changes"]
    assert {"area": "flag", "change": "changed", "name": "-c", "old": "8192", "new": "16384"} in changes
    assert {
        "area": "version",
        "change": "changed",
        "name": "backend",
        "old": "b4100",
        "new": "b4200",
    } in changes


def test_ledger_cli_diff_without_ids_compares_each_backends_last_two_launches(env: dict[str, Any]) -> None:
    items = json.loads(cli(env, "diff", "--json").output)
    by = {i["backend"]: i for i in items}
    assert set(by) == {"vllm", "llama"}  # "off" launches nothing
    assert (by["llama"]["from_id"], by["llama"]["to_id"]) == (2, 4)
    assert (by["vllm"]["from_id"], by["vllm"]["to_id"]) == (3, 5)
    v = {(c["area"], c["name"]): (c["old"], c["new"]) for c in by["vllm"]["changes"]}
    assert v[("version", "backend")] == ("0.6.3.post1", "0.8.1")
    assert v[("env", "VLLM_ATTENTION_BACKEND")] == ("XFORMERS", "FLASH_ATTN")
    assert v[("model", "/models/Qwen2.5-7B-Instruct fingerprint")] == ("fp1:aaaa", "fp1:cccc")
    text = cli(env, "diff").output
    assert "vllm: #3 → #5" in text and "llama: #2 → #4" in text


def test_ledger_cli_diff_refuses_launches_of_different_backends(env: dict[str, Any]) -> None:
    res = cli(env, "diff", "1", "2")
    assert res.exit_code != 0 and "different backends" in res.output
    assert cli(env, "diff", "1").exit_code != 0


def test_ledger_diff_of_identical_launches_is_empty(env: dict[str, Any]) -> None:
    led = SqliteLedger.open_readonly(env["db"], env["run"])
    a, b = led.get(1), led.get(3)
    assert a is not None and b is not None
    assert diff_records(a, b) == []
    assert "no change" in cli(env, "diff", "1", "3").output


def test_ledger_parse_since_forms() -> None:
    now = datetime(2025, 3, 10, 12, 0, tzinfo=timezone.utc)
    assert parse_since("7d", now) == now - timedelta(days=7)
    assert parse_since("12h", now) == now - timedelta(hours=12)
    assert parse_since("2025-03-01T08:00+00:00") == datetime(2025, 3, 1, 8, 0, tzinfo=timezone.utc)
    assert parse_since("2025-03-01").tzinfo is not None  # local midnight, made aware


# --------------------------------------------------------------------------- export and verify


def test_ledger_cli_export_markdown_for_a_two_backend_history(env: dict[str, Any]) -> None:
    res = cli(env, "export", "--format", "markdown")
    assert res.exit_code == 0, res.output
    md = res.output
    assert md.startswith("# Deployment record: v100-box\n")
    assert "6 switch(es) recorded" in md
    assert "GPUs **SIMULATED**" in md and "driver 550.120, CUDA 12.4" in md
    vllm = md[md.index("## Backend `vllm`") : md.index("## Backend `llama`")]
    llama = md[md.index("## Backend `llama`") : md.index("## Latest switches")]
    # vllm: its current launch is the last one that succeeded (#3); #5 was rolled back.
    assert "Current launch: **#3**" in vllm
    assert "--kv-cache-dtype fp8_e5m2" in vllm and "--tensor-parallel-size 2" in vllm
    assert "- Version: 0.6.3.post1 (from url)" in vllm
    assert "sk-very-secret" not in md
    assert "**#5**" in vllm and "carol" in vllm and "“try vllm 0.8” → rolled_back" in vllm
    assert "  - version backend: 0.6.3.post1 → 0.8.1" in vllm
    assert "  - env changed VLLM_ATTENTION_BACKEND: XFORMERS → FLASH_ATTN" in vllm
    assert "**#1**" in vllm and "first launch recorded" in vllm
    assert "**#3**" not in vllm.split("### History")[1]  # no change at #3: counted, not listed
    assert "1 more launch(es) with no change" in vllm
    # llama: the current command has the drop-in's new -c, the history says who changed it and why.
    assert "Current launch: **#4**" in llama
    assert "-c 16384" in llama and "- Version: b4200 (from command)" in llama
    assert "Drop-in: `/etc/systemd/system/gpushift-llama.service.d/override.conf`" in llama
    assert "bob (uid 1003), manual: “longer context for the report” → ok" in llama
    assert "  - flag changed -c: 8192 → 16384" in llama
    hist = llama.split("### History")[1]
    assert hist.index("**#4**") < hist.index("**#2**")  # newest first
    table = md[md.index("## Latest switches") :]
    assert "| 6 |" in table and "| vllm → off |" in table and "| dave | maintenance | ok |" in table


def test_ledger_cli_export_jsonl_is_every_record_oldest_first(env: dict[str, Any]) -> None:
    res = cli(env, "export", "--format", "jsonl")
    lines = [json.loads(line) for line in res.output.splitlines()]
    assert [d["id"] for d in lines] == [1, 2, 3, 4, 5, 6]
    assert lines[3]["backend_version"] == "b4200"


def test_ledger_cli_verify_passes_then_names_an_edited_row(env: dict[str, Any]) -> None:
    ok = cli(env, "verify")
    assert ok.exit_code == 0 and ok.output.startswith("ledger ok: 6 rows")
    with sqlite3.connect(env["db"]) as c:
        c.execute("UPDATE switches SET requested_by = 'mallory' WHERE id = 3")
    bad = cli(env, "verify")
    assert bad.exit_code != 0
    assert bad.output.strip().count("\n") == 0
    assert "row 3" in bad.output and "FAILED" in bad.output


@pytest.mark.parametrize(
    "args",
    [
        ["--limit", str(10**30)],
        ["--limit", "0"],
        ["--limit", "1000001"],
        ["--since", "99999999999d"],
        ["--since", "9999999w"],
        ["--backend", "-h"],
        ["--backend", "a\x1b[2J"],
        ["show", str(2**63)],
        ["show", "0"],
        ["diff", "1", str(10**30)],
    ],
)
def test_ledger_cli_out_of_range_arguments_are_usage_errors(env: dict[str, Any], args: list[str]) -> None:
    """An argument out of its range is click's usage error (exit 2) naming the option, never a
    traceback (10**30 rows overflowed SQLite's integer; a huge age overflowed timedelta)."""
    res = cli(env, *args)
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and "Error: Invalid value" in res.output

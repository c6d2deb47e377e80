"""`gpushift check` on the SHIPPED example config and units, read from a real systemd user manager,
with the simulated 2×V100 host (sm_70)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GPUSHIFT = str(Path(sys.executable).parent / "gpushift")

STABLE_KEYS = {"ok", "config", "schedule", "gpu", "units", "findings", "errors", "warnings"}


def shipped_config(base: Path) -> Path:
    """The shipped example, moved to the session bus and the simulated GPUs of this machine."""
    text = (REPO / "etc/gpushift/gpushift.toml").read_text()
    text = text.replace('bus = "system"', 'bus = "session"')
    text = text.replace('provider = "nvml"', 'provider = "simulated"')
    text = text.replace('state_dir = "/var/lib/gpushift"', f'state_dir = "{base / "state"}"')
    text = text.replace('runtime_dir = "/run/gpushift"', f'runtime_dir = "{base / "run"}"')
    text = text.replace(
        'schedule = "/etc/gpushift/schedule"', f'schedule = "{REPO / "etc/gpushift/schedule"}"'
    )
    path = base / "gpushift.toml"
    path.write_text(text)
    return path


def run_check(sandbox, cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(sandbox.env, GPUSHIFT_CONFIG=str(cfg))
    return subprocess.run([GPUSHIFT, "check", *args], env=env, capture_output=True, text=True, timeout=60)


def install_shipped_units(sandbox) -> None:
    for name in ("gpushift-vllm.service", "gpushift-llama.service"):
        sandbox.install_unit(name, (REPO / "units" / name).read_text())
    sandbox.daemon_reload()


def test_check_reports_on_shipped_config_and_units(sandbox):
    base = Path(sandbox.base_dir) / "check"
    base.mkdir()
    cfg = shipped_config(base)
    install_shipped_units(sandbox)
    r = run_check(sandbox, cfg)
    # the shipped units name model files that do not exist on this machine: errors, exit 1
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    assert "config" in out and "ok" in out.splitlines()[0]
    assert "schedule" in out and "TZ Asia/Shanghai" in out
    assert "SIMULATED" in out and "sm_70" in out
    assert "backend vllm (gpushift-vllm.service" in out and "backend llama (gpushift-llama.service" in out
    assert "[model-path-missing]" in out and "/models/Qwen2.5-7B-Instruct" in out
    # the shipped vLLM flags are the right ones for Volta: no FP8/BF16 findings
    assert "fp8-unsupported" not in out and "bf16-emulated" not in out
    j = run_check(sandbox, cfg, "--json")
    rep = json.loads(j.stdout)
    assert set(rep) >= STABLE_KEYS
    assert rep["ok"] is False and rep["errors"] >= 2
    for f in rep["findings"]:
        assert set(f) == {"severity", "code", "backend", "message", "hint"}
    assert rep["units"]["vllm"]["exec_start"][:3] == [
        "/opt/vllm/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]


def test_check_finds_fp8_on_volta_from_a_dropin(sandbox):
    base = Path(sandbox.base_dir) / "check"
    base.mkdir()
    cfg = shipped_config(base)
    install_shipped_units(sandbox)
    model = base / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))
    sandbox.install_dropin(
        "gpushift-vllm.service",
        "10-fp8.conf",
        f"[Service]\nEnvironment=MODEL={model}\nExecStart=\nExecStart=/opt/vllm/bin/python -m "
        "vllm.entrypoints.openai.api_server --model ${MODEL} --port 8001 --quantization fp8 "
        "--tensor-parallel-size 4\n",
    )
    sandbox.daemon_reload()
    rep = json.loads(run_check(sandbox, cfg, "--json").stdout)
    codes = {(f["backend"], f["code"], f["severity"]) for f in rep["findings"]}
    assert ("vllm", "fp8-unsupported", "error") in codes
    assert ("vllm", "tensor-parallel-too-large", "error") in codes
    assert ("vllm", "model-path-missing", "error") not in codes  # ${MODEL} expanded, dir exists
    fp8 = next(f for f in rep["findings"] if f["code"] == "fp8-unsupported")
    assert "fp8_e5m2" in fp8["hint"] or "fp8_e5m2" in fp8["message"]


def test_check_rejects_invalid_config_with_exit_2(tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[daemon]\nbus = 'bogus'\n")
    r = subprocess.run(
        [GPUSHIFT, "--config", str(cfg), "check"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )
    assert r.returncode == 2
    assert "daemon.bus" in r.stdout and "bogus" in r.stdout


def test_check_names_hook_programs_the_hooks_user_cannot_run(sandbox):
    base = Path(sandbox.base_dir) / "check"
    base.mkdir()
    cfg = shipped_config(base)
    install_shipped_units(sandbox)
    bin_dir = Path(tempfile.mkdtemp(prefix="gs-check-hooks-", dir="/tmp"))
    try:
        bin_dir.chmod(0o755)
        private = bin_dir / "after-ready"
        private.write_text("#!/bin/sh\nexit 0\n")
        private.chmod(0o700)  # root's own: the hooks run as nobody
        fine = bin_dir / "page"
        fine.write_text("#!/bin/sh\nexit 0\n")
        fine.chmod(0o755)
        cfg.write_text(
            cfg.read_text()
            + "\n[hooks]\n"
            + 'before_stop = { argv = ["/nonexistent/gpushift-may-stop"], required = true }\n'
            + f'after_ready = ["{private}"]\n'
            + f'on_failure = ["{fine}", "--team", "inference"]\n'
        )
        r = run_check(sandbox, cfg)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "hooks (run as nobody)" in r.stdout
        assert "before_stop: /nonexistent/gpushift-may-stop: ERROR: cannot be run: No such file" in r.stdout
        assert f"after_ready: {private}: ERROR: is not executable by nobody" in r.stdout
        assert f"on_failure: {fine}: ok" in r.stdout
        rep = json.loads(run_check(sandbox, cfg, "--json").stdout)
        by_event = {h["event"]: h for h in rep["hooks"]["hooks"]}
        assert by_event["before_stop"]["ok"] is False and by_event["before_stop"]["required"] is True
        assert by_event["after_ready"]["ok"] is False and by_event["on_failure"]["ok"] is True
        assert rep["hooks"]["errors"] == 2
    finally:
        shutil.rmtree(bin_dir, ignore_errors=True)


def test_check_fails_when_state_dir_or_runtime_dir_is_not_a_usable_directory(sandbox):
    """A state_dir that is a regular file: the daemon would refuse every switch, so check says so."""
    base = Path(sandbox.base_dir) / "check"
    base.mkdir()
    cfg = shipped_config(base)
    install_shipped_units(sandbox)
    r = run_check(sandbox, cfg)
    assert "state_dir" in r.stdout and f"{base / 'state'}: ok" in r.stdout, r.stdout
    shutil.rmtree(base / "state", ignore_errors=True)
    (base / "state").write_text("not a directory\n")  # a file where the state directory belongs
    (base / "run-parent").write_text("")
    cfg.write_text(cfg.read_text().replace(f'"{base / "run"}"', f'"{base / "run-parent" / "run"}"'))
    r = run_check(sandbox, cfg)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"state_dir {base / 'state'}: ERROR: is not a directory" in r.stdout
    assert (
        f"runtime_dir {base / 'run-parent' / 'run'}: ERROR: cannot be made: {base / 'run-parent'} is not a directory"
        in r.stdout
    )
    rep = json.loads(run_check(sandbox, cfg, "--json").stdout)
    by_key = {d["setting"]: d for d in rep["directories"]}
    assert by_key["state_dir"]["ok"] is False and by_key["runtime_dir"]["ok"] is False
    assert rep["ok"] is False

"""A backend's version command, run for real: parsing, failures, the timeout, bounded output."""

from __future__ import annotations

import os
import sys
import time
import tracemalloc
from pathlib import Path
from typing import cast

import pytest

from gpushift import doctor
from gpushift.backends.version import parse_version_output, run_version_command
from gpushift.config.schema import parse
from gpushift.doctor.facts import run_checks
from gpushift.ports import GpuProbe
from gpushift.values import HostGpuFacts


def test_version_command_parses_llama_server_output() -> None:
    cmd = ["sh", "-c", "echo 'load_backend: loaded CPU backend' >&2; echo 'version: 6143 (0e55e3a1)' >&2"]
    v = run_version_command(cmd)
    assert v.version == "6143 (0e55e3a1)" and v.source == "command" and "load_backend" in v.raw
    assert parse_version_output("version: 1 (abc)\nbuilt with cc") == "1 (abc)"
    new = "load_backend: x\nversion: 0.6.0-dev (build 11434, commit b11434)\nbuilt with GNU 12.2.0"
    assert parse_version_output(new) == "0.6.0-dev (build 11434, commit b11434)"
    assert parse_version_output("ggml_version is 3\nnothing here") is None


def test_version_command_bare_version_of_a_successful_run_is_its_first_line() -> None:
    # vllm --version prints only the version.
    assert run_version_command(["sh", "-c", "echo 0.6.3.post1"]).version == "0.6.3.post1"


def test_version_command_failed_run_without_a_version_line_has_no_version() -> None:
    v = run_version_command(["sh", "-c", "echo 'error while loading shared libraries' >&2; exit 127"])
    assert v.version is None and "shared libraries" in v.raw
    v = run_version_command(["sh", "-c", "echo 'version: 7312 (a1b2c3d)'; exit 1"])
    assert v.version == "7312 (a1b2c3d)"  # the version line counts whatever the exit status


def test_version_command_missing_program_has_no_version() -> None:
    v = run_version_command(["/nonexistent/llama-server", "--version"])
    assert v.version is None and v.source == "command" and v.raw.startswith("error:")


def test_version_command_runs_without_a_shell() -> None:
    v = run_version_command(["echo", "version: $HOME; true"])
    assert v.version == "$HOME; true"


def test_version_command_undecodable_output_is_replaced_not_fatal() -> None:
    v = run_version_command(["printf", "\\377\\376 junk\\nversion: 7312 (abc)\\n"])
    assert v.version == "7312 (abc)" and "\ufffd" in v.raw


def test_version_command_past_its_timeout_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    start = time.monotonic()
    v = run_version_command(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 60"], timeout_s=0.5)
    assert time.monotonic() - start < 5
    assert v.version is None and "timed out" in v.raw
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped, not left behind


def test_version_command_endless_output_keeps_memory_bounded() -> None:
    # A command that never stops talking: what is kept stays small, and the timeout still ends it.
    tracemalloc.start()
    try:
        v = run_version_command([sys.executable, "-c", "while True: print('x' * 4096)"], timeout_s=1.0)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert v.version is None and "timed out" in v.raw
    assert peak < 4 * 1024 * 1024, f"{peak} bytes held while reading"


def test_check_compares_the_pin_with_the_version_the_command_reports() -> None:
    # gpushift check runs the same version command as a switch does.
    day = 'unit = "d.service", health_url = "http://127.0.0.1:8000/health", kind = "vllm"'
    cfg = parse(
        f'backends.day = {{ {day}, pinned_version = "0.6.3.post1", version_command = ["sh", "-c", "echo 0.8.5"] }}'
    )
    facts = HostGpuFacts(simulated=True, driver_version=None, cuda_version=None, gpus=())
    findings, _facts, _states = run_checks(cfg, None, cast(GpuProbe, None), None, facts=facts)
    pinned = [f for f in findings if f.code == doctor.VERSION_NOT_PINNED]
    assert len(pinned) == 1 and "0.8.5" in pinned[0].message

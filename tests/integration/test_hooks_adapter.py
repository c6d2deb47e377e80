"""The hook runner alone: real scripts as transient units of a real systemd manager (the sandbox).

Each script records who it ran as (``id -u``), its argv and its environment into a file, so the
tests assert what a hook author relies on: the configured user, the argv exactly as written (no
shell, no ``$VAR`` expansion), the ``GPUSHIFT_*`` variables, the exit status, its output's end in
the outcome (the file under ``runtime_dir/hooks`` deleted), a timeout and a cancel that end it,
and no unit left behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushift.host.hookunits import SystemdHookRunner
from gpushift.host.systemd import SystemdUnits
from gpushift.values import HookSpec

NOBODY = 65534

RECORDER = """#!/bin/sh
out="$1"; shift
id -u > "$out/uid"
for a in "$@"; do printf '%s\\n' "$a"; done > "$out/argv"
env | grep '^GPUSHIFT_' | sort > "$out/env"
echo "to stdout"
echo "to stderr" >&2
exit "${EXIT_WITH:-0}"
"""


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory every user can read (the hook runs as nobody), with one nobody may write."""
    d = Path(tempfile.mkdtemp(prefix="gpushift-hooks-"))
    try:
        d.chmod(0o755)
        (d / "rec").mkdir(mode=0o777)
        (d / "rec").chmod(0o777)
        (d / "run").mkdir(mode=0o755)
        script = d / "recorder"
        script.write_text(RECORDER)
        script.chmod(0o755)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def runner(bus: Any, place: Path) -> SystemdHookRunner:
    return SystemdHookRunner(SystemdUnits(bus), str(place / "run"))


def collected(sandbox: Any, unit: str, wait_for: Any) -> None:
    """Released and garbage-collected: systemd has forgotten the unit (no failed unit is left)."""
    wait_for(
        lambda: sandbox.show(unit, "LoadState")["LoadState"] == "not-found",
        10,
        f"{unit} to be collected",
        lambda: str(sandbox.show(unit, "LoadState", "ActiveState", "Result")),
    )


def spec(name: str, argv: list[str], timeout_s: float = 30.0, **env: str) -> HookSpec:
    return HookSpec(name, tuple(argv), {"GPUSHIFT_EVENT": "after_ready", **env}, "nobody", timeout_s)


def test_a_hook_runs_as_the_configured_user_with_its_argv_as_written_and_its_environment(
    sandbox: Any, runner: SystemdHookRunner, place: Path, wait_for: Any
) -> None:
    beats: list[float] = []
    s = spec(
        "gpushift-hook-after-ready-t1.service",
        [str(place / "recorder"), str(place / "rec"), "$HOME", "a b", "${GPUSHIFT_TO}", "*"],
        GPUSHIFT_TO="night",
        GPUSHIFT_REASON="evening; rm -rf / $(x)",
    )
    out = runner.run(s, lambda: False, lambda: beats.append(time.monotonic()))
    assert out.ok and (out.result, out.exit_status) == ("success", 0), out
    assert (place / "rec" / "uid").read_text().strip() == str(NOBODY)
    assert (place / "rec" / "argv").read_text().splitlines() == ["$HOME", "a b", "${GPUSHIFT_TO}", "*"]
    env = dict(line.split("=", 1) for line in (place / "rec" / "env").read_text().splitlines())
    assert env["GPUSHIFT_EVENT"] == "after_ready" and env["GPUSHIFT_TO"] == "night"
    assert env["GPUSHIFT_REASON"] == "evening; rm -rf / $(x)"
    assert "to stdout" in out.output and "to stderr" in out.output
    assert beats, "the heartbeat was not called while the hook ran"
    assert os.listdir(place / "run" / "hooks") == [], "the output file was not deleted"
    # Released and collected: no unit is left loaded.
    collected(sandbox, s.name, wait_for)


def test_a_non_zero_exit_is_its_status_and_its_output_is_kept(
    sandbox: Any, runner: SystemdHookRunner, place: Path, wait_for: Any
) -> None:
    script = place / "fails"
    script.write_text("#!/bin/sh\necho 'batch job 4411 still running'\nexit 7\n")
    script.chmod(0o755)
    out = runner.run(spec("gpushift-hook-before-stop-t2.service", [str(script)]), lambda: False, lambda: None)
    assert (out.result, out.exit_status, out.ok) == ("exit-code", 7, False), out
    assert out.output.strip() == "batch job 4411 still running"
    assert out.describe() == "exit status 7"
    collected(sandbox, out.unit, wait_for)


def test_a_hook_past_its_timeout_is_killed_and_says_timeout(
    sandbox: Any, runner: SystemdHookRunner, place: Path, wait_for: Any
) -> None:
    script = place / "slow"
    script.write_text(f"#!/bin/sh\necho started\nexec sleep 60 # {place}\n")
    script.chmod(0o755)
    t0 = time.monotonic()
    out = runner.run(
        spec("gpushift-hook-after-ready-t3.service", [str(script)], timeout_s=1), lambda: False, lambda: None
    )
    assert out.result == "timeout" and not out.ok, out
    assert time.monotonic() - t0 < 30
    assert "started" in out.output
    collected(sandbox, out.unit, wait_for)


def test_a_cancel_stops_a_running_hook(
    sandbox: Any, runner: SystemdHookRunner, place: Path, wait_for: Any
) -> None:
    script = place / "waits"
    script.write_text("#!/bin/sh\necho waiting\nexec sleep 60\n")
    script.chmod(0o755)
    cancel = threading.Event()
    threading.Timer(1.0, cancel.set).start()
    t0 = time.monotonic()
    out = runner.run(spec("gpushift-hook-before-stop-t4.service", [str(script)]), cancel.is_set, lambda: None)
    assert out.result == "cancelled" and not out.ok, out
    assert time.monotonic() - t0 < 30
    collected(sandbox, out.unit, wait_for)


def test_a_program_that_cannot_be_run_fails_the_hook_and_leaves_nothing(
    sandbox: Any, runner: SystemdHookRunner, place: Path, wait_for: Any
) -> None:
    out = runner.run(
        spec("gpushift-hook-on-failure-t5.service", [str(place / "missing")]), lambda: False, lambda: None
    )
    assert not out.ok and out.result == "exit-code" and out.exit_status == 203, out  # 203/EXEC
    collected(sandbox, out.unit, wait_for)

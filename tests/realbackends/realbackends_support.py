"""Helpers of the real-backend tests: paths of the venv that setup.sh builds, HTTP on loopback,
servers started as plain subprocesses that are always stopped again (by PID, then their own
process group).  Imported by conftest.py and the tests as ``realbackends_support`` (a name no other
test directory uses).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
RB_DIR = Path(os.environ.get("GPUSHIFT_REALBACKENDS_DIR", "/var/cache/gpushift/realbackends"))
VENV = Path(os.environ.get("GPUSHIFT_REALBACKENDS_VENV", str(RB_DIR / "venv")))
MODEL_DIR = Path(os.environ.get("GPUSHIFT_REALBACKENDS_MODEL", str(RB_DIR / "tiny-model")))

#: Keeps every backend off the network: no model hub, no telemetry.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}

#: The shipped example units; their hardening block lies between these two comment lines.
UNITS = HERE.parents[1] / "units"
HARDENING_BEGIN = "# --- hardening (begin)"
HARDENING_END = "# --- hardening (end)"
#: Lines of the block that the tests' systemd user manager cannot carry out, and why.  Everything
#: else runs exactly as shipped.
USER_MANAGER_CANNOT = {
    # DynamicUser= is for system services only (systemd.exec(5)): a user manager runs its units as
    # its own user.  The sandbox's manager runs as root, so the servers run as root here, but with
    # the empty capability bounding set and everything else the block says.
    "DynamicUser",
}


def hardening_lines(unit: str) -> list[str]:
    """The directives of ``units/UNIT``'s hardening block (comments dropped), as written there."""
    lines = (UNITS / unit).read_text(encoding="utf-8").splitlines()
    begin = [i for i, ln in enumerate(lines) if ln.startswith(HARDENING_BEGIN)]
    end = [i for i, ln in enumerate(lines) if ln.startswith(HARDENING_END)]
    assert len(begin) == 1 and len(end) == 1 and begin[0] < end[0], f"units/{unit}: no single hardening block"
    return [ln for ln in lines[begin[0] + 1 : end[0]] if ln.strip() and not ln.lstrip().startswith("#")]


def hardening_block(unit: str) -> str:
    """``[Service]`` lines for a test unit: the shipped block less what a user manager cannot do."""
    kept = [ln for ln in hardening_lines(unit) if ln.split("=", 1)[0].strip() not in USER_MANAGER_CANNOT]
    return "".join(f"{ln}\n" for ln in kept)


SETUP_HINT = "run `bash tests/realbackends/setup.sh` first (`make test-real` does)"


@dataclass(frozen=True)
class RealBackends:
    venv: Path
    python: Path
    llama_server: Path
    llama_quantize: Path

    def package_version(self, name: str) -> str:
        out = subprocess.run(
            [
                str(self.python),
                "-c",
                "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))",
                name,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return out.stdout.strip()


@dataclass(frozen=True)
class TinyModel:
    hf_dir: Path
    gguf: Path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel picks it, so parallel runs do not collide)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Reply:
    status: int | None  # None: no HTTP answer (connection refused, reset, timed out)
    body: str
    error: str = ""

    def json(self) -> Any:
        return json.loads(self.body)


def http(url: str, payload: Mapping[str, Any] | None = None, timeout_s: float = 60.0) -> Reply:
    """GET (or POST JSON) on loopback; HTTP errors are replies, connection failures have no status."""
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return Reply(r.status, r.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as e:
        return Reply(e.code, e.read().decode("utf-8", "replace"))
    except (OSError, urllib.error.URLError) as e:
        return Reply(None, "", repr(e))


def group_pids(pgid: int) -> list[int]:
    """The live processes of one process group (read from /proc; zombies are not counted)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # Fields after the command (which may hold spaces) start after the last ')'.
        rest = stat[stat.rindex(")") + 2 :].split()
        state, pgrp = rest[0], int(rest[2])
        if pgrp == pgid and state != "Z":
            out.append(int(entry))
    return out


def process_title(pid: int) -> str:
    """What ``ps`` shows as the command: vLLM retitles its children ``VLLM::EngineCore`` etc.
    (``/proc/PID/comm`` would cut that to 15 characters)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


@dataclass
class Server:
    """A backend started by a test, in a session (and process group) of its own."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        log = open(self.log_path, "wb")  # noqa: SIM115 - handed to the child, closed in stop()
        self.started_at = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **OFFLINE_ENV, **self.env},
            start_new_session=True,
        )
        log.close()

    def log_tail(self, n: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def wait_healthy(self, url: str, deadline_s: float, interval_s: float = 0.2) -> list[int | None]:
        """Poll ``url`` until 200; returns every status seen before (None = no answer)."""
        seen: list[int | None] = []
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            r = http(url, timeout_s=5)
            if r.status == 200:
                return seen
            seen.append(r.status)
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(
                    f"{self.name} exited with {self.proc.returncode} before it was healthy:\n{self.log_tail()}"
                )
            time.sleep(interval_s)
        pytest.fail(
            f"{self.name} not healthy at {url} within {deadline_s:.0f} s (saw {seen[-5:]}):\n{self.log_tail()}"
        )

    def terminate(self, timeout_s: float) -> float | None:
        """SIGTERM the main process; seconds until its whole process group was gone, or None."""
        t0 = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        while time.monotonic() - t0 < timeout_s:
            assert self.proc is not None
            self.proc.poll()  # reap the main process so it does not linger as a zombie
            if not group_pids(self.pid):
                return time.monotonic() - t0
            time.sleep(0.05)
        return None

    def stop(self) -> None:
        """Always safe: SIGTERM, then SIGKILL for whatever of this server's own group is left."""
        if self.proc is None:
            return
        if self.terminate(timeout_s=30) is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)  # the group this test created, nothing else
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)


VERSION_RE = re.compile(
    # llama.cpp since 0.x: "version: 0.6.0-dev (build 11434, commit b11434)"; older: "version: 7312 (a1b2c3d)".
    r"^version: (?:(?P<semver>\S+) \(build (?P<build>\d+), commit (?P<commit>\S+)\)|(?P<n>\d+) \((?P<c>\S+)\))",
    re.MULTILINE,
)

"""The stand-in's view of the GPU device files it holds: who else holds them (``--witness``) and
the orphan it leaves behind on SIGTERM (``--orphan-on-sigterm``).  Split from
:mod:`tests.support.standin` to keep each module short; the stand-in is their only user."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any


def own_cgroup(pid: int | str = "self") -> str | None:
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    # The cgroup v2 line, else the v1 name=systemd one: where systemd tracks a unit's processes.
    for line in lines:
        if line.startswith("0::"):
            return line[3:]
    for line in lines:
        if ":name=systemd:" in line:
            return line.split(":", 2)[2]
    return None


def holds(pid: int, path: str) -> bool:
    target = os.path.realpath(path)
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                return True
    return False


def other_holders(paths: Sequence[str]) -> list[dict[str, Any]]:
    """Every process but this one holding one of ``paths`` open: pid, name, cgroup, which paths."""
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        held = [p for p in paths if holds(pid, p)]
        if not held:
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            comm = "?"
        found.append({"pid": pid, "comm": comm, "cgroup": own_cgroup(pid), "paths": held})
    return found


def write_witness(path: str, devices: Sequence[str]) -> None:
    """Append what this process saw at its start (see ``--witness``) as one JSON line to ``path``."""
    record = {
        "pid": os.getpid(),
        "cgroup": own_cgroup(),
        "time": time.time(),
        "devices": list(devices),
        "others": other_holders(devices),
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())  # one write: lines never interleave
    finally:
        os.close(fd)


def leave_orphan(
    path: str, pid_file: str | None, log: Callable[[str], None], timeout_s: float = 25.0
) -> int | None:
    """Start a holder of ``path`` in a transient scope (outside this unit's cgroup) and wait until it holds.

    Returns:
        The orphan's pid, or None when it could not be made (the reason is logged).
    """
    unit = f"standin-orphan-{os.getpid()}"
    argv = [
        "systemd-run",
        "--user",
        "--scope",
        "--quiet",
        f"--unit={unit}",
        "--description=stand-in orphan holding a GPU device",
        "--",
        sys.executable,
        "-m",
        "gpushift.host.simgpu",
        "hold",
        path,
    ]
    # systemd-run --scope moves itself into the new scope, then execs the holder: same pid.  Until it
    # has moved it is still in this unit's cgroup, where systemd's SIGTERM to every process of the
    # unit reaches it too ("systemd-run exited with -15"): it ignores SIGTERM until the holder, which
    # installs its own handler, runs.
    child = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=sys.stdout,
        stderr=sys.stdout,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN),
    )
    mine = own_cgroup()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.poll() is not None:
            log(f"orphan: systemd-run exited with {child.returncode}; no orphan left")
            return None
        theirs = own_cgroup(child.pid)
        if theirs is not None and theirs != mine and holds(child.pid, path):
            log(f"orphan pid {child.pid} holding {path} in {theirs}")
            if pid_file:
                tmp = pid_file + ".tmp"
                with open(tmp, "w") as f:
                    f.write(f"{child.pid}\n")
                os.replace(tmp, pid_file)
            return child.pid
        time.sleep(0.05)
    log(f"orphan: pid {child.pid} did not reach its own scope holding {path} within {timeout_s:g} s")
    return None

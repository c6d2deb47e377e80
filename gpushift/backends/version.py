"""A backend's version from its ``version_command`` (``llama-server --version``,
``vllm --version``): the one place such a command runs, for the switch's record and for the doctor.

The command runs as an argv (no shell), with stdin from ``/dev/null``, under one timeout; at most
:data:`OUTPUT_LIMIT_BYTES` of each of its streams are kept, decoded with ``errors="replace"``.
"""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import time
from collections.abc import Sequence

from gpushift.values import VersionInfo

#: How long a version command may run (``vllm --version`` imports torch first: seconds).
VERSION_COMMAND_TIMEOUT_S = 10.0
#: How much of each stream (stdout, stderr) is kept; the rest is read and dropped.
OUTPUT_LIMIT_BYTES = 64 * 1024
# What VersionInfo.raw keeps of the output.
_RAW_CHARS = 2000

# llama-server --version (on stderr): "version: 0.6.0-dev (build 11434, commit b11434)" now,
# "version: 6143 (0e55e3a1)" before; other lines ("built with ...") are not the version.
_VERSION_RE = re.compile(r"^\s*version:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)


def parse_version_output(text: str) -> str | None:
    """``version: 6143 (0e55e3a1)`` (llama-server --version, on stderr) → ``6143 (0e55e3a1)``;
    ``version: 0.6.0-dev (build 11434, commit b11434)`` → that whole line after ``version:``."""
    m = _VERSION_RE.search(text)
    return m.group(1).strip() if m else None


def run_version_command(argv: Sequence[str], timeout_s: float = VERSION_COMMAND_TIMEOUT_S) -> VersionInfo:
    """Run a backend's version command and read its version.

    Args:
        argv: the command (the config's ``version_command``), run without a shell.
        timeout_s: how long it may run before it is killed.

    Returns:
        ``source="command"``; ``version``: the value of a ``version:`` line in its output (stdout,
        then stderr), else the first line of the output of a run that exited 0 (``vllm --version``
        prints the bare version), else ``None``; ``raw``: the output, or the error.
    """
    try:
        code, out, err = _run_bounded(argv, timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        return VersionInfo(None, "command", f"error: {e}")
    raw = (out.decode("utf-8", "replace") + "\n" + err.decode("utf-8", "replace")).strip()
    first = raw.splitlines()[0] if raw and code == 0 else None
    return VersionInfo(parse_version_output(raw) or first, "command", raw[:_RAW_CHARS])


def _run_bounded(argv: Sequence[str], timeout_s: float) -> tuple[int, bytes, bytes]:
    """(exit status, stdout, stderr), each stream cut at OUTPUT_LIMIT_BYTES.

    Raises:
        OSError: the command cannot be started.
        subprocess.TimeoutExpired: it ran longer than ``timeout_s`` (it has been killed).
    """
    deadline = time.monotonic() + timeout_s
    with subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        kept = {out_fd: bytearray(), err_fd: bytearray()}
        try:
            with selectors.DefaultSelector() as sel:
                for fd in kept:
                    sel.register(fd, selectors.EVENT_READ)
                while sel.get_map():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise subprocess.TimeoutExpired(list(argv), timeout_s)
                    for key, _events in sel.select(left):
                        chunk = os.read(key.fd, 65536)
                        if not chunk:
                            sel.unregister(key.fd)
                        buf = kept[key.fd]
                        buf += chunk[: OUTPUT_LIMIT_BYTES - len(buf)]
            code = proc.wait(max(deadline - time.monotonic(), 0.0))
        except BaseException:
            proc.kill()
            raise
    return code, bytes(kept[out_fd]), bytes(kept[err_fd])

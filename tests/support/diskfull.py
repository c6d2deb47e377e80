"""A full disk for real: a sandbox whose daemon state directory is a small tmpfs of its own.

The tmpfs is mounted before the sandbox's manager starts (the manager runs in a mount namespace of
its own and sees only what was there at its start); :func:`fill` then writes a file until no byte
is left.  Needs root (``mount``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from .sandbox import Sandbox


@contextlib.contextmanager
def sandbox_with_small_state(name: str, size_mib: int) -> Iterator[tuple[Sandbox, Path, Path]]:
    """A started :class:`Sandbox` under ``/run/NAME-PID`` and a ``size_mib`` tmpfs at ``ROOT/state``.

    Yields ``(sandbox, root, state)``; stops the sandbox, unmounts and removes ``root`` afterwards,
    also when the body failed.
    """
    root = Path(os.environ.get("GPUSHIFT_TEST_TMP", "/run")) / f"{name}-{os.getpid()}"
    state = root / "state"
    state.mkdir(parents=True)
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(state)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        subprocess.run(["rm", "-rf", str(root)], check=False)
        raise AssertionError(f"cannot mount a tmpfs as a small state directory (needs root): {r.stderr}")
    sb = Sandbox(root / "sb")
    try:
        sb.start()
        yield sb, root, state
    finally:
        sb.stop()
        subprocess.run(["umount", "-l", str(state)], check=False)
        subprocess.run(["rm", "-rf", str(root)], check=False)


def fill(path: Path) -> None:
    """Write ``path`` until its filesystem is full.

    Unbuffered: a buffered file would try to write its rest again when closed, and fail there.
    """
    with open(path, "wb", buffering=0) as f:
        try:
            while f.write(b"\0" * 65536):
                pass
        except OSError:
            pass

"""Opening a path that came from outside gpushift — a model named in a backend's command line,
a model directory's ``config.json``, a unit's file or drop-in — without hanging and without
touching anything but a regular file.

The daemon runs as root; the path is whatever the backend's ``ExecStart=`` says.  A plain
``open()`` of a FIFO blocks until somebody writes to it (a worker stuck forever), and opening a
device runs its driver's open (``/dev/watchdog`` arms the hardware watchdog; a tape rewinds).  So:

1. The path is resolved with ``O_PATH``: the kernel looks it up (symlinks followed) and hands back a
   descriptor of the object WITHOUT opening it — no FIFO open, no driver call.
2. Its type is checked on that descriptor (``fstat``, ``S_ISREG``); anything else is
   :class:`Skipped` with a reason (``not a regular file (FIFO)``).
3. Only then the same inode is opened for reading, through ``/proc/self/fd/N`` (no second lookup of
   the path, so nothing can be swapped in between), with ``O_RDONLY | O_NONBLOCK | O_NOCTTY |
   O_CLOEXEC``, and checked again on the open descriptor.
4. Callers read a bounded number of bytes (:func:`read_bounded`, or their own bound).

Symlinks ARE followed (no ``O_NOFOLLOW``): a Hugging Face cache links ``snapshots/<rev>/*`` to
``blobs/<sha>``, and people point ``current.gguf`` at the quantisation in use; refusing them would
skip most real models.  Following is safe here because the decision is taken on the resolved inode
in step 2, before any open that could block or reach a driver.

What this cannot bound: a read from a hung network filesystem (the kernel does not return).
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from gpushift.config.textfile import kind_of

#: How much :func:`read_bounded` reads by default (a ``config.json`` is a few KiB).
DEFAULT_LIMIT_BYTES = 4 * 1024 * 1024


class Skipped(OSError):
    """A path that was not read, and why (``reason``): not a regular file, or too large."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(reason)
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


def not_regular(mode: int) -> str | None:
    """The skip reason for a mode that is not a regular file; None for a regular file."""
    return None if stat.S_ISREG(mode) else f"not a regular file ({kind_of(mode)})"


def open_regular(path: str) -> BinaryIO:
    """``path`` opened for reading (binary, buffered) — only when it is a regular file.

    Raises:
        Skipped: it is a FIFO, a device, a socket, a directory... (never opened as such).
        OSError: it does not exist, or may not be read (``FileNotFoundError``, ``PermissionError``).
    """
    where = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        reason = not_regular(os.fstat(where).st_mode)
        if reason is not None:
            raise Skipped(path, reason)
        fd = os.open(f"/proc/self/fd/{where}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    finally:
        os.close(where)
    try:
        reason = not_regular(os.fstat(fd).st_mode)
        if reason is not None:  # cannot happen for the same inode; checked on the open descriptor anyway
            raise Skipped(path, reason)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str, limit: int = DEFAULT_LIMIT_BYTES) -> bytes:
    """The whole content of regular file ``path``, when it has at most ``limit`` bytes.

    Raises:
        Skipped: not a regular file, or larger than ``limit`` (nothing beyond ``limit + 1`` bytes
            is read, whatever the file claims its size is).
        OSError: it does not exist or may not be read.
    """
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise Skipped(path, f"larger than {limit} bytes: not read")
    return data

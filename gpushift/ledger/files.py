"""The files the ledger keeps beside the database: private modes, the group, atomic replacement.

The database, its WAL files, the head file and the spool files are owner rw, group r (0640, whatever
the umask); a file replaced while gpushift runs (the head, a spool record) is written to a temporary
name, fsynced and renamed, so that after a crash it is the old one or the new one.
"""

from __future__ import annotations

import contextlib
import os

FILE_MODE = 0o640
DIR_MODE = 0o750


def apply_group(fd_or_path: int | str, group: str | None) -> None:
    """Give the file to ``group`` when that group exists (no group on a dev box: leave it)."""
    if not group:
        return
    try:
        import grp

        gid = grp.getgrnam(group).gr_gid
    except (KeyError, ImportError):
        return
    with contextlib.suppress(OSError):  # not a member and not root: the mode still protects it
        if isinstance(fd_or_path, int):
            os.fchown(fd_or_path, -1, gid)
        else:
            os.chown(fd_or_path, -1, gid)


def create_private_file(path: str, group: str | None) -> None:
    """Create ``path`` empty with mode 0640 (whatever the umask) unless it exists."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, FILE_MODE)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have taken bits away
        apply_group(fd, group)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Make a rename or an unlink in ``path`` durable (best effort)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_file_atomic(path: str, data: bytes, group: str | None) -> None:
    """tmp + fsync + rename + fsync(dir): after a crash the file is the old or the new one."""
    d = os.path.dirname(path) or "."
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        apply_group(fd, group)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(d)

"""The files the ledger keeps beside the database: private modes, the group, atomic replacement.

The database, its WAL files, the head file and the spool files are owner rw, group r (0640, whatever
the umask); a file replaced while gpushift runs (the head, a spool record) is written to a temporary
name, fsynced and renamed (:func:`gpushift.host.files.write_atomic`), so that after a crash it is the
old one or the new one.
"""

from __future__ import annotations

import os

from gpushift.host.files import apply_group, write_atomic
from gpushift.host.files import fsync_dir as fsync_dir

FILE_MODE = 0o640
DIR_MODE = 0o750


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


def write_file_atomic(path: str, data: bytes, group: str | None) -> None:
    """tmp + fsync + rename + fsync(dir), mode 0640 and ``group``: after a crash the file is the old
    or the new one.  The directory must exist."""
    write_atomic(path, data, durable=True, mode=FILE_MODE, group=group, make_dir=False)

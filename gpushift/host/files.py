"""Replacing a small file atomically — the one way gpushift writes a file that a reader must never see
half-written: the ledger's head and spool files, the switch in flight (``run.json``), the manual
override, the webhook queue and node_exporter's textfile.

:func:`write_atomic` writes the whole content to a temporary file beside the target (``.NAME.*.tmp``:
a dot file, not ``*.prom``, so node_exporter skips it), then renames it over the target, so that a
reader — or the daemon after its own death — finds the old content or the new one, never a part.
What differs between callers is passed in:

* ``durable``: fsync the file before the rename and the directory after it, so that the rename
  survives a power loss too (the ledger's files, the override, the webhook queue).  The run store
  does without on purpose (``gpushift/switch/runstore.py`` says why: ~50 ms of every switch), and so
  does the textfile, which is rewritten every few seconds.
* ``mode``: the file's mode, whatever the umask (the ledger's 0640, the textfile's world-readable
  0644: node_exporter runs as its own user); None: what ``open()`` gives (0666 less the umask).
* ``group``: the group the file is given when that group exists (the ledger's).
* ``make_dir``: make the directory (mode 0750) when it is missing.
"""

from __future__ import annotations

import contextlib
import os

#: The mode of a directory :func:`write_atomic` makes.
DIR_MODE = 0o750


def write_atomic(
    path: str,
    data: bytes,
    *,
    durable: bool = True,
    mode: int | None = None,
    group: str | None = None,
    make_dir: bool = True,
) -> None:
    """Replace ``path`` with ``data``: a temporary file beside it, renamed over it (see the module).

    Raises:
        OSError: the directory is missing (without ``make_dir``), full or read-only; the temporary
            file is removed and ``path`` is left as it was.
    """
    d = os.path.dirname(path) or "."
    if make_dir:
        os.makedirs(d, mode=DIR_MODE, exist_ok=True)
    # A name of its own per call (two threads may replace the same file), never an existing file.
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o666 if mode is None else mode)
    try:
        try:
            if mode is not None:
                os.fchmod(fd, mode)  # the umask may have taken bits away
            apply_group(fd, group)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(d)


def fsync_dir(path: str) -> None:
    """Make a rename or an unlink in directory ``path`` durable (best effort)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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

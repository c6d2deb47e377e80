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

The code is :func:`gpushift.config.textfile.open_regular` and its neighbours: the config's reader
(``config.read``, the schedule) opens its files the same way, and the config sits below the host in
the layers (pyproject.toml), so the one opener lives there; this module is its name for the host's
readers (launch info, the override store, the doctor, the pre-warmer).
"""

from __future__ import annotations

from gpushift.config.textfile import DEFAULT_LIMIT_BYTES as DEFAULT_LIMIT_BYTES
from gpushift.config.textfile import Skipped as Skipped
from gpushift.config.textfile import not_regular as not_regular
from gpushift.config.textfile import open_regular as open_regular
from gpushift.config.textfile import read_bounded as read_bounded

"""Pre-warm a backend's model files — read them into the page cache before its boundary.

The daemon never reads the files itself: a separate reader process does (``python -m
gpushift.prewarm.reader read ...``), in the idle I/O class (``ioprio_set``, class 3: it gets the
disk only when nobody else wants it) and under a read-rate cap, so the backend that still serves
keeps its disk and the daemon's threads never block on I/O.  It opens only regular files (checked
on the open descriptor, opened non-blocking: a FIFO or a device is skipped, never waited on), and
reports per file how much was already cached (``mincore``) and how long the rest took, one JSON
line each.  :class:`PrewarmJob` starts it and can abandon it (SIGTERM, then SIGKILL, by PID).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import mmap
import os
import platform
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from gpushift.config.textfile import kind_of
from gpushift.host import safefile
from gpushift.prewarm.plan import FileInfo

CHUNK = 8 * 1024 * 1024
PAGE = mmap.PAGESIZE
#: ioprio_set(2) syscall numbers (the kernel's unistd tables) and the idle class.
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}
_IOPRIO_CLASS_IDLE = 3
_IOPRIO_WHO_PROCESS = 1


def walk(path: str) -> list[FileInfo]:
    """The regular files at ``path`` (a file, or every file under a directory, symlinks followed:
    a Hugging Face snapshot is links into its blobs), and what is skipped with why."""
    try:
        st = os.stat(path)
    except OSError as e:
        return [FileInfo(path, skipped=f"cannot read: {e.strerror or e}")]
    if stat.S_ISREG(st.st_mode):
        return [FileInfo(path, st.st_size)]
    if not stat.S_ISDIR(st.st_mode):
        return [FileInfo(path, skipped=kind_of(st.st_mode))]
    out: list[FileInfo] = []
    for root, _dirs, names in os.walk(path, followlinks=True):
        for name in sorted(names):
            out.extend(walk(os.path.join(root, name)))
    return out


def mem_available(meminfo: str = "/proc/meminfo") -> int:
    """``MemAvailable`` in bytes (0 when it cannot be read: then nothing is pre-warmed)."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _libc() -> Any:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    )
    libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    return libc


def resident_bytes(fd: int, size: int) -> int:
    """How many bytes of the open file are in the page cache now (``mincore``, as fincore shows)."""
    if size <= 0:
        return 0
    libc = _libc()
    addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        return 0
    try:
        pages = (size + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * pages)()
        if libc.mincore(addr, size, vec) != 0:
            return 0
        return min(size, sum(v & 1 for v in vec) * PAGE)
    finally:
        libc.munmap(addr, size)


def idle_io_class() -> bool:
    """Put this process in the idle I/O class; False where the syscall is unknown or refused."""
    nr = _IOPRIO_SET.get(platform.machine())
    if nr is None:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.syscall(nr, _IOPRIO_WHO_PROCESS, 0, _IOPRIO_CLASS_IDLE << 13)) == 0


def read_file(path: str, rate_bytes_s: float) -> dict[str, Any]:
    """Read one file through the page cache under the rate cap; only a regular file is read."""
    t0 = time.monotonic()
    try:
        # safefile: the type is checked before anything is opened (a device's driver never runs)
        f = safefile.open_regular(path)
    except safefile.Skipped as e:
        return {"path": path, "skipped": e.reason}
    except OSError as e:
        return {"path": path, "skipped": f"cannot open: {e.strerror or e}"}
    with f:
        fd = f.fileno()
        st = os.fstat(fd)
        cached = resident_bytes(fd, st.st_size)
        done = 0
        while True:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                break
            done += len(chunk)
            ahead = done / rate_bytes_s - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        return {
            "path": path,
            "bytes": done,
            "cached_before": cached,
            "seconds": round(time.monotonic() - t0, 3),
        }


def main(argv: Sequence[str] | None = None) -> int:
    """The reader process: ``read --rate BYTES_PER_S PATH...``; one JSON line per file, then a total."""
    p = argparse.ArgumentParser(prog="python -m gpushift.prewarm.reader")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("read", help="read files into the page cache (idle I/O class, rate-capped)")
    r.add_argument("--rate", type=float, required=True, help="bytes per second at most")
    r.add_argument("paths", nargs="+")
    args = p.parse_args(argv)
    idle = idle_io_class()
    t0 = time.monotonic()
    total = {"bytes": 0, "cached_before": 0, "files": 0, "skipped": 0, "idle_io_class": idle}
    for path in args.paths:
        res = read_file(path, max(1.0, args.rate))
        print(json.dumps(res), flush=True)
        if "skipped" in res:
            total["skipped"] += 1
        else:
            total["files"] += 1
            total["bytes"] += res["bytes"]
            total["cached_before"] += res["cached_before"]
    print(json.dumps({"total": {**total, "seconds": round(time.monotonic() - t0, 3)}}), flush=True)
    return 0


class PrewarmJob:
    """A running reader process for one backend's files (start, wait for its result, abandon)."""

    def __init__(self, backend: str, paths: Sequence[str], rate_bytes_s: float) -> None:
        self.backend = backend
        self.paths = list(paths)
        self.rate_bytes_s = rate_bytes_s
        self.files: list[dict[str, Any]] = []
        self.total: dict[str, Any] | None = None
        self.abandoned = False
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        cmd = [
            sys.executable,
            "-m",
            "gpushift.prewarm.reader",
            "read",
            "--rate",
            str(self.rate_bytes_s),
            *self.paths,
        ]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                      text=True, start_new_session=True)  # fmt: skip
        self._reader = threading.Thread(target=self._collect, name=f"prewarm-{self.backend}", daemon=True)
        self._reader.start()

    def _collect(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if "total" in item:
                self.total = item["total"]
            else:
                self.files.append(item)
        self._proc.wait()

    def wait(self, timeout_s: float | None = None) -> bool:
        """True once the reader has finished (or been abandoned)."""
        if self._reader is not None:
            self._reader.join(timeout_s)
            return not self._reader.is_alive()
        return True

    @property
    def pid(self) -> int | None:
        """The reader process's PID (None before :meth:`start`)."""
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def abandon(self) -> None:
        """The boundary no longer switches to this backend: end the reader (by PID)."""
        self.abandoned = True
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def summary(self) -> dict[str, Any]:
        """What the ledger row records (``extra.prewarm``)."""
        out: dict[str, Any] = {"backend": self.backend, "paths": self.paths, "abandoned": self.abandoned}
        if self.total is not None:
            out.update(self.total)
        elif self.running():
            out["state"] = "still reading"
        out["per_file"] = self.files  # one dict per path (bytes, cached_before, seconds, or skipped)
        return out


if __name__ == "__main__":
    sys.exit(main())

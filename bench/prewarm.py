"""Benchmark: start to healthy of a backend that reads its whole model file before it answers, with the
file cold (evicted from the page cache) against pre-warmed by gpushift's reader.

The backend is the stand-in (``tests/support/standin.py --model FILE --load-model``: /health answers
503 until every byte of the file was read, as a real server loads its weights); it is started as a
plain process here, since what is measured is the page cache, not systemd.  Each round runs both
ways, in alternating order:

* cold (the baseline): ``posix_fadvise(POSIX_FADV_DONTNEED)`` on the file after an ``fsync``, then
  the resident share is printed (``mincore``, as ``fincore`` shows it) and the backend started;
* pre-warmed: evicted the same way, then read by the real pre-warm reader (``PrewarmJob``: a separate
  process, idle I/O class, ``--rate-mib-s`` as ``[daemon] prewarm_rate_mib_s``), then started.

Time to healthy: from ``Popen`` to the first 200 of ``GET /health`` (polled every 10 ms).  The file
lives under ``--dir`` (default ``/var/tmp``, a disk: on a tmpfs nothing could be evicted).  On a
virtual machine the "cold" read may still come from the hypervisor's own cache: the read rate of
the cold runs is printed so the figure can be judged.

    .venv/bin/python bench/prewarm.py [--size-mib 1024] [--runs 5] [--no-write]
    .venv/bin/python bench/prewarm.py --smoke        # 64 MiB, one round, nothing written
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import benchdoc

sys.path.insert(0, str(benchdoc.ROOT))
from gpushift.prewarm.reader import PrewarmJob, resident_bytes  # noqa: E402

MIB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_model(path: Path, size_mib: int) -> None:
    """A file of random bytes (incompressible), written once and kept between runs of the script."""
    if path.exists() and path.stat().st_size == size_mib * MIB:
        return
    with open(path, "wb") as f:
        for _ in range(size_mib):
            f.write(os.urandom(MIB))
        f.flush()
        os.fsync(f.fileno())


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # only clean pages can be dropped
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_share(path: Path) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return resident_bytes(fd, size) / size if size else 1.0
    finally:
        os.close(fd)


def start_to_healthy(model: Path, timeout_s: float = 600.0) -> float:
    port = free_port()
    cmd = [sys.executable, "-m", "tests.support.standin", "--port", str(port), "--model", str(model),
           "--load-model"]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=benchdoc.ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.monotonic() - t0 < timeout_s:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.01)
        raise RuntimeError(f"the stand-in was not healthy within {timeout_s:g} s")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def prewarm(model: Path, rate_mib_s: float) -> tuple[float, dict[str, object]]:
    job = PrewarmJob("bench", [str(model)], rate_mib_s * MIB)
    t0 = time.monotonic()
    job.start()
    try:
        if not job.wait(600):
            raise RuntimeError("the pre-warm reader did not finish within 600 s")
    finally:
        job.abandon()
    return time.monotonic() - t0, job.summary()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rate-mib-s", type=float, default=512.0, help="the reader's cap (the daemon's default)")
    p.add_argument("--dir", default="/var/tmp")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args()
    if a.smoke:
        a.size_mib, a.runs, a.warmup, a.no_write = 64, 1, 0, True
    model = Path(a.dir) / f"gpushift-bench-model-{a.size_mib}mib.bin"
    make_model(model, a.size_mib)

    cold: list[float] = []
    warm: list[float] = []
    reads: list[float] = []
    shares_cold: list[float] = []
    shares_warm: list[float] = []
    cached_before: list[float] = []
    try:
        for i in range(a.warmup + a.runs):
            measured = i >= a.warmup
            for way in ("cold", "warm") if i % 2 == 0 else ("warm", "cold"):
                evict(model)
                if way == "warm":
                    took, summary = prewarm(model, a.rate_mib_s)
                    share = resident_share(model)
                    if measured:
                        reads.append(took)
                        shares_warm.append(share)
                        cached_before.append(float(summary.get("cached_before", 0)) / (a.size_mib * MIB))
                else:
                    share = resident_share(model)
                    if measured:
                        shares_cold.append(share)
                t = start_to_healthy(model)
                print(f"round {i + 1}{'' if measured else ' (warm-up)'} {way}: resident {share:.1%} before start, "
                      f"healthy after {t:.3f} s", flush=True)  # fmt: skip
                if measured:
                    (cold if way == "cold" else warm).append(t)
    finally:
        if a.smoke:
            model.unlink(missing_ok=True)

    mc, mw, mr = benchdoc.median(cold), benchdoc.median(warm), benchdoc.median(reads)
    size = a.size_mib * MIB
    lines = [
        "## Pre-warm: start to healthy, cold against pre-warmed",
        "",
        f"Result: **{mw:.3f} s** pre-warmed against **{mc:.3f} s** cold: **{mw / mc:.2f}×** "
        f"({mc - mw:+.3f} s saved at the boundary, spent {mr:.1f} s before it by the reader).",
        "",
        "| Way | Median start → healthy | Range | ÷ cold | Resident before start (median) |",
        "|---|---|---|---|---|",
        f"| cold (baseline: evicted) | **{mc:.3f} s** | {benchdoc.spread(cold)} | 1.00× | "
        f"{benchdoc.median(shares_cold):.1%} |",
        f"| pre-warmed by gpushift's reader | **{mw:.3f} s** | {benchdoc.spread(warm)} | {mw / mc:.2f}× | "
        f"{benchdoc.median(shares_warm):.1%} |",
        "",
        f"- The reader (`PrewarmJob`, idle I/O class, cap {a.rate_mib_s:g} MiB/s) took **{mr:.2f} s** for "
        f"{a.size_mib} MiB (median; {size / MIB / mr:.0f} MiB/s); resident when it began: "
        f"{benchdoc.median(cached_before):.1%}. With the default `prewarm_lead_s = 120` that is "
        f"{'within' if mr < 120 else 'beyond'} the lead.",
        f"- Cold: {size / MIB / mc:.0f} MiB/s (the file's size ÷ the cold start → healthy, interpreter start "
        "included): what this machine's disk gives a process once the page cache was dropped; a virtual "
        "disk may still be served from the hypervisor's cache, which makes the cold figure optimistic.",
        f"- Command: `.venv/bin/python bench/prewarm.py --size-mib {a.size_mib} --runs {a.runs}` "
        f"({a.runs} round(s) after {a.warmup} warm-up round(s), both ways each round in alternating order).",
        "- Backend: `tests/support/standin.py --model FILE --load-model` started as a process (no systemd: "
        f"the page cache is what differs), /health polled every 10 ms; the file is random bytes in `{a.dir}`.",
        f"- Machine: {benchdoc.machine(f'load average at the end {benchdoc.load_average()}')}.",
        f"- Measured {benchdoc.stamp()}.",
    ]
    text = "\n".join(lines)
    print(text)
    if not a.no_write:
        benchdoc.write_section("prewarm", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The real pre-warm reader process (gpushift/prewarm/reader.py: PrewarmJob): it reads whole
files through the page cache and reports them, and abandoning it ends the process it started."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpushift.prewarm.reader import PrewarmJob


def test_the_reader_reads_every_byte_and_reports_each_file(tmp_path: Path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "b.safetensors"
    a.write_bytes(os.urandom(3 * 1024 * 1024))
    b.write_bytes(os.urandom(12345))
    job = PrewarmJob("night", [str(a), str(b)], rate_bytes_s=1e9)
    job.start()
    try:
        assert job.wait(60), "the reader did not finish within 60 s"
        s = job.summary()
    finally:
        job.abandon()
    assert s["files"] == 2 and s["bytes"] == 3 * 1024 * 1024 + 12345 and s["skipped"] == 0
    assert s["abandoned"] is False and 0 <= s["cached_before"] <= s["bytes"]
    assert [(f["path"], f["bytes"]) for f in s["per_file"]] == [(str(a), 3 * 1024 * 1024), (str(b), 12345)]


def test_abandoning_a_reader_ends_its_process(tmp_path: Path) -> None:
    big = tmp_path / "big.gguf"
    big.write_bytes(b"\0" * (16 * 1024 * 1024))
    job = PrewarmJob("night", [str(big)], rate_bytes_s=1024 * 1024)  # 16 s at 1 MiB/s
    job.start()
    try:
        time.sleep(0.5)
        assert job.running() and job.pid is not None
        job.abandon()
        assert not job.running()
        assert job.wait(10)
        s = job.summary()
        assert s["abandoned"] is True and "bytes" not in s  # never finished: no total
    finally:
        job.abandon()

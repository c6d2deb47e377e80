"""What every benchmark under bench/ reports the same way: medians, the machine, the commit, and its
own section of docs/benchmarks.md (between ``<!-- bench:NAME:begin -->`` / ``end`` markers, the
other sections untouched).

Standard library only: bench/gate_latency.py imports it on a GPU host without the virtualenv.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"


def bytecode_cached(env: dict[str, str], cache_dir: Path) -> dict[str, str]:
    """``env`` for a command measured as an installed package runs: its byte-code compiled once and
    reused (a checkout run with ``PYTHONDONTWRITEBYTECODE=1`` would recompile every module at every
    start), cached under ``cache_dir`` so that the checkout is not touched."""
    out = dict(env, PYTHONPYCACHEPREFIX=str(cache_dir))
    out.pop("PYTHONDONTWRITEBYTECODE", None)
    return out


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def spread(xs: Sequence[float]) -> str:
    """``min 1.02 s, max 1.31 s (n=5)`` for a table's notes."""
    if not xs:
        return "no samples"
    return f"min {min(xs):.3f} s, max {max(xs):.3f} s (n={len(xs)})"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def machine(*extra: str) -> str:
    """One line naming the machine: host, CPU, cores, kernel, Python, and whatever ``extra`` adds."""
    parts = [
        f"{platform.node()}: {cpu_model()}, {os.cpu_count()} CPUs, Linux {platform.release()}",
        f"Python {platform.python_version()}",
        *extra,
    ]
    return ", ".join(parts)


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10
    ).stdout.strip()


def commit() -> str:
    """The checkout measured: ``abc1234``, or ``abc1234+changes`` when tracked files other than
    docs/benchmarks.md (which the benchmarks write themselves) differ from it."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/benchmarks.md")
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    if not head:
        return "unknown (not a git checkout)"
    return f"{head}+changes" if dirty else head


def stamp() -> str:
    """When, and of which code: ``2026-12-01 05:40 UTC, commit abc1234``."""
    return f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, commit {commit()}"


def write_section(name: str, section: str, doc: Path = DOC) -> None:
    """Replace the text between this benchmark's markers (append the block when it has none)."""
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    block = f"{begin}\n{section.rstrip()}\n{end}"
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)

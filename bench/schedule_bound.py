"""Benchmark: the largest schedule gpushift accepts (1,000 entries and calendar exceptions, issue 20).

For a few schedules at the bound — a mix (daily entries, rare ones, exceptions), entries that fire
once in decades (a 29 February that is a Sunday), and entries all shadowed by the last line — it
measures, median of several runs, in this process:

* the parse time (``load_schedule``: read, check, index);
* the first ``next boundary`` and ``in effect`` after the load (every entry's calendar searched once),
  then the same asked again a second later (what the daemon asks every second);
* the first ``next change`` (what ``status`` calls the next switch);

and the wall time of ``gpushift schedule --next 10`` as a subprocess (with ``python -c 'import
gpushift'`` beside it as the baseline of this machine).  Prints a table; writes nothing.

    .venv/bin/python bench/schedule_bound.py [--runs 7]
    .venv/bin/python bench/schedule_bound.py --smoke     # 2 runs
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

from gpushift.schedule import load_schedule
from gpushift.schedule.parse import MAX_ENTRIES

UTC = timezone.utc
NOW = datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC)


def mixed() -> str:
    lines = ["TZ=Europe/Berlin"]
    for i in range(MAX_ENTRIES - 100):
        target = "vllm" if i % 2 else "llama"
        if i % 3 == 0:
            lines.append(f"{i % 60} {(i // 60) % 24} 29 2 */7 {target}")
        else:
            lines.append(f"{i % 60} {(i * 7) % 24} * * {i % 7} {target}")
    first = date(2027, 1, 1)
    for k in range(100):
        d = first + timedelta(days=3 * k)
        lines.append(f"except {d} .. {d} {'off' if k % 2 else 'llama'} day-{k}")
    return "\n".join(lines) + "\n"


def rare() -> str:
    lines = ["TZ=America/New_York"]
    lines += [
        f"{i % 60} {(i // 60) % 24} 29 2 */7 {'vllm' if i % 2 else 'llama'}" for i in range(MAX_ENTRIES)
    ]
    return "\n".join(lines) + "\n"


def shadowed() -> str:
    lines = ["TZ=UTC"]
    lines += [f"{i % 60} {(i // 60) % 24},{(i // 60 + 12) % 24} * * * vllm" for i in range(MAX_ENTRIES - 1)]
    return "\n".join([*lines, "* * * * * llama"]) + "\n"


SCHEDULES = {"mixed": mixed, "rare": rare, "shadowed": shadowed}


def ms(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def one_run(path: Path) -> dict[str, float]:
    t = time.perf_counter()
    s = load_schedule(str(path), backends={"vllm", "llama"})
    figures = {"parse": (time.perf_counter() - t) * 1000}
    figures["next boundary"] = ms(lambda: s.next_boundary(NOW))
    figures["in effect"] = ms(lambda: s.in_effect(NOW))
    figures["next change"] = ms(lambda: s.next_change(NOW))
    later = NOW + timedelta(seconds=1)
    figures["again 1 s later"] = ms(
        lambda: (s.in_effect(later), s.next_boundary(later), s.next_change(later))
    )
    return figures


def measure(path: Path, runs: int) -> dict[str, float]:
    rows: dict[str, list[float]] = {}
    for _ in range(runs):
        for k, v in one_run(path).items():
            rows.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in rows.items()}


def cli_wall(tmp: Path, sched: Path, runs: int) -> tuple[float, float]:
    cfg = tmp / "gpushift.toml"
    cfg.write_text(
        f'[daemon]\nschedule = "{sched}"\n'
        '[backends.vllm]\nunit = "gpushift-vllm.service"\nhealth_url = "http://127.0.0.1:8000/health"\n'
        '[backends.llama]\nunit = "gpushift-llama.service"\nhealth_url = "http://127.0.0.1:8080/health"\n'
    )
    env = {**os.environ, "GPUSHIFT_CONFIG": str(cfg)}
    cmd = [str(Path(sys.executable).with_name("gpushift")), "schedule", "--next", "10"]
    base = [sys.executable, "-c", "import gpushift"]
    walls, bases = [], []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        walls.append(time.perf_counter() - t)
        t = time.perf_counter()
        subprocess.run(base, env=env, check=True, capture_output=True)
        bases.append(time.perf_counter() - t)
    return statistics.median(walls), statistics.median(bases)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--smoke", action="store_true", help="2 runs")
    args = ap.parse_args()
    runs = 2 if args.smoke else args.runs
    cols = ["parse", "next boundary", "in effect", "next change", "again 1 s later"]
    print(f"schedules of {MAX_ENTRIES} entries and calendar exceptions, median of {runs} runs (ms)")
    print(f"{'schedule':<10}" + "".join(f"{c:>17}" for c in cols) + f"{'schedule --next 10':>21}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name, make in SCHEDULES.items():
            sched = tmp / f"{name}.schedule"
            sched.write_text(make())
            figures = measure(sched, runs)
            wall, base = cli_wall(tmp, sched, runs)
            print(
                f"{name:<10}"
                + "".join(f"{figures[c]:>17.1f}" for c in cols)
                + f"{wall * 1000:>13.0f} ms (import {base * 1000:.0f})"
            )


if __name__ == "__main__":
    main()

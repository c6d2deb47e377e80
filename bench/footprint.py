"""Benchmark: the idle daemon's footprint — resident memory and CPU time (goals: ≤ 60 MB RSS, ≤ 0.5 % of one
core), beside a bare Python interpreter measured over the same window.

The daemon runs in a private systemd user manager (the shipped gpushift.service, daemon defaults,
simulated GPUs, a schedule loaded, one of two stand-in backends serving).  Once it is idle and a
settle time has passed, the window starts: RSS is ``VmRSS`` of /proc/PID/status (read every second;
the median and the maximum are reported, and ``VmHWM``, the peak since the daemon started), CPU is
the change of ``utime + stime`` of /proc/PID/stat over the window, as a share of one core.  The
baseline is ``python -c 'import time; time.sleep(…)'`` started with the window (the floor of any
Python process).

Extra config lines (``--extra-config``, repeatable, appended at the end of the config) measure
another setup, e.g. with the metrics endpoint on::

    .venv/bin/python bench/footprint.py --section footprint_metrics \\
        --extra-config '[metrics]' --extra-config 'listen = "127.0.0.1:9464"'

    .venv/bin/python bench/footprint.py [--window 60] [--settle 10] [--no-write]
    .venv/bin/python bench/footprint.py --smoke       # a 3 s window, nothing written
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import benchdoc
from benchenv import BenchEnv, backends, running

GOAL_RSS_MB = 60.0
GOAL_CPU_PCT = 0.5
TICK = os.sysconf("SC_CLK_TCK")

#: A schedule with two boundaries a day (the keeper arms them; neither fires within a run, as a rule).
SCHEDULE = "# gpushift benchmark schedule\n0 8 * * * a\n0 20 * * * b\n"


def vm_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise SystemExit(f"/proc/{pid}/status has no {field}")


def cpu_ticks(pid: int) -> tuple[int, int]:
    """(utime + stime, cutime + cstime) of the process, in clock ticks."""
    data = Path(f"/proc/{pid}/stat").read_bytes()
    rest = data[data.rindex(b")") + 2 :].split()  # after the command name, which may hold spaces
    utime, stime, cutime, cstime = (int(x) for x in rest[11:15])
    return utime + stime, cutime + cstime


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def measure(pids: dict[str, int], window: float) -> dict[str, dict[str, float]]:
    start = {k: cpu_ticks(p) for k, p in pids.items()}
    rss: dict[str, list[int]] = {k: [] for k in pids}
    t0 = time.monotonic()
    while True:
        for k, p in pids.items():
            rss[k].append(vm_kb(p, "VmRSS"))
        left = t0 + window - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(1.0, left))
    elapsed = time.monotonic() - t0
    out: dict[str, dict[str, float]] = {}
    for k, p in pids.items():
        end = cpu_ticks(p)
        out[k] = {
            "rss_kb": benchdoc.median(rss[k]),
            "rss_max_kb": max(rss[k]),
            "hwm_kb": vm_kb(p, "VmHWM"),
            "cpu_pct": 100.0 * (end[0] - start[k][0]) / TICK / elapsed,
            "children_cpu_s": (end[1] - start[k][1]) / TICK,
            "threads": threads(p),
            "window_s": elapsed,
        }
    return out


def mb(kb: float) -> str:
    return f"{kb * 1024 / 1e6:.1f} MB ({kb / 1024:.1f} MiB)"


def section(args: argparse.Namespace, m: dict[str, dict[str, float]], title_extra: str) -> str:
    d, b = m["daemon"], m["python"]
    rss_mb = d["rss_kb"] * 1024 / 1e6
    ok_rss = "meets" if rss_mb <= GOAL_RSS_MB else "MISSES"
    ok_cpu = "meets" if d["cpu_pct"] <= GOAL_CPU_PCT else "MISSES"
    extra = " ".join(f"--extra-config '{line}'" for line in args.extra_config)
    section_opt = f" --section {args.section}" if args.section != "footprint" else ""
    config_note = (
        "the config's extra lines: " + "; ".join(f"`{line}`" for line in args.extra_config)
        if args.extra_config
        else "no extra config lines"
    )
    return f"""## The idle daemon's footprint{title_extra}

Goals: ≤ {GOAL_RSS_MB:.0f} MB resident, ≤ {GOAL_CPU_PCT} % of one core. Result: **{mb(d["rss_kb"])}** ({ok_rss} the goal),
**{d["cpu_pct"]:.2f} %** of one core ({ok_cpu} the goal).

| Process | RSS (median over the window) | RSS max | Peak since start (VmHWM) | CPU, share of one core | Threads |
|---|---|---|---|---|---|
| gpushift daemon | **{mb(d["rss_kb"])}** | {mb(d["rss_max_kb"])} | {mb(d["hwm_kb"])} | **{d["cpu_pct"]:.2f} %** | {d["threads"]:.0f} |
| `python -c 'import time; time.sleep(…)'` (baseline) | {mb(b["rss_kb"])} | {mb(b["rss_max_kb"])} | {mb(b["hwm_kb"])} | {b["cpu_pct"]:.2f} % | {b["threads"]:.0f} |
| daemon ÷ baseline | {d["rss_kb"] / b["rss_kb"]:.1f}× | | | | |

- Command: `.venv/bin/python bench/footprint.py --window {args.window:g} --settle {args.settle:g}{section_opt}{(" " + extra) if extra else ""}`
  (one window of {d["window_s"]:.1f} s after the daemon was idle and {args.settle:g} s more had passed; RSS from
  `/proc/PID/status` every second, CPU from `utime + stime` of `/proc/PID/stat`; processes the daemon ran and
  reaped in the window used {d["children_cpu_s"]:.2f} s of CPU, not counted above).
- Setup: a private systemd user manager and session bus, the shipped `units/gpushift.service` with the test
  drop-in, daemon defaults, simulated GPUs, two stand-in backends (one serving), a schedule of two
  entries a day loaded; {config_note}.
- Machine: {benchdoc.machine()}; load average at the end {benchdoc.load_average()}.
- Measured {benchdoc.stamp()}, {args.product}.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=60.0, help="seconds measured (default 60)")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds to wait once the daemon is idle")
    ap.add_argument(
        "--extra-config",
        action="append",
        default=[],
        metavar="LINE",
        help="a line appended to the config (repeatable), e.g. '[metrics]' then 'listen = \"127.0.0.1:9464\"'",
    )
    ap.add_argument("--section", default="footprint", help="the docs/benchmarks.md section to write")
    ap.add_argument("--title", default="", help="added to the section's title (e.g. ', metrics on')")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--smoke", action="store_true", help="a 3 s window, 1 s settle, nothing written")
    args = ap.parse_args()
    if args.smoke:
        args.window, args.settle, args.no_write = 3.0, 1.0, True

    def factory(sb: object, base: Path) -> BenchEnv:
        base.mkdir(parents=True, exist_ok=True)
        sched = base / "schedule"
        sched.write_text(SCHEDULE)
        return BenchEnv(sb, base, backends(0.0), extra_config=args.extra_config, schedule=str(sched))  # type: ignore[arg-type]

    with running(factory) as env:
        env.settle("a", "b")  # the schedule's backend comes up at start
        time.sleep(args.settle)
        env.settle("a", "b")
        pid = env.daemon_pid()
        args.product = env.product()
        sleeper = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({args.window + 30:g})"])
        try:
            time.sleep(0.5)  # its start-up is not part of the window
            m = measure({"daemon": pid, "python": sleeper.pid}, args.window)
        finally:
            sleeper.terminate()
            sleeper.wait(10)
        if env.daemon_pid() != pid:
            raise SystemExit(f"the daemon restarted during the window (pid {pid} → {env.daemon_pid()})")
    text = section(args, m, args.title)
    print(text)
    if not args.no_write:
        benchdoc.write_section(args.section, text)
        print(f"written to {benchdoc.DOC}")


if __name__ == "__main__":
    main()

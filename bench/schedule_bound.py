"""Benchmark: the largest schedule gpushift accepts (1,000 entries and calendar exceptions, issue 20).

For a few schedules at the bound — a mix (daily entries, rare ones, exceptions), entries that fire
once in decades (a 29 February that is a Sunday), and entries all shadowed by the last line — it
measures, median of several runs, in this process:

* the parse time (``load_schedule``: read, check, index);
* the first ``next boundary`` and ``in effect`` after the load (every entry's calendar searched once),
  then the same asked again a second later (what the daemon asks every second);
* the first ``next change`` (what ``status`` calls the next switch);

and the wall time of ``gpushift schedule --next 10`` as a subprocess (with ``python -c 'import
gpushift'`` beside it as the baseline of this machine).

Then the daemon's start with each of them (``--starts``, default 5, median): the shipped
gpushift.service in a private systemd user manager (bench/benchenv.py, two stand-in backends, both
stopped before every start), from ``systemctl start`` to its return (READY=1: the bus name is owned)
and to the first ``GetStatus`` answered (asked in a loop on a connection opened before; the loop runs
once recovery, the first decision and the status line are done), with no schedule as the baseline,
the schedules taken in turn in each round.  Prints both tables; writes nothing.

    .venv/bin/python bench/schedule_bound.py [--runs 7] [--starts 5] [--no-daemon]
    .venv/bin/python bench/schedule_bound.py --smoke     # 2 runs, 2 starts
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
from typing import Any

from gpushift.schedule import load_schedule
from gpushift.schedule.parse import MAX_ENTRIES

UTC = timezone.utc
NOW = datetime(2026, 12, 1, 12, 0, 30, tzinfo=UTC)


def mixed(x: str = "vllm", y: str = "llama") -> str:
    lines = ["TZ=Europe/Berlin"]
    for i in range(MAX_ENTRIES - 100):
        target = x if i % 2 else y
        if i % 3 == 0:
            lines.append(f"{i % 60} {(i // 60) % 24} 29 2 */7 {target}")
        else:
            lines.append(f"{i % 60} {(i * 7) % 24} * * {i % 7} {target}")
    first = date(2027, 1, 1)
    for k in range(100):
        d = first + timedelta(days=3 * k)
        lines.append(f"except {d} .. {d} {'off' if k % 2 else y} day-{k}")
    return "\n".join(lines) + "\n"


def rare(x: str = "vllm", y: str = "llama") -> str:
    lines = ["TZ=America/New_York"]
    lines += [f"{i % 60} {(i // 60) % 24} 29 2 */7 {x if i % 2 else y}" for i in range(MAX_ENTRIES)]
    return "\n".join(lines) + "\n"


def shadowed(x: str = "vllm", y: str = "llama") -> str:
    lines = ["TZ=UTC"]
    lines += [f"{i % 60} {(i // 60) % 24},{(i // 60 + 12) % 24} * * * {x}" for i in range(MAX_ENTRIES - 1)]
    return "\n".join([*lines, f"* * * * * {y}"]) + "\n"


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


def start_once(env: Any, conn: Any, call: Any) -> tuple[float, float]:
    """(``systemctl start`` returned, the first GetStatus answered), seconds from the start."""
    from jeepney.wrappers import DBusErrorResponse

    env.sb.systemctl("stop", "gpushift.service", *[b.unit for b in env.backends.values()], timeout_s=120)
    t0 = time.perf_counter()
    env.sb.systemctl("start", "gpushift.service", timeout_s=120)
    ready = time.perf_counter() - t0
    deadline = t0 + 120
    while True:
        try:
            conn.send_and_get_reply(call, timeout=60)
            return ready, time.perf_counter() - t0
        except DBusErrorResponse:  # not yet on the bus (never expected after READY=1)
            if time.perf_counter() > deadline:
                raise SystemExit("the daemon did not answer GetStatus within 120 s of its start") from None
            time.sleep(0.01)


def daemon_starts(tmp: Path, starts: int) -> dict[str, tuple[list[float], list[float]]]:
    """Every schedule's start times (``start_once``), no schedule first in each round."""
    from benchenv import BenchEnv, backends, running
    from jeepney import DBusAddress, new_method_call
    from jeepney.io.blocking import open_dbus_connection

    files = {"no schedule (baseline)": ""}
    for name, make in SCHEDULES.items():
        path = tmp / f"{name}-ab.schedule"
        path.write_text(make("a", "b"))
        files[name] = str(path)
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in files}
    with running(lambda sb, base: BenchEnv(sb, base, backends(0.0))) as env:
        os.chmod(tmp, 0o755)  # the daemon reads the schedules
        conn = open_dbus_connection(bus=env.sb.bus_address)
        addr = DBusAddress("/org/gpushift/Switcher1", "org.gpushift.Switcher1", "org.gpushift.Switcher1")
        call = new_method_call(addr, "GetStatus")
        try:
            for _ in range(starts):
                for name, path in files.items():
                    env.schedule = path
                    env.write_config()
                    ready, answered = start_once(env, conn, call)
                    times[name][0].append(ready)
                    times[name][1].append(answered)
        finally:
            conn.close()
    return times


def print_starts(times: dict[str, tuple[list[float], list[float]]], starts: int) -> None:
    base = statistics.median(times["no schedule (baseline)"][1])
    print(
        f"\ndaemon start, median of {starts} starts (s): systemctl start returned | first GetStatus answered"
    )
    for name, (ready, answered) in times.items():
        med = statistics.median(answered)
        print(
            f"{name:<24}{statistics.median(ready):>8.2f}{med:>10.2f}  (x{med / base:.2f}; "
            f"range {min(answered):.2f}-{max(answered):.2f})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--starts", type=int, default=5, help="daemon starts per schedule")
    ap.add_argument("--no-daemon", action="store_true", help="skip the daemon's start (no systemd needed)")
    ap.add_argument("--smoke", action="store_true", help="2 runs, 2 starts")
    args = ap.parse_args()
    runs = 2 if args.smoke else args.runs
    starts = 2 if args.smoke else args.starts
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
        if not args.no_daemon:
            print_starts(daemon_starts(tmp, starts), starts)


if __name__ == "__main__":
    main()

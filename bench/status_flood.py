"""Benchmark: a flood of pipelined ``GetStatus`` calls (issue 20, point 4) — calls answered per second,
the daemon's CPU per call, and the latency of a status asked from another connection meanwhile.

The daemon runs as deployed (the shipped gpushift.service, daemon defaults, simulated GPUs, one
stand-in backend serving) in a private systemd user manager whose bus has the system bus's limits
(``SYSTEM_BUS_LIMITS`` in tests/support/sandbox.py: 128 pending replies per connection).  A flooder
(tests/support/busflood.py, a process of its own) keeps 128 calls outstanding on each of N
connections for ``--seconds``; meanwhile a client with a connection of its own asks ``GetStatus``
every 0.2 s and times each answer.  The reference, in the same invocation and on the same daemon: the
same flood of ``org.freedesktop.DBus.Peer.Ping``, which GDBus answers itself, in C, on its own
thread — what the bus costs without gpushift's code.  ``--before DIR`` runs a second daemon from
another checkout (e.g. ``git worktree add /tmp/before fac402f``) in the same rounds, alternating.

    .venv/bin/python bench/status_flood.py [--rounds 3] [--seconds 15] [--before DIR] [--no-write]
    .venv/bin/python bench/status_flood.py --smoke     # one short round, nothing written
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import benchdoc
from benchenv import ROOT, BenchEnv, backends, running

from tests.support.sandbox import SYSTEM_BUS_LIMITS

WINDOW = SYSTEM_BUS_LIMITS["max_replies_per_connection"]
PROBE_EVERY_S = 0.2


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of a process so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Probe:
    """A status client on a connection of its own: ``GetStatus`` every 0.2 s, each answer timed."""

    def __init__(self, env: BenchEnv) -> None:
        from jeepney import DBusAddress, new_method_call
        from jeepney.io.blocking import open_dbus_connection

        self._conn = open_dbus_connection(bus=env.sb.bus_address, auth_timeout=60)
        self._call = new_method_call(
            DBusAddress("/org/gpushift/Switcher1", "org.gpushift.Switcher1", "org.gpushift.Switcher1"),
            "GetStatus",
        )
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            try:
                self._conn.send_and_get_reply(self._call, timeout=120)
                self.latencies.append(time.perf_counter() - t)
            except Exception as e:  # counted and shown, never fatal
                self.failures.append(repr(e)[:200])
            self._stop.wait(PROBE_EVERY_S)

    def start(self) -> Probe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(130)
        self._conn.close()


def one_flood(env: BenchEnv, connections: int, member: str, seconds: float) -> dict[str, Any]:
    """One flood of ``member`` on ``connections`` × 128 for ``seconds``, with the probe beside it."""
    pid = env.daemon_pid()
    lines: list[dict[str, Any]] = []
    probe = Probe(env)  # connected before the flood: a busy bus authenticates slowly
    cmd = [sys.executable, "-m", "tests.support.busflood", "--connections", str(connections),
           "--window", str(WINDOW), "--duration", str(seconds), "--member", member]  # fmt: skip
    flooder = subprocess.Popen(cmd, cwd=ROOT, env=env.sb.env, stdout=subprocess.PIPE, text=True)
    assert flooder.stdout is not None

    def read() -> None:
        for line in flooder.stdout:  # type: ignore[union-attr]
            lines.append(json.loads(line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while not lines and flooder.poll() is None:  # its connections are open: the flood begins
        time.sleep(0.01)
    cpu0, t0 = cpu_s(pid), time.monotonic()
    probe.start()
    try:
        flooder.wait(seconds + 120)
    finally:
        if flooder.poll() is None:
            flooder.kill()
            flooder.wait(10)
    cpu1, t1 = cpu_s(pid), time.monotonic()
    reader.join(10)
    probe.stop()
    done = lines[-1] if lines else {}
    answered = int(done.get("answered", 0))
    return {
        "answered_per_s": answered / (t1 - t0),
        "cpu_us_per_call": (cpu1 - cpu0) * 1e6 / answered if answered else float("nan"),
        "refused": int(done.get("refused", 0)),
        "probe_median_s": benchdoc.median(probe.latencies),
        "probe_worst_s": max(probe.latencies, default=float("nan")),
        "probes": len(probe.latencies),
        "probe_failures": probe.failures,
        "same_pid": env.daemon_pid() == pid,
    }


def measure_product(
    label: str, product: str | None, shapes: list[int], args: argparse.Namespace
) -> dict[tuple[str, int, str], dict[str, Any]]:
    """One round on a fresh daemon of ``product`` (a checkout's path; None: this one)."""
    if product:
        os.environ["GPUSHIFT_TEST_PRODUCT_PATH"] = product
    else:
        os.environ.pop("GPUSHIFT_TEST_PRODUCT_PATH", None)

    def factory(sb: Any, base: Path) -> BenchEnv:
        return BenchEnv(sb, base, backends(0.0)[:1])

    out: dict[tuple[str, int, str], dict[str, Any]] = {}
    with running(factory, bus_limits=SYSTEM_BUS_LIMITS) as env:
        env.cli("switch", "a", "--reason", "benchmark setup", check=True)
        env.settle("a")
        for n in shapes:
            for member in ("GetStatus", "Ping"):
                r = one_flood(env, n, member, args.seconds)
                out[(label, n, member)] = r
                print(f"  {label:>6} {n:>3} × {WINDOW} {member:<9} {r['answered_per_s']:7.0f} calls/s, "
                      f"daemon {r['cpu_us_per_call']:5.0f} µs CPU/call, probe median {r['probe_median_s']:.2f} s, "
                      f"worst {r['probe_worst_s']:.2f} s ({r['probes']}), same PID {r['same_pid']}", flush=True)  # fmt: skip
                time.sleep(2)  # the bus and the daemon settle
    return out


def table(
    runs: list[dict[tuple[str, int, str], dict[str, Any]]], labels: list[str], shapes: list[int]
) -> str:
    rows = [
        "| daemon | flood | calls answered/s | daemon CPU per call | status from another connection: median | worst | daemon restarted |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in labels:
        for n in shapes:
            for member in ("GetStatus", "Ping"):
                rs = [r[(label, n, member)] for r in runs if (label, n, member) in r]
                if not rs:
                    continue
                what = f"{n} × {WINDOW} `{member}`" + (
                    " (reference: GDBus answers in C)" if member == "Ping" else ""
                )
                med = benchdoc.median
                rows.append(
                    f"| {label} | {what} | {med([r['answered_per_s'] for r in rs]):.0f} | "
                    f"{med([r['cpu_us_per_call'] for r in rs]):.0f} µs | {med([r['probe_median_s'] for r in rs]):.2f} s | "
                    f"{max(r['probe_worst_s'] for r in rs):.2f} s | "
                    f"{'yes' if not all(r['same_pid'] for r in rs) else 'no'} |"
                )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds (each: every product, shape and call once)")
    ap.add_argument("--seconds", type=float, default=15.0, help="length of one flood")
    ap.add_argument(
        "--connections", type=int, nargs="+", default=[8, 200], help="flood shapes: connections × 128"
    )
    ap.add_argument("--before", help="a checkout of the code before (its gpushift/ is run as the daemon)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--smoke", action="store_true", help="one round of 4 s on 4 connections, nothing written")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.seconds, args.connections, args.no_write = 1, 4.0, [4], True
    products = [("after", None)] + ([("before", str(Path(args.before).resolve()))] if args.before else [])
    runs = []
    for k in range(args.rounds):
        print(f"round {k + 1} of {args.rounds}", flush=True)
        for label, product in products if k % 2 == 0 else list(reversed(products)):
            runs.append(measure_product(label, product, args.connections, args))
    merged: list[dict[tuple[str, int, str], dict[str, Any]]] = []
    for k in range(args.rounds):  # one dict per round, every product in it
        m: dict[tuple[str, int, str], dict[str, Any]] = {}
        for r in runs[k * len(products) : (k + 1) * len(products)]:
            m.update(r)
        merged.append(m)
    labels = [label for label, _ in products]
    failures = sum(len(r["probe_failures"]) for m in merged for r in m.values())
    text = f"""## A `GetStatus` flood: calls answered, and a status from another connection meanwhile

{table(merged, labels, args.connections)}

- Command: `.venv/bin/python bench/status_flood.py --rounds {args.rounds} --seconds {args.seconds:g}{" --before DIR" if args.before else ""}`
  (medians over the rounds; "worst" is the worst of all rounds; {failures} status calls failed).
  "after": this checkout; "before": `--before` (the code before the watchdog thread and the cheap GetStatus path).
- Setup: a private systemd user manager whose bus has the system bus's limits (128 pending replies per
  connection, 256 connections per user), the shipped unit with the test drop-in, one stand-in backend serving.
  The flooder keeps 128 calls outstanding on each connection for {args.seconds:g} s; the status client asks
  `GetStatus` every {PROBE_EVERY_S} s on a connection opened before the flood. CPU per call: the daemon's user
  and system time over the flood, divided by the calls answered.
- Machine: {benchdoc.machine()}; load average at the end {benchdoc.load_average()}.
- Measured {benchdoc.stamp()}.
"""
    print(text)
    if not args.no_write:
        benchdoc.write_section("status_flood", text)
        print(f"written to {benchdoc.DOC}")


if __name__ == "__main__":
    main()

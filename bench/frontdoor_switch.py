"""Benchmark: requests held by the front door through a switch — 1,000 at once, and a steady load.

Goals (issue 19, "Speed"): 1,000 requests held through a switch: all answered, the front door's RSS
≤ 100 MB; through a switch under a steady load of 16 clients: 0 failed requests, and each held
request's extra wait ≤ the switch's own time + 0.2 s.

The front door (bench/frontdoor_runner.py: gpushift's FrontDoor alone in its process) has two
backends, ``a`` and ``b`` (bench/frontdoor_upstream.py, one process, both always up), each with the
alias ``default`` that the clients ask for.  The switch is driven as the daemon drives it, through
the runner's control socket, which calls the core's public methods on its event loop: the view says
a switch to the other backend is in progress, ``close(old)``, wait until ``in_flight(old)`` is 0,
``--switch-seconds`` for the old backend's stop and the new one's start, the view says the new one is
active, ``release(new)``, the view says the switch is over.  The switch's own time runs from the
first of these steps to the end of ``release()``.

1,000 held: the switch begins, 1,000 connections send one request each, and they stay held for
``--hold-seconds``, while the front door's RSS (/proc/PID/status ``VmRSS``) is read every 0.1 s;
then the release, and every answer must be 200 from the new backend.  The baseline: the same 1,000
requests sent at once to the upstream directly, the time until the last is answered.

Steady load: 16 clients in a closed loop (bench/frontdoor_client.py) through ``--switches`` switches
(a → b, b → a, ...), ``--gap-seconds`` apart.  A request was held when it was still open as
``release()`` returned (one in flight on the old backend has ended by then: the drain waits for it);
its extra wait is its latency minus the median latency of the requests outside every switch (the
baseline of the same run).

    .venv/bin/python bench/frontdoor_switch.py [--held 1000] [--switches 6] [--no-write]
    .venv/bin/python bench/frontdoor_switch.py --smoke      # 100 held, 2 short switches, nothing written
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import benchdoc
import frontdoor_client as fc
import frontdoor_procs as fp

GOAL_RSS_MB = 100.0
GOAL_MARGIN_S = 0.2


async def view(
    fd: fp.Proc, active: str, switching: bool = False, target: str = "", phase: str = "idle"
) -> None:
    await fp.control(
        fd, "update", view={"active": active, "switching": switching, "target": target, "phase": phase}
    )


@dataclass
class Switch:
    old: str
    new: str
    t0: int = 0  # monotonic ns: the switch begins (the view says so)
    t1: int = 0  # release() returned
    in_flight_at_close: int = 0
    held: int = 0
    longest_s: float = 0.0

    @property
    def seconds(self) -> float:
        return (self.t1 - self.t0) / 1e9


async def switch(fd: fp.Proc, old: str, new: str, switch_s: float) -> Switch:
    """One switch old → new, as the daemon drives it (see the module's docstring)."""
    s = Switch(old, new, t0=time.monotonic_ns())
    await view(fd, old, True, new, "draining")
    s.in_flight_at_close = await fp.control(fd, "close", backend=old)
    deadline = time.monotonic() + 30
    while await fp.control(fd, "in_flight", backend=old) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    await view(fd, old, True, new, "stopping")
    await asyncio.sleep(switch_s)  # the old backend stops, the new one starts and warms up
    await view(fd, new, True, new, "warmup")
    s.held, s.longest_s = await fp.control(fd, "release", serving=new)
    s.t1 = time.monotonic_ns()
    await view(fd, new)
    return s


async def open_conns(port: int, n: int) -> list[fc.Conn]:
    """``n`` connections, opened 100 at a time (no SYN flood of the listen backlog)."""
    conns: list[fc.Conn] = []
    while len(conns) < n:
        batch = min(100, n - len(conns))
        conns += await asyncio.gather(*(fc.Conn.open("127.0.0.1", port) for _ in range(batch)))
    return conns


async def burst(port: int, conns: list[fc.Conn], model: str) -> list[tuple[int, fc.Response | BaseException]]:
    req = fc.chat(port, model)
    futs = [c.request(req) for c in conns]
    results = await asyncio.gather(*futs, return_exceptions=True)
    return [(time.monotonic_ns(), r) for r in results]


async def held_many(fd: fp.Proc, ups: dict[str, fp.Proc], n: int, hold_s: float) -> dict[str, Any]:
    """The switch a → b begins; ``n`` requests come and are held for ``hold_s``; the release."""
    pid = fd.pids[0]
    direct = await open_conns(ups["b"].port, n)  # the baseline: n requests at once, directly
    t0 = time.monotonic_ns()
    answers = await burst(ups["b"].port, direct, "bench-b")
    direct_s = (max(t for t, _r in answers) - t0) / 1e9
    for c in direct:
        c.close()
    rss_idle = fp.rss_kb(pid)
    conns = await open_conns(fd.port, n)
    rss = [rss_idle]
    await view(fd, "a", True, "b", "draining")
    in_flight = await fp.control(fd, "close", backend="a")
    requests = asyncio.create_task(burst(fd.port, conns, "default"))
    deadline = time.monotonic() + 60
    held_seen = 0
    while held_seen < n and time.monotonic() < deadline and not requests.done():
        rss.append(fp.rss_kb(pid))
        await asyncio.sleep(0.1)
        held_seen = (await fp.control(fd, "status")).get("held", 0)
    end = time.monotonic() + hold_s
    while time.monotonic() < end:
        rss.append(fp.rss_kb(pid))
        await asyncio.sleep(0.1)
    await view(fd, "b", True, "b", "warmup")
    t_release = time.monotonic_ns()
    held, longest = await fp.control(fd, "release", serving="b")
    await view(fd, "b")
    while not requests.done():
        rss.append(fp.rss_kb(pid))
        await asyncio.sleep(0.02)
    results = await requests
    rss.append(fp.rss_kb(pid))
    for c in conns:
        c.close()
    bad: dict[str, int] = {}
    ok = 0
    for _t, r in results:
        if isinstance(r, fc.Response) and r.status == 200 and r.headers.get(b"x-bench-backend") == b"b":
            ok += 1
            continue
        why = (
            f"HTTP {r.status} from {r.headers.get(b'x-bench-backend')!r}"
            if isinstance(r, fc.Response)
            else type(r).__name__
        )
        bad[why] = bad.get(why, 0) + 1
    return {
        "n": n,
        "ok": ok,
        "bad": bad,
        "in_flight_at_close": in_flight,
        "held_seen": held_seen,
        "held": held,
        "longest_s": longest,
        "rss_idle_kb": rss_idle,
        "rss_max_kb": max(rss),
        "hwm_kb": fp.rss_kb(pid, "VmHWM"),
        "release_to_last_s": (max(t for t, _r in results) - t_release) / 1e9,
        "direct_s": direct_s,
    }


@dataclass
class Record:
    start: int
    end: int
    ok: bool
    why: str = ""
    backend: bytes = b""


@dataclass
class Steady:
    records: list[Record] = field(default_factory=list)
    switches: list[Switch] = field(default_factory=list)


async def worker(port: int, stop: asyncio.Event, out: Steady) -> None:
    req = fc.chat(port, "default")
    conn: fc.Conn | None = None
    while not stop.is_set():
        t0 = time.monotonic_ns()
        try:
            if conn is None or conn.closed:
                conn = await fc.Conn.open("127.0.0.1", port)
            r = await conn.request(req)
        except (OSError, fc.ConnError) as e:
            out.records.append(Record(t0, time.monotonic_ns(), False, type(e).__name__))
            conn = None
            await asyncio.sleep(0.01)
            continue
        end = time.monotonic_ns()
        out.records.append(
            Record(t0, end, r.status == 200, f"HTTP {r.status}", r.headers.get(b"x-bench-backend", b""))
        )
    if conn is not None:
        conn.close()


async def steady(fd: fp.Proc, clients: int, switches: int, switch_s: float, gap_s: float) -> Steady:
    out = Steady()
    stop = asyncio.Event()
    workers = [asyncio.create_task(worker(fd.port, stop, out)) for _ in range(clients)]
    active = "a"
    for _ in range(switches):
        await asyncio.sleep(gap_s)
        new = "b" if active == "a" else "a"
        out.switches.append(await switch(fd, active, new, switch_s))
        active = new
    await asyncio.sleep(gap_s)
    stop.set()
    await asyncio.gather(*workers)
    return out


def analyse(st: Steady) -> dict[str, Any]:
    windows = [(s.t0, s.t1) for s in st.switches]

    def during(r: Record) -> Switch | None:
        """The switch whose release a request waited for: it was open when release() returned (a
        request in flight on the old backend had ended before: the drain waits for it)."""
        for s in st.switches:
            if r.start <= s.t1 < r.end:
                return s
        return None

    outside = [
        r.end - r.start
        for r in st.records
        if r.ok and not any(a <= r.end and r.start <= b for a, b in windows)
    ]
    normal = fc.quantile(outside, 0.5)
    per: list[dict[str, Any]] = []
    for s in st.switches:
        held = [r for r in st.records if during(r) is s]
        extra = [(r.end - r.start - normal) / 1e9 for r in held]
        wrong = [r for r in held if r.ok and r.backend != s.new.encode()]
        per.append(
            {
                "switch": f"{s.old} → {s.new}",
                "seconds": s.seconds,
                "held_client": len(held),
                "held_core": s.held,
                "longest_s": s.longest_s,
                "in_flight_at_close": s.in_flight_at_close,
                "max_extra_s": max(extra) if extra else 0.0,
                "margin_s": s.seconds + GOAL_MARGIN_S - (max(extra) if extra else 0.0),
                "wrong_backend": len(wrong),
            }
        )
    failed: dict[str, int] = {}
    for r in st.records:
        if not r.ok:
            failed[r.why] = failed.get(r.why, 0) + 1
    return {"normal_ms": normal / 1e6, "requests": len(st.records), "failed": failed, "per": per}


def section(args: argparse.Namespace, h: dict[str, Any], a: dict[str, Any]) -> str:
    rss_mb = h["rss_max_kb"] * 1024 / 1e6
    all_ok = h["ok"] == h["n"]
    n_failed = sum(a["failed"].values())
    worst = min(p["margin_s"] for p in a["per"]) if a["per"] else float("nan")
    lines = [
        "## The front door: requests held through a switch",
        "",
        f"Goals: {h['n']:,} requests held through a switch all answered, the front door's RSS ≤ {GOAL_RSS_MB:g} MB; "
        f"under a steady load of {args.clients} clients, 0 failed requests and each held request's extra wait ≤ the "
        f"switch's own time + {GOAL_MARGIN_S:g} s.  Result: **{h['ok']:,} of {h['n']:,}** answered by the new backend "
        f"({'meets' if all_ok else 'MISSES'} the goal), RSS at most **{rss_mb:.1f} MB** "
        f"({'meets' if rss_mb <= GOAL_RSS_MB else 'MISSES'}); **{n_failed} failed** of {a['requests']:,} requests "
        f"through {len(a['per'])} switches ({'meets' if n_failed == 0 else 'MISSES'}), a held request's extra wait "
        f"at most **{GOAL_MARGIN_S - worst:+.3f} s** over its switch's own time ({'meets' if worst >= 0 else 'MISSES'}).",
        "",
        f"{h['n']:,} held at once:",
        "",
        "| What | Figure |",
        "|---|---|",
        f"| answered 200 by the new backend | {h['ok']:,} of {h['n']:,}{'' if not h['bad'] else ' (' + ', '.join(f'{k}: {v}' for k, v in h['bad'].items()) + ')'} |",
        f"| held, as the front door's status said before the release / as release() said | {h['held_seen']:,} / {h['held']:,} |",
        f"| longest hold (release()) | {h['longest_s']:.2f} s |",
        f"| front door RSS idle, before | {h['rss_idle_kb'] / 1024:.1f} MiB ({h['rss_idle_kb'] * 1024 / 1e6:.1f} MB) |",
        f"| front door RSS at most, holding and forwarding | **{h['rss_max_kb'] / 1024:.1f} MiB ({rss_mb:.1f} MB)** |",
        f"| peak since start (VmHWM) | {h['hwm_kb'] / 1024:.1f} MiB |",
        f"| release to the last answer | {h['release_to_last_s']:.3f} s |",
        f"| baseline: the same {h['n']:,} requests at once to the upstream directly, to the last answer | {h['direct_s']:.3f} s |",
        "",
        f"Steady load of {args.clients} clients ({a['requests']:,} requests; latency outside the switches, median "
        f"{a['normal_ms']:.3f} ms; failed: {a['failed'] or 'none'}):",
        "",
        "| Switch | Its own time | Held (client's count / release()) | In flight at close | Longest extra wait | Longest extra wait − its own time (goal ≤ +0.2 s) | Answered by the old backend |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in a["per"]:
        lines.append(
            f"| {p['switch']} | {p['seconds']:.3f} s | {p['held_client']} / {p['held_core']} | {p['in_flight_at_close']} "
            f"| {p['max_extra_s']:.3f} s | {p['max_extra_s'] - p['seconds']:+.3f} s | {p['wrong_backend']} |"
        )
    med_margin = benchdoc.median([p["margin_s"] for p in a["per"]])
    lines += [
        "",
        f"- Command: `.venv/bin/python bench/frontdoor_switch.py --held {h['n']} --hold-seconds {args.hold_seconds:g} "
        f"--clients {args.clients} --switches {args.switches} --switch-seconds {args.switch_seconds:g} "
        f"--gap-seconds {args.gap_seconds:g}` (the median over the switches of the longest extra wait − the switch's own time: {GOAL_MARGIN_S - med_margin:+.3f} s).",
        "- The switch is simulated in the front door's own process (bench/frontdoor_runner.py's control socket "
        "calls `update`, `close`, `in_flight`, `release` as the daemon link would); both upstream backends stay "
        "up, and `--switch-seconds` stands for the old backend's stop and the new one's start.",
        f"- Machine: {benchdoc.machine(fp.cores())}; load average at the end {benchdoc.load_average()}.",
        f"- Measured {benchdoc.stamp()}.",
    ]
    return "\n".join(lines) + "\n"


async def run(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    with fp.upstream(("a", "b")) as ups, fp.frontdoor(ups, "a") as fd:
        warm = await fc.closed_loop(fd.port, fc.chat(fd.port, "default"), 16, 1.0)
        if warm.failed:
            raise fp.BenchError(f"the front door failed {warm.failed} warm-up requests: {warm.failures}")
        h = await held_many(fd, ups, args.held, args.hold_seconds)
        print(f"held: {h}", flush=True)
        st = await steady(fd, args.clients, args.switches, args.switch_seconds, args.gap_seconds)
    return h, analyse(st)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--held", type=int, default=1000, help="requests held at once (default 1000)")
    ap.add_argument("--hold-seconds", type=float, default=2.0, help="how long they stay held once all are in")
    ap.add_argument("--clients", type=int, default=16, help="clients of the steady load")
    ap.add_argument("--switches", type=int, default=6, help="switches under the steady load")
    ap.add_argument(
        "--switch-seconds", type=float, default=1.0, help="the simulated stop + start of a switch"
    )
    ap.add_argument("--gap-seconds", type=float, default=2.0, help="seconds of plain load between switches")
    ap.add_argument("--section", default="frontdoor_switch", help="the docs/benchmarks.md section to write")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--smoke", action="store_true", help="100 held, 2 short switches, nothing written")
    args = ap.parse_args()
    if args.smoke:
        args.held, args.hold_seconds, args.switches, args.switch_seconds, args.gap_seconds = (
            100,
            0.2,
            2,
            0.2,
            0.5,
        )
        args.no_write = True
    h, a = asyncio.run(run(args))
    text = section(args, h, a)
    print(text)
    if not args.no_write:
        benchdoc.write_section(args.section, text)
        print(f"written to {benchdoc.DOC}")


if __name__ == "__main__":
    main()

"""Benchmark: the front door's added latency per small request and its request rate, beside nginx in
front of the same upstream and the upstream reached directly, all measured in the same run.

Goals (issue 19, "Speed"): added latency over going direct at 1 and at 16 concurrent clients, median
≤ 1 ms and p99 ≤ 5 ms; at 64 concurrent clients at least 2,000 requests/s, and the ratio to nginx.

Three processes besides this one (the load generator, bench/frontdoor_client.py): the upstream
(bench/frontdoor_upstream.py, small non-streaming chat completions), nginx (Debian's package, its
own config: one worker, keep-alive to the upstream; bench/frontdoor_procs.py) and the front door
(bench/frontdoor_runner.py: gpushift's FrontDoor in its own process, a fixed view of the daemon).
Each client is one keep-alive connection sending ``POST /v1/chat/completions`` again as soon as its
answer is complete (a closed loop: at 16 clients a request also waits behind the 15 others, so the
added latency there is 16 × the proxy's time per request), and 16 clients paced at ``--paced``
requests/s each (the latency of a request that seldom waits behind another).  Every round measures each way in a rotating order; the figures
are medians over the rounds; "added" is a way's figure minus the direct one of the same round.  The
direct rate is the generator's own ceiling here: as long as it is well above a proxy's rate, the
generator is not what limits that proxy.

    .venv/bin/python bench/frontdoor_speed.py [--rounds 5] [--seconds 3] [--no-write]
    .venv/bin/python bench/frontdoor_speed.py --ways direct,nginx      # without the front door
    .venv/bin/python bench/frontdoor_speed.py --smoke                  # 1 short round, nothing written

nginx must be installed (``apt-get install -y nginx``); the benchmark never touches the system's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any

import benchdoc
import frontdoor_client as fc
import frontdoor_procs as fp

GOAL_ADDED_MEDIAN_MS = 1.0
GOAL_ADDED_P99_MS = 5.0
GOAL_RPS = 2000.0
DEFAULT_WAYS = "direct,nginx,frontdoor"
RATE = "rate"  # the load label of the rate measurement


def check_backend(name: bytes) -> Callable[[fc.Response], str | None]:
    def check(r: fc.Response) -> str | None:
        got = r.headers.get(b"x-bench-backend")
        return None if got == name else f"answered by {got!r}"

    return check


async def one(
    port: int, clients: int, seconds: float, pids: list[int], rate: float = 0.0
) -> dict[str, float]:
    """One run (closed loop, or paced at ``rate`` per client): latency quantiles (ms), rate, CPU of
    the proxy and of this generator (cores)."""
    me = [os.getpid()]
    c0, g0 = fp.cpu_s(pids) if pids else 0.0, fp.cpu_s(me)
    r = await fc.closed_loop(port, fc.chat(port, "bench-a"), clients, seconds, check_backend(b"a"), rate)
    c1, g1 = fp.cpu_s(pids) if pids else 0.0, fp.cpu_s(me)
    if r.failed:
        raise fp.BenchError(f"{r.failed} requests failed on port {port}: {r.failures}")
    return {
        "p50": fc.quantile(r.latencies_ns, 0.5) / 1e6,
        "p99": fc.quantile(r.latencies_ns, 0.99) / 1e6,
        "rps": r.rate,
        "n": r.ok,
        "cpu": (c1 - c0) / r.elapsed_s,
        "cpu_ms": 1000 * (c1 - c0) / r.ok if r.ok else float("nan"),
        "gen_cpu": (g1 - g0) / r.elapsed_s,
    }


def loads(args: argparse.Namespace) -> list[tuple[str, int, float]]:
    """(label, clients, rate per client; 0 = closed loop) of every load a round runs."""
    return [
        ("1", 1, 0.0),
        ("16", 16, 0.0),
        (f"16, {args.paced:g}/s each", 16, args.paced),
        (RATE, args.clients, 0.0),
    ]


async def measure(
    args: argparse.Namespace, ways: dict[str, tuple[int, list[int]]]
) -> dict[Any, list[dict[str, float]]]:
    """``{(load label, way): [run per round]}`` for every load of :func:`loads`."""
    for port, pids in ways.values():  # warm-up: connections, caches, the proxies' pools
        await one(port, 16, args.warmup, pids)
    out: dict[Any, list[dict[str, float]]] = {}
    names = list(ways)
    for rnd in range(args.rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for label, clients, rate in loads(args):
            for way in order:
                port, pids = ways[way]
                out.setdefault((label, way), []).append(await one(port, clients, args.seconds, pids, rate))
    return out


def med(runs: list[dict[str, float]], key: str) -> float:
    return benchdoc.median([r[key] for r in runs])


def added(m: dict[Any, list[dict[str, float]]], load: str, way: str, key: str) -> float:
    """The median over rounds of (way − direct) in each round."""
    base = m.get((load, "direct"))
    if base is None:
        return float("nan")
    return benchdoc.median([r[key] - b[key] for r, b in zip(m[(load, way)], base, strict=True)])


def ratio(m: dict[Any, list[dict[str, float]]], load: str, way: str, ref: str) -> float:
    base = m.get((load, ref))
    if base is None:
        return float("nan")
    return benchdoc.median([r["rps"] / b["rps"] for r, b in zip(m[(load, way)], base, strict=True)])


def verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


def summary(args: argparse.Namespace, m: dict[Any, list[dict[str, float]]], names: list[str]) -> list[str]:
    paced = loads(args)[2][0]
    fd = "front door"
    out = [
        f"Goals: added latency median ≤ {GOAL_ADDED_MEDIAN_MS:g} ms and p99 ≤ {GOAL_ADDED_P99_MS:g} ms at 1 and "
        f"16 concurrent clients; ≥ {GOAL_RPS:,.0f} requests/s at {args.clients} clients.  Result:"
    ]
    for load, what in (
        ("1", "1 client"),
        ("16", "16 clients in a closed loop"),
        (paced, f"16 clients at {args.paced:g} requests/s each"),
    ):
        a50, a99 = added(m, load, fd, "p50"), added(m, load, fd, "p99")
        out.append(
            f"- {what}: added median **{a50:.2f} ms** ({verdict(a50 <= GOAL_ADDED_MEDIAN_MS)} the goal), p99 "
            f"**{a99:.2f} ms** ({verdict(a99 <= GOAL_ADDED_P99_MS)}); nginx {added(m, load, 'nginx', 'p50'):+.2f} / "
            f"{added(m, load, 'nginx', 'p99'):+.2f} ms."
            if "nginx" in names
            else f"- {what}: added median **{a50:.2f} ms**, p99 **{a99:.2f} ms**."
        )
    rps = med(m[(RATE, fd)], "rps")
    out.append(
        f"- {args.clients} clients: **{rps:,.0f} requests/s** ({verdict(rps >= GOAL_RPS)} the goal), "
        f"**{ratio(m, RATE, fd, 'nginx'):.2f}×** nginx's rate in the same run; the front door's CPU per request "
        f"{med(m[(RATE, fd)], 'cpu_ms'):.3f} ms, nginx's {med(m[(RATE, 'nginx')], 'cpu_ms') if 'nginx' in names else float('nan'):.3f} ms."
    )
    return [*out, ""]


def section(
    args: argparse.Namespace, m: dict[Any, list[dict[str, float]]], names: list[str], info: str
) -> str:
    lines = ["## The front door: added latency and request rate, beside nginx", ""]
    if "front door" in names:
        lines += summary(args, m, names)
    lines += [
        "| Clients | Way | Latency median | p99 | Added median | Added p99 | Requests/s | Proxy CPU (cores) | CPU per request |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, _clients, _rate in loads(args)[:3]:
        for way in names:
            runs = m[(label, way)]
            direct = way == "direct"
            add = "" if direct else f"{added(m, label, way, 'p50'):+.3f} ms"
            add99 = "" if direct else f"{added(m, label, way, 'p99'):+.3f} ms"
            cpu = "" if direct else f"{med(runs, 'cpu'):.2f}"
            per = "" if direct else f"{med(runs, 'cpu_ms'):.3f} ms"
            lines.append(
                f"| {label} | {way} | {med(runs, 'p50'):.3f} ms | {med(runs, 'p99'):.3f} ms | {add} | {add99} "
                f"| {med(runs, 'rps'):,.0f} | {cpu} | {per} |"
            )
    lines += [
        "",
        f"Requests per second at {args.clients} concurrent clients (closed loop):",
        "",
        "| Way | Requests/s | ÷ direct | ÷ nginx | Latency median | p99 | Proxy CPU (cores) | CPU per request | Generator CPU (cores) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for way in names:
        runs = m[(RATE, way)]
        rel = {
            ref: (f"{ratio(m, RATE, way, ref):.2f}×" if (RATE, ref) in m else "")
            for ref in ("direct", "nginx")
        }
        direct = way == "direct"
        cpu = "" if direct else f"{med(runs, 'cpu'):.2f}"
        per = "" if direct else f"{med(runs, 'cpu_ms'):.3f} ms"
        lines.append(
            f"| {way} | **{med(runs, 'rps'):,.0f}** | {rel['direct']} | {rel['nginx']} | {med(runs, 'p50'):.3f} ms "
            f"| {med(runs, 'p99'):.3f} ms | {cpu} | {per} | {med(runs, 'gen_cpu'):.2f} |"
        )
    rates = [r["rps"] for r in m[(RATE, names[-1])]]
    spread = f"min {min(rates):,.0f}/s, max {max(rates):,.0f}/s (n={len(rates)})" if args.rounds > 1 else ""
    lines += [
        "",
        f"- Command: `.venv/bin/python bench/frontdoor_speed.py --rounds {args.rounds} --seconds {args.seconds:g} "
        f"--clients {args.clients} --paced {args.paced:g}{' --ways ' + args.ways if args.ways != DEFAULT_WAYS else ''}` "
        f"({args.rounds} rounds after a {args.warmup:g} s warm-up of each way; each round runs every way for "
        f"{args.seconds:g} s at each load, the ways in a rotating order; medians over the rounds"
        + (f"; {names[-1]}'s rate at {args.clients} clients: {spread}" if spread else "")
        + ").",
        "- Closed loop: each client sends its next request as soon as its answer is complete, so at 16 clients a "
        "request also waits for the 15 others: its latency is 16 × the proxy's time per request, and the added "
        "latency grows with the proxy's CPU per request.  Paced: each of the 16 clients sends one request every "
        f"1/{args.paced:g} s (random phases; never two at once on a connection), {16 * args.paced:g} requests/s "
        "in all: the latency of a request that rarely waits behind another.",
        "- Request: `POST /v1/chat/completions` with a small JSON body and a bearer token (about 250 bytes), "
        "answered with about 300 bytes of JSON by bench/frontdoor_upstream.py (raw asyncio); the client "
        "(bench/frontdoor_client.py) keeps one keep-alive connection per client and checks every answer's "
        "status and backend.",
        f"- {info}",
        "- Proxy CPU: `utime + stime` of /proc/PID/stat over the run (nginx: master and worker), in cores and per "
        "request; the generator's own CPU likewise: below 1.0 it was not saturated.  All three processes and the "
        "generator share this machine's cores.",
        f"- Machine: {benchdoc.machine(fp.cores())}; load average at the end {benchdoc.load_average()}.",
        f"- Measured {benchdoc.stamp()}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--rounds", type=int, default=5, help="rounds, each every way at 1, 16 and --clients clients"
    )
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per way and client count in a round")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of warm-up per way (16 clients)")
    ap.add_argument("--clients", type=int, default=64, help="concurrent clients of the rate measurement")
    ap.add_argument(
        "--paced", type=float, default=25.0, help="requests/s of each of 16 paced clients (default 25)"
    )
    ap.add_argument("--ways", default=DEFAULT_WAYS, help="which of direct,nginx,frontdoor to measure")
    ap.add_argument(
        "--nginx-workers", type=int, default=1, help="nginx worker processes (default 1, as the front door)"
    )
    ap.add_argument("--section", default="frontdoor_speed", help="the docs/benchmarks.md section to write")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--smoke", action="store_true", help="one round of 0.5 s per way, nothing written")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.seconds, args.warmup, args.no_write = 1, 0.5, 0.3, True
    wanted = [w.strip() for w in args.ways.split(",") if w.strip()]
    bad = [w for w in wanted if w not in ("direct", "nginx", "frontdoor")]
    if bad or "direct" not in wanted:
        ap.error(f"--ways: expected direct and any of nginx, frontdoor; got {args.ways!r}")
    with contextlib.ExitStack() as stack:
        ups = stack.enter_context(fp.upstream(("a",)))
        ways: dict[str, tuple[int, list[int]]] = {"direct": (ups["a"].port, [])}
        info = "nginx not measured."
        if "nginx" in wanted:
            ng = stack.enter_context(fp.nginx(ups["a"].port, args.nginx_workers))
            ways["nginx"] = (ng.port, ng.pids)
            info = (
                f"nginx: {ng.extra['version']} (Debian's package), {args.nginx_workers} worker, access log to a "
                "file (buffered), keep-alive to the upstream; its config: bench/frontdoor_procs.py `NGINX_CONF`."
            )
        if "frontdoor" in wanted:
            fd = stack.enter_context(fp.frontdoor(ups, "a"))
            ways["front door"] = (fd.port, fd.pids)
            info += " Front door: bench/frontdoor_runner.py (gpushift's FrontDoor, `[frontdoor]` defaults, access log to a file)."
        m = asyncio.run(measure(args, ways))
    text = section(args, m, list(ways), info)
    print(text)
    if not args.no_write:
        benchdoc.write_section(args.section, text)
        print(f"written to {benchdoc.DOC}")


if __name__ == "__main__":
    main()

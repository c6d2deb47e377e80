"""Benchmark: streamed answers (server-sent events) through the front door, beside nginx in front of the
same upstream and the upstream reached directly, all measured in the same run.

Goals (issue 19, "Speed"): 64 concurrent streams of 20 chunks/s for 30 s: every chunk delivered and
the added delay per chunk p99 ≤ 5 ms; 256 streams of 50 chunks/s reported; the proxy's CPU per
1,000 chunks/s reported.

The upstream (bench/frontdoor_upstream.py) stamps each event with ``time.monotonic_ns()`` as it hands
it to its socket; the client (bench/frontdoor_client.py, this process) subtracts that from its own
monotonic clock when the bytes arrive: the chunk's delay, upstream to client.  Each stream is one
``POST /v1/chat/completions`` with ``"stream": true`` for ``rate × seconds`` chunks; the streams'
starts are spread over one chunk interval.  "Added" is a way's delay quantile minus the direct one of
the same round.  The proxy's CPU (/proc/PID/stat over the run) is given in cores and in cores per
1,000 chunks/s delivered.

    .venv/bin/python bench/frontdoor_stream.py [--rounds 3] [--seconds 30] [--seconds-256 10] [--no-write]
    .venv/bin/python bench/frontdoor_stream.py --ways direct,nginx      # without the front door
    .venv/bin/python bench/frontdoor_stream.py --smoke                  # 1 s of each, nothing written

nginx must be installed (``apt-get install -y nginx``); the benchmark never touches the system's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from typing import Any

import benchdoc
import frontdoor_client as fc
import frontdoor_procs as fp

GOAL_ADDED_P99_MS = 5.0
DEFAULT_WAYS = "direct,nginx,frontdoor"


async def one(port: int, streams: int, rate: float, seconds: float, pids: list[int]) -> dict[str, float]:
    me = [os.getpid()]
    c0, g0 = fp.cpu_s(pids) if pids else 0.0, fp.cpu_s(me)
    s = await fc.streams(port, "bench-a", streams, rate, seconds)
    c1, g1 = fp.cpu_s(pids) if pids else 0.0, fp.cpu_s(me)
    chunk_rate = s.received / s.elapsed_s
    cores = (c1 - c0) / s.elapsed_s
    return {
        "p50": fc.quantile(s.delays_ns, 0.5) / 1e6,
        "p99": fc.quantile(s.delays_ns, 0.99) / 1e6,
        "max": fc.quantile(s.delays_ns, 1.0) / 1e6,
        "expected": s.expected,
        "received": s.received,
        "complete": s.complete,
        "streams": streams,
        "failed": s.failed,
        "failures": s.failures,  # type: ignore[dict-item]
        "chunk_rate": chunk_rate,
        "cores": cores,
        "cores_per_k": cores / (chunk_rate / 1000) if chunk_rate else float("nan"),
        "gen_cpu": (g1 - g0) / s.elapsed_s,
    }


async def measure(
    args: argparse.Namespace, ways: dict[str, tuple[int, list[int]]]
) -> dict[Any, list[dict[str, Any]]]:
    loads = [(64, 20.0, args.seconds), (256, 50.0, args.seconds_256)]
    for port, pids in ways.values():  # warm-up: connections, the proxies' pools
        await one(port, 16, 20.0, 1.0, pids)
    out: dict[Any, list[dict[str, Any]]] = {}
    names = list(ways)
    for rnd in range(args.rounds):
        order = names[rnd % len(names) :] + names[: rnd % len(names)]
        for n, rate, seconds in loads:
            for way in order:
                port, pids = ways[way]
                r = await one(port, n, rate, seconds, pids)
                print(
                    f"round {rnd + 1}: {n} streams x {rate:g}/s, {way}: {r['received']}/{r['expected']} chunks, "
                    f"p99 {r['p99']:.2f} ms, {r['cores']:.2f} cores",
                    flush=True,
                )
                out.setdefault((n, way), []).append(r)
    return out


def med(runs: list[dict[str, Any]], key: str) -> float:
    return benchdoc.median([r[key] for r in runs])


def added(m: dict[Any, list[dict[str, Any]]], n: int, way: str, key: str) -> float:
    base = m[(n, "direct")]
    return benchdoc.median([r[key] - b[key] for r, b in zip(m[(n, way)], base, strict=True)])


def delivered(runs: list[dict[str, Any]]) -> str:
    got, want = sum(r["received"] for r in runs), sum(r["expected"] for r in runs)
    done, streams = sum(r["complete"] for r in runs), sum(r["streams"] for r in runs)
    fails: dict[str, int] = {}
    for r in runs:
        for k, v in r["failures"].items():
            fails[k] = fails.get(k, 0) + v
    why = f" ({', '.join(f'{k}: {v}' for k, v in fails.items())})" if fails else ""
    return f"{got:,} of {want:,}; {done} of {streams} streams complete{why}"


def section(args: argparse.Namespace, m: dict[Any, list[dict[str, Any]]], names: list[str], info: str) -> str:
    lines = ["## The front door: streamed answers (server-sent events), beside nginx", ""]
    if "front door" in names:
        runs = m[(64, "front door")]
        all_in = all(r["received"] == r["expected"] and r["complete"] == r["streams"] for r in runs)
        add99 = added(m, 64, "front door", "p99")
        lines += [
            f"Goals: 64 streams of 20 chunks/s for {args.seconds:g} s: every chunk delivered, added delay per chunk "
            f"p99 ≤ {GOAL_ADDED_P99_MS:g} ms.  Result: {'every chunk delivered' if all_in else 'CHUNKS MISSING'} "
            f"({'meets' if all_in else 'MISSES'} the goal), added p99 **{add99:.2f} ms** "
            f"({'meets' if add99 <= GOAL_ADDED_P99_MS else 'MISSES'} the goal); 256 streams of 50 chunks/s: added p99 "
            f"**{added(m, 256, 'front door', 'p99'):.2f} ms**, **{med(m[(256, 'front door')], 'cores'):.2f}** cores, "
            f"**{med(m[(256, 'front door')], 'cores_per_k'):.3f} cores per 1,000 chunks/s**.",
            "",
        ]
    lines += [
        "| Streams × chunks/s | Way | Delay median | p99 | max | Added p99 | Chunks delivered | Proxy CPU (cores) | Cores per 1,000 chunks/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, rate, secs in ((64, 20, args.seconds), (256, 50, args.seconds_256)):
        for way in names:
            runs = m[(n, way)]
            direct = way == "direct"
            add99 = "" if direct else f"{added(m, n, way, 'p99'):+.2f} ms"
            cores = "" if direct else f"{med(runs, 'cores'):.2f}"
            per_k = "" if direct else f"{med(runs, 'cores_per_k'):.3f}"
            lines.append(
                f"| {n} × {rate} for {secs:g} s | {way} | {med(runs, 'p50'):.2f} ms | {med(runs, 'p99'):.2f} ms "
                f"| {med(runs, 'max'):.1f} ms | {add99} | {delivered(runs)} | {cores} | {per_k} |"
            )
    cmd = f"--rounds {args.rounds} --seconds {args.seconds:g} --seconds-256 {args.seconds_256:g}"
    if args.ways != DEFAULT_WAYS:
        cmd += f" --ways {args.ways}"
    lines += [
        "",
        f"- Command: `.venv/bin/python bench/frontdoor_stream.py {cmd}` ({args.rounds} rounds after a 1 s warm-up "
        "of each way with 16 streams; each round runs every way at each load, the ways in a rotating order; "
        "delay quantiles are over every chunk of a run, then the median over the rounds; chunks delivered are "
        "summed over the rounds).",
        "- Each event is about 130 bytes (`data: {...}`, one HTTP chunk, `Transfer-Encoding: chunked`, as vLLM "
        "sends them); a stream ends with `data: [DONE]`; a stream is complete when every chunk came, in order, "
        "and then `[DONE]`.",
        f"- {info}",
        "- Proxy CPU: `utime + stime` of /proc/PID/stat over the run (nginx: master and worker), in cores, and "
        "divided by the chunks delivered per second / 1,000.  The upstream, the proxy and this client share this "
        "machine's cores: the direct delays are the floor the client and the upstream leave.",
        f"- Machine: {benchdoc.machine(fp.cores())}; load average at the end {benchdoc.load_average()}.",
        f"- Measured {benchdoc.stamp()}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each every way at both loads")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the 64-stream runs (default 30)")
    ap.add_argument(
        "--seconds-256", type=float, default=10.0, help="length of the 256-stream runs (default 10)"
    )
    ap.add_argument("--ways", default=DEFAULT_WAYS, help="which of direct,nginx,frontdoor to measure")
    ap.add_argument(
        "--nginx-workers", type=int, default=1, help="nginx worker processes (default 1, as the front door)"
    )
    ap.add_argument("--section", default="frontdoor_stream", help="the docs/benchmarks.md section to write")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--smoke", action="store_true", help="one round of 1 s per load and way, nothing written")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.seconds, args.seconds_256, args.no_write = 1, 1.0, 1.0, True
    wanted = [w.strip() for w in args.ways.split(",") if w.strip()]
    if [w for w in wanted if w not in ("direct", "nginx", "frontdoor")] or "direct" not in wanted:
        ap.error(f"--ways: expected direct and any of nginx, frontdoor; got {args.ways!r}")
    with contextlib.ExitStack() as stack:
        ups = stack.enter_context(fp.upstream(("a",)))
        ways: dict[str, tuple[int, list[int]]] = {"direct": (ups["a"].port, [])}
        info = "nginx not measured."
        if "nginx" in wanted:
            ng = stack.enter_context(fp.nginx(ups["a"].port, args.nginx_workers))
            ways["nginx"] = (ng.port, ng.pids)
            info = (
                f"nginx: {ng.extra['version']} (Debian's package), {args.nginx_workers} worker, `proxy_buffering off`, "
                "keep-alive to the upstream; its config: bench/frontdoor_procs.py `NGINX_CONF`."
            )
        if "frontdoor" in wanted:
            fd = stack.enter_context(fp.frontdoor(ups, "a"))
            ways["front door"] = (fd.port, fd.pids)
            info += " Front door: bench/frontdoor_runner.py (gpushift's FrontDoor, `[frontdoor]` defaults)."
        m = asyncio.run(measure(args, ways))
    text = section(args, m, list(ways), info)
    print(text)
    if not args.no_write:
        benchdoc.write_section(args.section, text)
        print(f"written to {benchdoc.DOC}")


if __name__ == "__main__":
    main()

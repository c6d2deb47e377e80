"""Benchmark: what `gpushift switch B` costs beyond the backends' own stop and start time, beside the
shell recipes people write instead (goal: overhead ≤ 0.15 s; ≈ 0.6× the `sleep 1` recipe; ≤ 1.1× the
`sleep 0.1` loop).

In one invocation, in a private systemd user manager with the shipped gpushift.service (daemon
defaults, simulated GPUs whose memory comes back the moment the holder closes the device file) and
two stand-in backends that stop at once and answer /health 200 one second after they start, every
round switches A→B and B→A four ways, interleaved:

* limit: ``systemctl --user stop A; systemctl --user start B``, then GET B's /health every 10 ms
  (the backends' own time: nothing can be faster);
* gpushift: ``gpushift switch B``, wall time until the command exits (after the launch row);
* recipe 1 s / 0.1 s: the bash script people write (stop; wait until no process has the GPUs' device
  files open, checked with ``fuser``; start; wait until ``curl -f`` gets /health), polling with
  ``sleep 1`` and with ``sleep 0.1``.

Reports the medians, gpushift's overhead (median gpushift − median limit), its ratios to the two
recipes, and the phases of gpushift's switches (the ledger rows' ``durations_s``).  Writes its
section into docs/benchmarks.md.

    .venv/bin/python bench/switch_overhead.py [--rounds 5] [--warmup 1] [--start-delay 1] [--pause 0.5]
        [--warmup-request] [--no-write]
    .venv/bin/python bench/switch_overhead.py --smoke     # 1 round, no warm-up, nothing written
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import benchdoc
from benchenv import BenchEnv, backends, running

NAME = "switch_overhead"
GOAL_OVERHEAD_S = 0.15
GOAL_VS_RECIPE_1S = 0.6
GOAL_VS_RECIPE_01S = 1.1

#: The recipe, as a person writes it (arguments: from-unit to-unit health-url sleep device-file...).
RECIPE = """\
#!/bin/bash
# switch the GPUs from one backend to the other by hand
from=$1 to=$2 url=$3 pause=$4; shift 4   # the rest: the GPUs' device files
systemctl --user stop "$from"
while fuser -s "$@"; do sleep "$pause"; done     # VRAM free: nobody has the GPUs open
systemctl --user start "$to"
until curl -sf -o /dev/null "$url"; do sleep "$pause"; done
"""

#: The warm-up request of ``--warmup-request`` (the generic kind sends none unless configured).
WARMUP_REQUEST = 'warmup = { path = "/v1/completions", body = { prompt = "hi", max_tokens = 4 } }'

WAYS = ("limit", "gpushift", "recipe 1 s", "recipe 0.1 s")


@dataclass
class Samples:
    times: dict[str, dict[str, list[float]]] = field(
        default_factory=lambda: {w: {"a→b": [], "b→a": []} for w in WAYS}
    )
    ledger_ids: list[int] = field(default_factory=list)
    gpushift_own: list[float] = field(default_factory=list)  # the elapsed time the CLI prints

    def all(self, way: str) -> list[float]:
        return [t for d in self.times[way].values() for t in d]


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as r:
            return int(r.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def way_limit(env: BenchEnv, frm: str, to: str) -> float:
    url = f"http://127.0.0.1:{env.backends[to].port}/health"
    t = time.perf_counter()
    env.sb.systemctl("stop", env.backends[frm].unit)
    env.sb.systemctl("start", env.backends[to].unit)
    deadline = t + 60
    while not healthy(url):
        if time.perf_counter() > deadline:
            raise SystemExit(f"{to} did not answer {url} within 60 s")
        time.sleep(0.01)
    return time.perf_counter() - t


def way_gpushift(env: BenchEnv, frm: str, to: str, samples: Samples) -> float:
    t = time.perf_counter()
    r = subprocess.run(
        [env.gpushift, "switch", to, "--reason", "benchmark"],
        env=env.cli_env(),
        capture_output=True,
        text=True,
    )
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"gpushift switch {to} exited {r.returncode}: {r.stdout}{r.stderr}")
    m = re.search(r"ledger #(\d+), ([0-9.]+)s\)", r.stdout)
    if m:
        samples.ledger_ids.append(int(m.group(1)))
        samples.gpushift_own.append(float(m.group(2)))
    return dt


def way_recipe(env: BenchEnv, frm: str, to: str, pause: float, script: Path) -> float:
    devices = [str(env.simdir / f"nvidia{i}") for i in env.backends[frm].gpus]
    url = f"http://127.0.0.1:{env.backends[to].port}/health"
    argv = ["bash", str(script), env.backends[frm].unit, env.backends[to].unit, url, f"{pause:g}", *devices]
    t = time.perf_counter()
    r = subprocess.run(argv, env=env.sb.env, capture_output=True, text=True, timeout=120)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"the recipe exited {r.returncode}: {r.stderr}")
    return dt


def check_serving(env: BenchEnv, on: str, off: str, after: str) -> None:
    states = (env.active_state(env.backends[on].unit), env.active_state(env.backends[off].unit))
    if states != ("active", "inactive"):
        raise SystemExit(
            f"after {after}: {on} is {states[0]}, {off} is {states[1]} (expected active/inactive)"
        )


def run_rounds(env: BenchEnv, rounds: int, warmup: int, pause: float, script: Path) -> Samples:
    samples = Samples()
    scratch = Samples()
    ways: dict[str, Callable[[str, str, Samples], float]] = {
        "limit": lambda f, t, s: way_limit(env, f, t),
        "gpushift": lambda f, t, s: way_gpushift(env, f, t, s),
        "recipe 1 s": lambda f, t, s: way_recipe(env, f, t, 1.0, script),
        "recipe 0.1 s": lambda f, t, s: way_recipe(env, f, t, 0.1, script),
    }
    for k in range(warmup + rounds):
        into = scratch if k < warmup else samples
        label = f"warm-up {k + 1}" if k < warmup else f"round {k - warmup + 1}/{rounds}"
        # Rotate the order each round, so that no way always runs right after the same other one.
        order = list(WAYS[k % len(WAYS) :] + WAYS[: k % len(WAYS)])
        for way in order:
            for frm, to in (("a", "b"), ("b", "a")):
                time.sleep(pause)  # let the previous switch's aftermath (sampler, keeper) pass
                dt = ways[way](frm, to, into)
                check_serving(env, to, frm, f"{way} {frm}→{to}")
                into.times[way][f"{frm}→{to}"].append(dt)
                print(f"{label}: {way:<13} {frm}→{to} {dt:6.3f} s", flush=True)
    return samples


def phases(env: BenchEnv, ids: list[int]) -> tuple[list[str], dict[str, list[float]]]:
    """Each phase's durations over the gpushift switches (ledger rows), plus the row's total."""
    order: list[str] = []
    got: dict[str, list[float]] = {}
    for row_id in ids:
        row = env.ledger_row(row_id)
        for ph, s in (row.get("durations_s") or {}).items():
            if isinstance(s, (int, float)):
                if ph not in got:
                    order.append(ph)
                    got[ph] = []
                got[ph].append(float(s))
        if row.get("started_at") and row.get("finished_at"):
            total = datetime.fromisoformat(row["finished_at"]) - datetime.fromisoformat(row["started_at"])
            got.setdefault("(row: started → finished)", []).append(total.total_seconds())
    if "(row: started → finished)" in got:
        order.append("(row: started → finished)")
    return order, got


def effective_settings(env: BenchEnv) -> str:
    """The timings the daemon runs with, as the gpushift measured reads its config."""
    keys = {
        "daemon": ["poll_interval_s", "fast_poll_interval_s", "sample_interval_s"],
        "gpu": ["residual_mib", "simulated_release_delay_s"],
    }
    code = (
        "import json, sys; from gpushift import config; c = config.load(sys.argv[1]); "
        f"print(json.dumps({{t: {{k: getattr(getattr(c, t), k, None) for k in ks}} for t, ks in {keys!r}.items()}}))"
    )
    r = subprocess.run(  # not from the checkout's root, whose gpushift `python -c` would import first
        [sys.executable, "-c", code, str(env.config_path)],
        env=env.cli_env(),
        cwd=env.base,
        capture_output=True,
        text=True,
    )
    try:
        got = json.loads(r.stdout)
    except ValueError:
        return f"(could not read the config: {r.stderr.strip()[-300:]})"
    return ", ".join(f"`{k} = {v}`" for table in got.values() for k, v in table.items() if v is not None)


def section(
    args: argparse.Namespace, s: Samples, order: list[str], ph: dict[str, list[float]], settings: str
) -> str:
    med = {w: benchdoc.median(s.all(w)) for w in WAYS}
    limit, gs = med["limit"], med["gpushift"]
    overhead = gs - limit
    r1, r01 = gs / med["recipe 1 s"], gs / med["recipe 0.1 s"]

    def verdict(ok: bool) -> str:
        return "meets" if ok else "MISSES"

    rows = []
    for w in WAYS:
        ab, ba = (benchdoc.median(s.times[w][d]) for d in ("a→b", "b→a"))
        xs = s.all(w)
        rows.append(
            f"| {w} | **{med[w]:.3f} s** | {ab:.3f} s | {ba:.3f} s | {min(xs):.3f}–{max(xs):.3f} s | "
            f"{med[w] - limit:+.3f} s | {med[w] / limit:.2f}× |"
        )
    phase_rows = [
        f"| {p} | {benchdoc.median(ph[p]):.3f} s | {min(ph[p]):.3f}–{max(ph[p]):.3f} s |"
        for p in order
        if ph.get(p)
    ]
    rows_total = ph.get("(row: started → finished)")
    if rows_total:
        phase_rows.append(
            f"| (outside the row: wall − row — the CLI's start-up, the D-Bus call and reply, the exit) | "
            f"{gs - benchdoc.median(rows_total):.3f} s | |"
        )
    if s.gpushift_own:
        own = benchdoc.median(s.gpushift_own)
        phase_rows.append(
            f"| (of which before the CLI's clock starts and after its last line: interpreter, imports, exit) | "
            f"{gs - own:.3f} s | |"
        )
    n = args.rounds
    warm = (
        f"after /health answers gpushift sends the warm-up request `{WARMUP_REQUEST}` (as the vllm and "
        "llama-server kinds send theirs by default)"
        if args.warmup_request
        else "no warm-up request after /health (the generic kind's default; the vllm and llama-server kinds "
        "send one: `--warmup-request` measures that)"
    )
    recipe = "\n".join(f"    {line}" for line in RECIPE.rstrip().splitlines())
    return f"""## `gpushift switch` against the backends' own time and the shell recipes

Goals: gpushift's overhead ≤ {GOAL_OVERHEAD_S} s, ≈ {GOAL_VS_RECIPE_1S}× the `sleep 1` recipe, ≤ {GOAL_VS_RECIPE_01S}× the `sleep 0.1` loop.
Result: overhead **{overhead:.3f} s** ({verdict(overhead <= GOAL_OVERHEAD_S)} the goal),
**{r1:.2f}×** the `sleep 1` recipe ({verdict(r1 <= GOAL_VS_RECIPE_1S + 0.05)} ≈ {GOAL_VS_RECIPE_1S}×),
**{r01:.2f}×** the `sleep 0.1` loop ({verdict(r01 <= GOAL_VS_RECIPE_01S)} ≤ {GOAL_VS_RECIPE_01S}×).

| Way | Median, both directions | A→B | B→A | Range | − limit | ÷ limit |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Where gpushift's time goes (medians over its {len(s.ledger_ids)} switches; the ledger rows' `durations_s`):

| Phase | Median | Range |
|---|---|---|
{chr(10).join(phase_rows)}

- Command: `.venv/bin/python bench/switch_overhead.py --rounds {n} --warmup {args.warmup} --start-delay {args.start_delay:g} --pause {args.pause:g}{" --warmup-request" if args.warmup_request else ""}`
  ({n} round(s) after {args.warmup} warm-up round(s); each round runs every way A→B and B→A, the ways in a
  rotating order, {args.pause:g} s apart; median over both directions, {2 * n} samples per way).
- Setup: a private systemd user manager and session bus, the shipped `units/gpushift.service` with the
  test drop-in, two stand-in backends (`tests/support/standin.py --start-delay {args.start_delay:g}`: /health
  answers 503 until {args.start_delay:g} s after the process started, then 200; SIGTERM ends them at once), each
  on both simulated GPUs, kind `generic`; {warm}; the daemon's default timings: {settings}.
- limit: `systemctl --user stop A; systemctl --user start B`, then GET /health every 10 ms (Python) until 200.
- gpushift: wall time of `gpushift switch B` until the command exits (after the launch row is written).
- The recipes: this script with `pause` 1 and 0.1; "VRAM free" is checked the way a person does it on a
  simulated GPU, with `fuser` on the GPUs' device files (on a real host: `fuser /dev/nvidia*` or
  `nvidia-smi`). The simulated memory comes back the moment the file is closed
  (`simulated_release_delay_s = 0`), so on this host the check passes at its first try and the
  recipes lose their time in the health loop only:

{recipe}

- Machine: {benchdoc.machine()}; load average at the end {benchdoc.load_average()}.
- Measured {benchdoc.stamp()}, {args.product}.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds (each: every way A→B and B→A)")
    ap.add_argument("--warmup", type=int, default=1, help="rounds run first and not counted")
    ap.add_argument("--start-delay", type=float, default=1.0, help="seconds the stand-ins take to answer 200")
    ap.add_argument(
        "--warmup-request",
        action="store_true",
        help="configure a warm-up request for the stand-ins (what the vllm and llama-server kinds send by default)",
    )
    ap.add_argument("--pause", type=float, default=0.5, help="seconds between two measured switches")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="1 round, no warm-up, 0.1 s pauses, nothing written (a quick check)",
    )
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.warmup, args.pause, args.no_write = 1, 0, 0.1, True

    def factory(sb: object, base: Path) -> BenchEnv:
        bs = backends(args.start_delay)
        if args.warmup_request:  # a proof of inference after /health, as the vllm and llama-server kinds send
            for b in bs:
                b.extra_config.append(WARMUP_REQUEST)
        return BenchEnv(sb, base, bs, gpu_lines=["simulated_release_delay_s = 0"])  # type: ignore[arg-type]

    with running(factory) as env:
        script = env.base / "recipe.sh"
        script.write_text(RECIPE)
        env.cli("switch", "a", "--reason", "benchmark setup", check=True)
        env.settle("a")
        samples = run_rounds(env, args.rounds, args.warmup, args.pause, script)
        order, ph = phases(env, samples.ledger_ids)
        settings = effective_settings(env)
        args.product = env.product()
        print(json.dumps({w: samples.times[w] for w in WAYS}, indent=1))
    text = section(args, samples, order, ph, settings)
    print(text)
    if not args.no_write:
        benchdoc.write_section(NAME, text)
        print(f"written to {benchdoc.DOC}")


if __name__ == "__main__":
    main()

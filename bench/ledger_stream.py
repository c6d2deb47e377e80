"""Benchmark: the peak memory (RSS) of `gpushift ledger --json`, `ledger export` and `ledger verify`
on a ledger of N rows (target: ≤ 100 MB at 1,000,000 rows, issue 20 point 6).

Builds a temp config and ledger like bench/ledger_list.py (the real schema, a valid hash chain,
records of a real 2-GPU switch, a few KB each), then runs each command once as a subprocess with
its output in a file and reads its own peak resident memory (``wait4``), beside the same command
on one row (``--limit 1``) and ``gpushift --help``, so the growth with the rows can be read on
any machine.  Prints a markdown section; it writes nothing into docs/benchmarks.md.

    .venv/bin/python bench/ledger_stream.py [--rows 1000000] [--no-write]
    .venv/bin/python bench/ledger_stream.py --smoke     # 2,000 rows
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchdoc
from ledger_list import build

TARGET_MB = 100.0


def peak_rss(argv: list[str], env: dict[str, str], out: Path) -> tuple[float, float, int]:
    """Run ``argv`` with its stdout in ``out``: its peak RSS (MB), its wall time (s), the bytes it wrote."""
    t = time.perf_counter()
    with open(out, "wb") as f:
        p = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.PIPE)
        _pid, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        err = p.stderr.read().decode() if p.stderr else ""
    dt = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}): {err.strip()[-500:]}")
    return usage.ru_maxrss * 1024 / 1e6, dt, out.stat().st_size  # ru_maxrss: KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument(
        "--no-write", action="store_true", help="accepted for the bench/ scripts' sake: this one only prints"
    )
    ap.add_argument("--smoke", action="store_true", help="2,000 rows (a quick check)")
    args = ap.parse_args()
    if args.smoke:
        args.rows = 2000

    tmp = Path(tempfile.mkdtemp(prefix="gpushift-bench-"))
    try:
        state, run = tmp / "state", tmp / "run"
        cfg = tmp / "gpushift.toml"
        cfg.write_text(
            f'[daemon]\nstate_dir = "{state}"\nruntime_dir = "{run}"\n'
            '[backends.vllm]\nunit = "gpushift-vllm.service"\nhealth_url = "http://127.0.0.1:8000/health"\n'
            '[backends.llama]\nunit = "gpushift-llama.service"\nhealth_url = "http://127.0.0.1:8080/health"\n'
        )
        build_s = build(state / "ledger.db", run, args.rows)
        size_mb = (state / "ledger.db").stat().st_size / 1e6
        env = benchdoc.bytecode_cached(dict(os.environ, GPUSHIFT_CONFIG=str(cfg)), tmp / "pycache")
        gpushift = shutil.which("gpushift", path=str(Path(sys.executable).parent)) or "gpushift"
        commands = [
            ("ledger --json --limit 1", ["ledger", "--json", "--limit", "1"]),
            (f"ledger --json --limit {args.rows}", ["ledger", "--json", "--limit", str(args.rows)]),
            ("ledger export --format jsonl", ["ledger", "export", "--format", "jsonl"]),
            ("ledger export (markdown)", ["ledger", "export"]),
            ("ledger verify", ["ledger", "verify"]),
            ("--help (baseline)", ["--help"]),
        ]
        rows = []
        for name, argv in commands:
            mb, dt, size = peak_rss([gpushift, *argv], env, tmp / "out")
            rows.append((name, mb, dt, size))
            print(f"{name}: {mb:.0f} MB peak RSS, {dt:.1f} s, {size / 1e6:.1f} MB written", file=sys.stderr)
        worst = max(mb for name, mb, _dt, _size in rows if "baseline" not in name)
        verdict = "meets" if worst <= TARGET_MB else "MISSES"
        table = "\n".join(
            f"| `gpushift {name}` | {mb:.0f} MB | {dt:.1f} s | {size / 1e6:.1f} MB |"
            for name, mb, dt, size in rows
        )
        print(f"""## Peak memory of the streamed ledger commands on {args.rows:,} rows

Target: ≤ {TARGET_MB:.0f} MB peak RSS. Result: at most **{worst:.0f} MB**, {verdict} the target.

| Command | Peak RSS | Wall time | Output |
|---|---|---|---|
{table}

- Command: `.venv/bin/python bench/ledger_stream.py --rows {args.rows}` (each command run once, its output
  in a file; peak RSS of the command's own process by `wait4`).
- Ledger: {args.rows:,} rows, {size_mb:.0f} MB database (records of a real 2-GPU switch, valid hash chain),
  built in {build_s:.1f} s.
- Machine: {benchdoc.machine(f"SQLite {sqlite3.sqlite_version}")}.
- Measured {benchdoc.stamp()}.
""")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Benchmark: `gpushift status` and `gpushift status --json` wall time (goal: ≤ 0.10 s median), beside
`systemctl --user status UNIT` as the reference, in the same invocation.

Default mode: the daemon up in a private systemd user manager (the shipped gpushift.service, daemon
defaults, simulated GPUs, one stand-in backend serving), the commands run interleaved, medians of
``--runs`` runs after 2 warm-up rounds.

``--cold``: for a host without systemd or D-Bus (a GPU test host): the status path's interpreter
start-up and imports — ``python -c pass``, the imports of the status path, and ``gpushift status
--json`` against a config whose bus cannot be reached (the CLI then reads units, GPUs and the
ledger itself: NVML on a host where it works, else simulated GPUs) — beside ``nvidia-smi`` when
present.  Both modes also print where the import time goes (``python -X importtime``).

    .venv/bin/python bench/status.py [--runs 15] [--no-write]
    .venv/bin/python bench/status.py --cold [--runs 15] [--no-write]
    .venv/bin/python bench/status.py --smoke [--cold]     # 2 runs, no warm-up, nothing written

On a GPU host, ``PYTHONPATH=. python3 bench/status.py --cold --section status_cold_gpu`` keeps this
host's figures in a section of their own, beside this machine's (``make bench-gpu`` does).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import benchdoc

GOAL_S = 0.10


def status_imports() -> str:
    """``import …`` of the modules `gpushift status` needs before it can ask the daemon: the CLI, the
    config file's reader (``[daemon] bus`` is peeked, the config is not validated on this path), and
    what the status command imports itself (its D-Bus client), read from its source so that this
    follows the code."""
    modules = ["gpushift.cli", "gpushift.config.textfile"]
    try:
        text = (benchdoc.ROOT / "gpushift" / "cli" / "__init__.py").read_text()
        body = text[text.index("def status(") :]
        body = body[: body.find("\n@", 1) if "\n@" in body else len(body)]
        for rel, name in re.findall(r"from \.\.([\w.]*) import (\w+)", body):
            mod = f"gpushift.{rel}" if rel else f"gpushift.{name}"  # `from .. import x`: module x
            if mod not in modules:
                modules.append(mod)
    except (OSError, ValueError):
        pass
    return "import " + ", ".join(modules)


def gpushift_argv() -> list[str]:
    """The installed entry point beside this interpreter, else the same call through ``python -c``."""
    script = shutil.which("gpushift", path=str(Path(sys.executable).parent))
    if script:
        return [script]
    return [
        sys.executable,
        "-c",
        "import sys; from gpushift.cli import main; sys.argv[0] = 'gpushift'; main()",
    ]


def once(argv: Sequence[str], env: dict[str, str], ok: Sequence[int]) -> float:
    t = time.perf_counter()
    p = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=60)
    dt = time.perf_counter() - t
    if p.returncode not in ok:
        raise SystemExit(f"{' '.join(argv)} exited {p.returncode}: {(p.stderr or p.stdout).strip()[-800:]}")
    return dt


def interleaved(
    commands: dict[str, tuple[list[str], dict[str, str], Sequence[int]]], runs: int, warmup: int
) -> dict[str, list[float]]:
    """Run every command once per round, rounds after ``warmup`` counted; the times per command."""
    times: dict[str, list[float]] = {k: [] for k in commands}
    for k in range(warmup + runs):
        for name, (argv, env, ok) in commands.items():
            dt = once(argv, env, ok)
            if k >= warmup:
                times[name].append(dt)
    return times


def import_profile(
    argv: Sequence[str], env: dict[str, str], top: int = 8
) -> tuple[float, list[tuple[str, float]]]:
    """Total import time of a command (``-X importtime``: the top-level imports' cumulative times) and
    its ``top`` heaviest top-level imports (seconds)."""
    p = subprocess.run(
        [sys.executable, "-X", "importtime", *argv], env=env, capture_output=True, text=True, timeout=60
    )
    heads: list[tuple[str, float]] = []
    for line in p.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m and len(m.group(3)) == 1:  # one space: imported at the top level, not by another import
            heads.append((m.group(4), int(m.group(2)) / 1e6))
    total = sum(s for _, s in heads)
    return total, sorted(heads, key=lambda h: -h[1])[:top]


def table(times: dict[str, list[float]], labels: dict[str, str], reference: str) -> str:
    ref = benchdoc.median(times[reference]) if reference in times else float("nan")
    rows = ["| Command | Median | Range | ÷ reference |", "|---|---|---|---|"]
    for name, xs in times.items():
        med = benchdoc.median(xs)
        rows.append(
            f"| {labels[name]} | **{med:.3f} s** | {min(xs):.3f}–{max(xs):.3f} s | {med / ref:.2f}× |"
        )
    return "\n".join(rows)


def imports_text(total: float, heads: list[tuple[str, float]], what: str) -> str:
    listed = ", ".join(f"`{m}` {s * 1000:.0f} ms" for m, s in heads)
    return (
        f"- Imports of {what}: {total * 1000:.0f} ms in all (`-X importtime`, one run); heaviest: {listed}."
    )


def warm(args: argparse.Namespace) -> str:
    from benchenv import BenchEnv, backends, running

    def factory(sb: object, base: Path) -> BenchEnv:
        return BenchEnv(sb, base, backends(0.0)[:1])  # type: ignore[arg-type]

    gs = gpushift_argv()
    with running(factory) as env:
        env.cli("switch", "a", "--reason", "benchmark setup", check=True)
        env.settle("a")
        cli_env = env.cli_env()
        product = env.product()
        unit = env.backends["a"].unit
        cmds: dict[str, tuple[list[str], dict[str, str], Sequence[int]]] = {
            "status": ([*gs, "status"], cli_env, (0,)),
            "json": ([*gs, "status", "--json"], cli_env, (0,)),
            "systemctl": (["systemctl", "--user", "--no-pager", "status", unit], cli_env, (0,)),
            "pass": ([sys.executable, "-c", "pass"], cli_env, (0,)),
        }
        times = interleaved(cmds, args.runs, args.warmup)
        total, heads = import_profile([*gs[1:], "status"] if len(gs) > 1 else [gs[0], "status"], cli_env)
    labels = {
        "status": "`gpushift status`",
        "json": "`gpushift status --json`",
        "systemctl": "`systemctl --user status UNIT` (reference)",
        "pass": "`python -c pass` (the interpreter alone)",
    }
    med = min(benchdoc.median(times["status"]), benchdoc.median(times["json"]))
    worst = max(benchdoc.median(times["status"]), benchdoc.median(times["json"]))
    verdict = "meets" if worst <= GOAL_S else "MISSES"
    return f"""## `gpushift status` with the daemon up

Goal: ≤ {GOAL_S:.2f} s (median). Result: **{med:.3f}–{worst:.3f} s**, {verdict} the goal.

{table(times, labels, "systemctl")}

- Command: `.venv/bin/python bench/status.py --runs {args.runs}` ({args.runs} runs of each after {args.warmup}
  warm-up rounds, the commands interleaved; byte-code cached as in an installed package).
- Setup: a private systemd user manager and session bus, the shipped `units/gpushift.service` with the test
  drop-in (daemon defaults, simulated GPUs), one stand-in backend serving; the reference asks the same
  manager about that backend's unit.
{imports_text(total, heads, "`gpushift status`")}
- Machine: {benchdoc.machine()}; load average at the end {benchdoc.load_average()}.
- Measured {benchdoc.stamp()}, {product}.
"""


def nvml_works() -> bool:
    try:
        import pynvml  # type: ignore[import-untyped]

        pynvml.nvmlInit()
        n = int(pynvml.nvmlDeviceGetCount())
        pynvml.nvmlShutdown()
        return n > 0
    except Exception:
        return False


def cold(args: argparse.Namespace) -> str:
    tmp = Path(tempfile.mkdtemp(prefix="gpushift-bench-"))
    imports = status_imports()
    try:
        provider = "nvml" if nvml_works() else "simulated"
        cfg = tmp / "gpushift.toml"
        cfg.write_text(
            f'[daemon]\nbus = "session"\nstate_dir = "{tmp / "state"}"\nruntime_dir = "{tmp / "run"}"\nschedule = ""\n'
            f'[gpu]\nprovider = "{provider}"\n'
            '[backends.a]\nunit = "gpushift-bench-a.service"\nhealth_url = "http://127.0.0.1:9/health"\n'
        )
        env = dict(
            os.environ, GPUSHIFT_CONFIG=str(cfg), DBUS_SESSION_BUS_ADDRESS=f"unix:path={tmp / 'no-bus'}"
        )
        env = benchdoc.bytecode_cached(env, tmp / "pycache")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(benchdoc.ROOT), env.get("PYTHONPATH")) if p)
        gs = gpushift_argv()
        cmds: dict[str, tuple[list[str], dict[str, str], Sequence[int]]] = {
            "pass": ([sys.executable, "-c", "pass"], env, (0,)),
            "imports": ([sys.executable, "-c", imports], env, (0,)),
            "status": ([*gs, "status", "--json"], env, (6,)),  # 6: the daemon cannot be reached
        }
        notes = []
        for name in ("imports", "status"):
            argv, e, ok = cmds[name]
            p = subprocess.run(argv, env=e, capture_output=True, text=True, timeout=60)
            if p.returncode not in ok:
                last = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["(no output)"]
                notes.append(f"- `{name}` cannot run on this host (exit {p.returncode}): `{last[0][:300]}`")
                del cmds[name]
        smi = shutil.which("nvidia-smi")
        if smi:
            cmds["nvidia-smi"] = ([smi], env, (0,))
        else:
            notes.append("- `nvidia-smi` is absent on this host: no comparison with it.")
        times = interleaved(cmds, args.runs, args.warmup)
        total, heads = import_profile(["-c", imports], env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    labels = {
        "pass": "`python -c pass` (the interpreter alone; reference)",
        "imports": f"`python -c '{imports}'`",
        "status": f"`gpushift status --json`, bus unreachable ({provider} GPUs read by the CLI)",
        "nvidia-smi": "`nvidia-smi`",
    }
    return f"""## `gpushift status` cold: no daemon, no bus (a host without systemd)

{table(times, labels, "pass")}

- Command: `python bench/status.py --cold --runs {args.runs}{f" --section {args.section}" if args.section else ""}` ({args.runs} runs of each after {args.warmup} warm-up
  rounds, interleaved). The status run falls back to reading units, GPUs and the ledger itself (exit 6: the
  daemon cannot be reached), which is the most a cold `gpushift status` can cost.
{chr(10).join(notes)}
{imports_text(total, heads, "the status path")}
- Machine: {benchdoc.machine()}; load average at the end {benchdoc.load_average()}.
- Measured {benchdoc.stamp()}.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=2, help="rounds run first and not counted")
    ap.add_argument("--cold", action="store_true", help="no daemon, no bus: start-up and imports only")
    ap.add_argument(
        "--section", help="the docs/benchmarks.md section to write (default: status or status_cold)"
    )
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument(
        "--smoke", action="store_true", help="2 runs, no warm-up, nothing written (a quick check)"
    )
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.warmup, args.no_write = 2, 0, True
    text = cold(args) if args.cold else warm(args)
    print(text)
    if not args.no_write:
        benchdoc.write_section(args.section or ("status_cold" if args.cold else "status"), text)
        print(f"written to {benchdoc.DOC}")


if __name__ == "__main__":
    main()

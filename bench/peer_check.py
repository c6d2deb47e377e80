"""Benchmark: what a checked health probe costs (the peer check of issue 20) against an unchecked one.

A stand-in backend (tests/support/standin.py) runs in a cgroup of its own below this process's
(as a unit's service runs in its ControlGroup), and each way below asks its ``/health`` once per
call, interleaved in rounds:

* ``unchecked``: ``HttpBackendProbe().health(url)`` — the baseline, as before the check;
* ``checked``: ``HttpBackendProbe(PeerFinder()).health(url, expect_cgroup=…)`` — the kernel's socket
  diagnostics give the server socket's cgroup, one ``stat`` compares it with the unit's;
* ``checked, /proc/net/tcp``: the same without socket diagnostics (a kernel built without them):
  the connection's line in ``/proc/net/tcp`` gives the socket's inode, the unit's own processes'
  open files are searched for it;
* ``psutil.net_connections`` (for comparison, not used): the owner of the connection looked up with
  psutil, which reads every socket table and every process's open files;
* ``refused (impostor)``: the check of a port held outside the unit, naming its holder (every
  process's open files searched): what a poll costs while an impostor holds the port;
* ``the check alone`` (and ``, /proc/net/tcp``): the peer check by itself on one open connection,
  what a checked request adds to an unchecked one.

Reported: the median per call over ``--runs`` rounds of ``--calls`` calls each (a round's figure is
its median; the ways take turns call by call, in a random order), and its ratio to ``unchecked`` in the same
invocation.  ``--busy N`` first opens N idle
connections to the backend (the socket table and the backend's open files grow, as on a loaded
inference server).  Needs root (it makes a cgroup).

    .venv/bin/python bench/peer_check.py [--runs 7] [--calls 200] [--busy 0] [--no-write]
    .venv/bin/python bench/peer_check.py --busy 1000 --section peer_check_busy
    .venv/bin/python bench/peer_check.py --smoke     # 2 rounds of 20 calls, nothing written
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import benchdoc

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpushift.backends.probe import HttpBackendProbe  # noqa: E402
from gpushift.backends.served import Connection  # noqa: E402
from gpushift.host.peer import PeerFinder, cgroup2_root, cgroup_of  # noqa: E402


@contextlib.contextmanager
def backend_in_own_cgroup() -> Iterator[tuple[int, str]]:
    """A stand-in listening on a free port in a cgroup of its own; yields (port, cgroup path)."""
    root = cgroup2_root()
    if root is None or os.geteuid() != 0:
        raise SystemExit("peer_check: needs root and a cgroup2 file system (it makes a cgroup)")
    cgroup = cgroup_of(os.getpid()).rstrip("/") + f"/gpushift-bench-{uuid.uuid4().hex[:8]}.service"
    os.mkdir(root + cgroup)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    def join() -> None:
        with open(root + cgroup + "/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.standin", "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=join,
    )
    try:
        deadline = time.monotonic() + 30
        while HttpBackendProbe().health(f"http://127.0.0.1:{port}/health", 1.0).status != 200:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("peer_check: the stand-in backend did not answer")
            time.sleep(0.05)
        yield port, cgroup
    finally:
        proc.terminate()
        proc.wait(10)
        for _ in range(100):
            with contextlib.suppress(OSError):
                os.rmdir(root + cgroup)
                break
            time.sleep(0.05)


def psutil_owner(url_port: int) -> Callable[[], object]:
    """Connect, then find the server end's owner with psutil (the comparison, not gpushift's way)."""
    import psutil

    def call() -> object:
        with socket.create_connection(("127.0.0.1", url_port), timeout=2) as c:
            me, them = c.getsockname(), c.getpeername()
            for k in psutil.net_connections("tcp4"):
                if k.laddr and k.raddr and tuple(k.laddr) == them and tuple(k.raddr) == me:
                    return k.pid
        return None

    return call


def ways(port: int, cgroup: str) -> tuple[dict[str, Callable[[], object]], dict[str, Callable[[], object]]]:
    """The two series: gpushift's way against the baseline, then the other ways (each series timed
    on its own: the slow ways fill the socket table and the CPU caches for whatever follows them)."""
    url = f"http://127.0.0.1:{port}/health"
    plain, finder, slow = HttpBackendProbe(), PeerFinder(), PeerFinder()
    slow._diag = False  # as on a kernel without NETLINK_SOCK_DIAG
    checked, checked_slow = HttpBackendProbe(finder), HttpBackendProbe(slow)
    other = "/gpushift-bench-nowhere.slice/b.service"

    def must(ok: bool, h: object) -> object:
        if not ok:
            raise SystemExit(f"peer_check: unexpected answer {h!r}")
        return h

    def unchecked() -> object:
        return must(plain.health(url, 2.0).ok, None)

    main = {
        "unchecked": unchecked,
        "checked": lambda: must(checked.health(url, 2.0, cgroup).ok, None),
        "the check alone": check_alone(port, cgroup, True),
    }
    others = {
        "unchecked": unchecked,
        "checked, /proc/net/tcp": lambda: must(checked_slow.health(url, 2.0, cgroup).ok, None),
        "the check alone, /proc/net/tcp": check_alone(port, cgroup, False),
        "psutil.net_connections": psutil_owner(port),
        "refused (impostor)": lambda: must(checked.health(url, 2.0, other).foreign is not None, None),
    }
    return main, others


def rounds(fns: dict[str, Callable[[], object]], runs: int, calls: int) -> dict[str, list[float]]:
    """Per way, the median call of each round; the ways take turns call by call, in a new random
    order each time (a busy moment of the machine, or what the way before left behind, falls on
    all of them alike)."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    rng = random.Random(20)
    for fn in fns.values():
        fn()  # warm
    for _ in range(runs):
        times: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(calls):
            order = list(fns.items())
            rng.shuffle(order)
            for name, fn in order:
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        for name, xs in times.items():
            out[name].append(benchdoc.median(xs))
    return out


def check_alone(port: int, cgroup: str, diag: bool) -> Callable[[], object]:
    """The peer check by itself on one open connection (what a checked request adds to an unchecked)."""
    finder = PeerFinder()
    finder._diag = diag
    c = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn = Connection(c.getsockname()[:2], c.getpeername()[:2])
    keep.append(c)

    def call() -> object:
        v = finder.check(conn, cgroup, time.monotonic() + 2)
        if not v.ok:
            raise SystemExit(f"peer_check: the backend's own connection was refused: {v!r}")
        return v

    return call


#: Connections the check-alone ways keep open while they are timed.
keep: list[socket.socket] = []


def busy_connections(port: int, n: int) -> list[socket.socket]:
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]


def table(result: dict[str, list[float]]) -> str:
    base = benchdoc.median(result["unchecked"])
    lines = ["| way | median per call | vs unchecked | round medians |", "|---|---|---|---|"]
    for name, xs in result.items():
        m = benchdoc.median(xs)
        lines.append(
            f"| {name} | **{m * 1e3:.3f} ms** | {m / base:.2f}x | "
            f"{min(xs) * 1e3:.3f}-{max(xs) * 1e3:.3f} ms (n={len(xs)}) |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--busy", type=int, default=0, help="idle connections opened to the backend first")
    ap.add_argument("--section", default="peer_check", help="the section of docs/benchmarks.md written")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--smoke", action="store_true", help="2 rounds of 20 calls, nothing written")
    args = ap.parse_args()
    if args.smoke:
        args.runs, args.calls, args.no_write = 2, 20, True
    with backend_in_own_cgroup() as (port, cgroup):
        held = busy_connections(port, args.busy)
        try:
            _check_connection_owner(port, cgroup)
            main, others = ways(port, cgroup)
            first = rounds(main, args.runs, args.calls)
            second = rounds(others, args.runs, args.calls)
        finally:
            for s in held + keep:
                s.close()
    title = "## The peer check: a checked health request against an unchecked one" + (
        f", with {args.busy:,} idle connections open to the backend" if args.busy else ""
    )
    head = (
        f"{title}\n\n`bench/peer_check.py --runs {args.runs} --calls {args.calls} --busy {args.busy}` "
        f"({benchdoc.stamp()}; {benchdoc.machine(f'load {benchdoc.load_average()}')})."
    )
    text = (
        f"{head}\n\ngpushift's check against the baseline:\n\n{table(first)}\n\n"
        f"The other ways, timed apart (a series of their own, its own baseline):\n\n{table(second)}"
    )
    print(text)
    if not args.no_write:
        benchdoc.write_section(args.section, text)


def _check_connection_owner(port: int, cgroup: str) -> None:
    """The check says what it should before it is timed: the backend is its unit's, nothing else is."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        conn = Connection(c.getsockname()[:2], c.getpeername()[:2])
        verdict = PeerFinder().check(conn, cgroup, time.monotonic() + 2)
    if not verdict.ok:
        raise SystemExit(f"peer_check: the backend's own connection was refused: {verdict!r}")


if __name__ == "__main__":
    main()

"""The processes of the front door benchmarks, each started privately and stopped again.

Not a benchmark itself.  :func:`upstream` (bench/frontdoor_upstream.py), :func:`nginx` (Debian's
nginx as a reverse proxy in front of it: its own config and prefix in a temporary directory,
``daemon off``, one worker, a loopback port, ``proxy_buffering off`` for the server-sent events,
keep-alive connections to the upstream) and :func:`frontdoor` (bench/frontdoor_runner.py: gpushift's
front door alone in its own process, so its CPU and memory are its own).  Each is a context manager
that stops what it started, by PID, even when the benchmark fails.

:func:`cpu_s` and :func:`rss_kb` read /proc/PID/stat and /proc/PID/status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
TICK = os.sysconf("SC_CLK_TCK")


class BenchError(SystemExit):
    """A benchmark cannot run here (what is missing, and how to get it)."""


def cores() -> str:
    """The machine line's addition: the CPUs this run may use (``nproc``: fewer than the host's when
    it was started under ``taskset``, as on a bigger host standing in for a small one)."""
    mine, host = len(os.sched_getaffinity(0)), os.cpu_count() or 0
    return f"nproc {mine}" + (
        f" (pinned with taskset to {mine} of the host's {host} CPUs)" if mine < host else ""
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes have used, from /proc/PID/stat."""
    total = 0
    for pid in pids:
        data = Path(f"/proc/{pid}/stat").read_bytes()
        rest = data[data.rindex(b")") + 2 :].split()  # after the command name, which may hold spaces
        total += int(rest[11]) + int(rest[12])
    return total / TICK


def rss_kb(pid: int, field_name: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise BenchError(f"/proc/{pid}/status has no {field_name}")


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            out += [int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return out


def wait_port(
    port: int, proc: subprocess.Popen[Any], what: str, log: Path | None, timeout_s: float = 30
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text()[-3000:] if log and log.exists() else ""
            raise BenchError(f"{what} exited with status {proc.returncode} before it listened\n{tail}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise BenchError(f"{what} did not listen on 127.0.0.1:{port} within {timeout_s:g} s")


def stop(proc: subprocess.Popen[Any], timeout_s: float = 10) -> None:
    """SIGTERM the process we started (by its PID), SIGKILL when it does not go."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)


@dataclass
class Proc:
    """A started process: its PIDs (nginx: master and worker), its port, its files."""

    name: str
    port: int
    pids: list[int]
    dir: Path
    extra: dict[str, Any] = field(default_factory=dict)

    def cpu_s(self) -> float:
        return cpu_s(self.pids)


@contextlib.contextmanager
def tempdir(prefix: str) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def upstream(names: tuple[str, ...] = ("a",)) -> Iterator[dict[str, Proc]]:
    """bench/frontdoor_upstream.py, one port per backend name, in one process of its own."""
    ports = {n: free_port() for n in names}
    argv = [sys.executable, str(BENCH / "frontdoor_upstream.py")]
    for n, p in ports.items():
        argv += ["--port", str(p), "--name", n]
    with tempdir("gpushift-fdbench-up-") as d:
        log = d / "upstream.log"
        with log.open("w") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
        try:
            for p in ports.values():
                wait_port(p, proc, "the upstream", log)
            yield {n: Proc(f"upstream {n}", p, [proc.pid], d) for n, p in ports.items()}
        finally:
            stop(proc)


NGINX_CONF = """\
# nginx in front of the benchmark's upstream: written by bench/frontdoor_procs.py for one run
daemon off;
master_process on;
worker_processes {workers};
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
worker_rlimit_nofile 20000;
events {{
    worker_connections 8192;
}}
http {{
    access_log {dir}/access.log combined buffer=64k flush=1s;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 75s;
    upstream backend {{
        server 127.0.0.1:{up_port};
        keepalive 256;
        keepalive_requests 1000000;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


def nginx_binary() -> str:
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if path is None:
        raise BenchError(
            "this benchmark measures nginx beside the front door, and nginx is not installed: "
            "apt-get install -y nginx (Debian's package; the benchmark starts its own, "
            "never the system's nginx.service)"
        )
    return path


@contextlib.contextmanager
def nginx(up_port: int, workers: int = 1) -> Iterator[Proc]:
    """Debian's nginx in front of ``127.0.0.1:up_port``, with a config of its own (see NGINX_CONF)."""
    binary = nginx_binary()
    port = free_port()
    with tempdir("gpushift-fdbench-nginx-") as d:
        os.chmod(d, 0o755)  # the worker runs as nobody: it must reach its temp paths
        conf = d / "nginx.conf"
        conf.write_text(NGINX_CONF.format(workers=workers, dir=d, up_port=up_port, port=port))
        log = d / "error.log"
        argv = [binary, "-p", str(d), "-c", str(conf), "-e", str(log)]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            wait_port(port, proc, "nginx", log)
            workers_pids: list[int] = []
            deadline = time.monotonic() + 10
            while len(workers_pids) < workers and time.monotonic() < deadline:
                workers_pids = children(proc.pid)
                time.sleep(0.05)
            version = subprocess.run([binary, "-v"], capture_output=True, text=True).stderr.strip()
            yield Proc("nginx", port, [proc.pid, *workers_pids], d, {"version": version})
        finally:
            stop(proc)  # SIGTERM: nginx's fast shutdown, master and workers


FRONTDOOR_CONF = """\
# gpushift's front door in front of the benchmark's upstream: written by bench/frontdoor_procs.py
[daemon]
bus = "session"
state_dir = "{dir}/state"
runtime_dir = "{dir}/run"

[gpu]
provider = "simulated"
simulated_gpus = 1
{backends}
[frontdoor]
listen = ["127.0.0.1:{port}"]
{frontdoor}
"""

#: Another module's ``FrontDoor`` to measure in place of gpushift.frontdoor.core (e.g. a plain proxy
#: for comparison; the module must be importable with the environment's PYTHONPATH).
CORE_ENV = "GPUSHIFT_FDBENCH_CORE"
#: A file for the front door's cProfile stats (CPU time; bench/frontdoor_runner.py --profile).
PROFILE_ENV = "GPUSHIFT_FDBENCH_PROFILE"

BACKEND_CONF = """
[backends.{name}]
unit = "bench-{name}.service"
kind = "generic"
health_url = "http://127.0.0.1:{port}/health"
models = ["bench-{name}"]
aliases = ["default"]
"""


@contextlib.contextmanager
def frontdoor(ups: dict[str, Proc], active: str, extra: str = "") -> Iterator[Proc]:
    """bench/frontdoor_runner.py: gpushift's FrontDoor from a config naming ``ups`` as its backends
    (models ``bench-NAME``, alias ``default``), told that ``active`` serves; ``extra``: more lines
    of its ``[frontdoor]`` table.  Its ``extra["control"]`` is the runner's control socket."""
    port = free_port()
    with tempdir("gpushift-fdbench-fd-") as d:
        backends = "".join(BACKEND_CONF.format(name=n, port=p.port) for n, p in ups.items())
        conf = d / "gpushift.toml"
        conf.write_text(FRONTDOOR_CONF.format(dir=d, backends=backends, port=port, frontdoor=extra))
        control = d / "control.sock"
        log = d / "frontdoor.log"
        argv = [sys.executable, str(BENCH / "frontdoor_runner.py"), "--config", str(conf)]
        argv += ["--control", str(control), "--active", active]
        if os.environ.get(CORE_ENV):
            argv += ["--core", os.environ[CORE_ENV]]
        if os.environ.get(PROFILE_ENV):
            argv += ["--profile", os.environ[PROFILE_ENV]]
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with log.open("w") as f:
            proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
        try:
            wait_port(port, proc, "the front door (bench/frontdoor_runner.py)", log)
            deadline = time.monotonic() + 10
            while not control.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            yield Proc("front door", port, [proc.pid], d, {"control": str(control), "log": log})
        finally:
            stop(proc)


async def control(fd: Proc, op: str, **args: Any) -> Any:
    """One command to the runner's control socket (``update``, ``close``, ``in_flight``, ``release``,
    ``status``; see bench/frontdoor_runner.py); its answer."""
    reader, writer = await asyncio.open_unix_connection(fd.extra["control"])
    try:
        writer.write(json.dumps({"op": op, **args}).encode() + b"\n")
        await writer.drain()
        line = await reader.readline()
    finally:
        writer.close()
    answer = json.loads(line)
    if "error" in answer:
        raise BenchError(f"the front door's runner answered {op}: {answer['error']}")
    return answer["result"]

"""A stand-in inference backend: a small HTTP server that behaves like vLLM / llama-server where gpushift looks.

Integration tests and ``make demo`` run it as a backend unit instead of a real model server::

    python -m tests.support.standin --port 8000 --version 0.9.1 --hold-device /var/lib/gpushift/simgpu/nvidia0

Endpoints:
    GET  /health          503 ``{"status": "loading"}`` during ``--start-delay``, then 200
                          ``{"status": "ok"}`` (never 200 with ``--never-ready``)
    GET  /version         ``{"version": V}``
    GET  /metrics         Prometheus text: ``standin:requests_running`` and the vLLM names
                          ``vllm:num_requests_running`` / ``vllm:num_requests_waiting``
    GET  /v1/models       the served model names (``--served-model-name``, ``--alias``), as vLLM
    POST /v1/completions  sleeps ``--request-seconds`` (or the body's ``"sleep"``), counted as running
                          meanwhile, then answers a small OpenAI-shaped completion; with
                          ``"stream": true`` server-sent events (``tests.support.standin_openai``)
    POST /v1/chat/completions  the same for chat (``chat.completion`` and its chunks)
    POST /control         a test's remote control: ``{"exit": N}`` exits with status N (a backend
                          dying by itself; vLLM can exit 0 when its engine dies), ``{"health": M}`` the
                          same as POST /_standin/health below (``fail``: a wedged backend)
    POST /_standin/health body ``{"mode": M}``, the test's control of /health from then on:
                          ``ok`` (as above), ``fail`` (500 ``{"status": "failing"}``), ``hang``
                          (accepts the connection, reads the request, never answers)

Misbehaviours on request (each one a failure gpushift must survive):
    --exit-at-once             exit 1 at once, like a missing binary or a bad flag
    --never-ready              serve, but /health never says 200
    --fail-completions         /health says 200, but every completion answers 500 (inference dead)
    --ignore-sigterm           ignore SIGTERM: systemd SIGKILLs it after TimeoutStopSec
    --orphan-on-sigterm PATH   on SIGTERM, first leave a process OUTSIDE this unit's cgroup (a
                               transient scope made by ``systemd-run --user --scope``) holding PATH
                               open, print its pid (and write it to --orphan-pid-file), then exit:
                               the VRAM holder that a finished stop job does not account for
    --hold-device PATH ...     keep these (simulated GPU device) files open for its whole life,
                               as a real server maps the device
    --stop-delay S             on SIGTERM, take S seconds before exiting (a server finishing its
                               requests and freeing its memory: a stop job that lasts)

A witness for the soak (``tests/support/soak.py``):
    --witness FILE             once its devices are open, append one JSON line to FILE: its pid, its
                               unit, the time, and every OTHER process holding one of its device files
                               at that moment (another backend, a foreign holder) — what the process
                               itself saw at its start, not what gpushift reports

It logs one line per event to stdout (in a unit: the journal) and, when ``$STANDIN_LOG_FILE`` is
set, appends the same line to that file, where a test waits for it without asking the journal.

A unit runs it from this checkout (it is not part of the installed package): ``ExecStart=`` begins
with :func:`unit_command` and the unit carries :data:`UNIT_ENVIRONMENT`, so systemd can start it
from any working directory.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO

from tests.support import standin_openai
from tests.support.standin_holders import leave_orphan, write_witness

CHECKOUT = Path(__file__).resolve().parents[2]
# The Environment= assignment a stand-in unit needs: ``tests.support`` is importable from the checkout
# only (quoted: systemd splits an unquoted assignment at spaces).
UNIT_ENVIRONMENT = f'"PYTHONPATH={CHECKOUT}"'


def unit_command(python: str = sys.executable) -> str:
    """The head of a unit's ``ExecStart=`` that runs the stand-in; its flags follow."""
    return f"{python} -m tests.support.standin"


def log(message: str) -> None:
    """One line to stdout, flushed at once, and appended to ``$STANDIN_LOG_FILE`` when set."""
    line = f"standin[{os.getpid()}] {time.strftime('%H:%M:%S')} {message}"
    print(line, flush=True)
    path = os.environ.get("STANDIN_LOG_FILE")
    if path:
        with contextlib.suppress(OSError), open(path, "a") as f:
            f.write(line + "\n")


class StandinState:
    """What the server knows: when it started, its flags, and how many requests run right now."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.running = 0
        self.served = 0
        self.lock = threading.Lock()
        self.exit_code: int | None = None
        self.stop = threading.Event()
        self.health_mode = "ok"  # set by POST /_standin/health
        self.unhang = threading.Event()  # set when /health stops hanging
        self.model_loaded = threading.Event()  # --load-model: set once every byte was read
        if not getattr(args, "load_model", False):
            self.model_loaded.set()

    def begin(self) -> int:
        """A request starts running; its number (1, 2, ...)."""
        with self.lock:
            self.running += 1
            return self.served + self.running

    def end(self) -> None:
        """A request stops running (answered, or its client went away)."""
        with self.lock:
            self.running -= 1
            self.served += 1

    @property
    def ready(self) -> bool:
        loaded = time.monotonic() - self.started >= self.args.start_delay and self.model_loaded.is_set()
        return not self.args.never_ready and loaded

    def load_model(self) -> None:
        """Read the whole model file, as a real server does before it answers healthy."""
        total = 0
        with open(self.args.model, "rb") as f:
            while chunk := f.read(8 * 1024 * 1024):
                total += len(chunk)
        log(f"model loaded: {total} bytes in {time.monotonic() - self.started:.3f} s")
        self.model_loaded.set()


class _Handler(BaseHTTPRequestHandler):
    server_version = "gpushift-standin"
    state: StandinState  # set on the subclass made by make_server

    def log_message(self, format: str, *args: Any) -> None:
        log(f"{self.address_string()} {format % args}")

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-standin-port", str(self.state.args.port))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

    send_json = _json  # what tests.support.standin_openai calls

    def do_GET(self) -> None:
        st = self.state
        path = self.path.split("?", 1)[0]
        if path == "/health":
            if st.health_mode == "hang":
                log("/health: hanging (never answering)")
                st.unhang.wait()  # this connection gets no answer while the mode lasts
            if st.health_mode == "fail":
                self._json(500, {"status": "failing", "error": {"message": "told to fail", "code": 500}})
            elif st.ready:
                self._json(200, {"status": "ok"})
            else:
                # llama-server answers 503 while the model loads (vLLM refuses the connection).
                self._json(503, {"status": "loading", "error": {"message": "Loading model", "code": 503}})
        elif path == "/version":
            self._json(200, {"version": st.args.version})
        elif path == "/v1/models":
            self._json(200, standin_openai.models_body(st.args))
        elif path == "/metrics":
            with st.lock:
                running, served = st.running, st.served
            text = (
                "# HELP standin:requests_running Requests being answered right now.\n"
                "# TYPE standin:requests_running gauge\n"
                f"standin:requests_running {running}\n"
                "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="standin"}} {float(running)}\n'
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
                "# TYPE vllm:num_requests_waiting gauge\n"
                'vllm:num_requests_waiting{model_name="standin"} 0.0\n'
                "# HELP standin:requests_total Requests answered since start.\n"
                "# TYPE standin:requests_total counter\n"
                f"standin:requests_total {served}\n"
            )
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        else:
            self._json(404, {"error": f"no such path {path}"})

    def _control(self, body: dict[str, Any]) -> None:
        st = self.state
        if body.get("health") in ("ok", "fail", "hang"):
            st.health_mode = body["health"]
            (st.unhang.clear if st.health_mode == "hang" else st.unhang.set)()
            log(f"control: /health mode {st.health_mode}")
        self._json(200, {"ok": True})
        if "exit" in body:
            st.exit_code = int(body["exit"])
            log(f"control: exiting with status {st.exit_code}")
            st.stop.set()

    def _set_health_mode(self) -> None:
        st = self.state
        length = int(self.headers.get("Content-Length") or 0)
        try:
            mode = json.loads(self.rfile.read(length) or b"{}").get("mode")
        except (ValueError, AttributeError):
            mode = None
        if mode not in ("ok", "fail", "hang"):
            self._json(400, {"error": 'expected {"mode": "ok" | "fail" | "hang"}'})
            return
        if mode == "hang":
            st.unhang.clear()
        st.health_mode = mode
        if mode != "hang":
            st.unhang.set()
        log(f"/health mode: {mode}")
        self._json(200, {"mode": mode})

    def do_POST(self) -> None:
        st = self.state
        path = self.path.split("?", 1)[0]
        if path == "/_standin/health":
            self._set_health_mode()
            return
        if path not in ("/v1/completions", "/v1/chat/completions", "/control"):
            self._json(404, {"error": f"no such path {path}"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._json(400, {"error": "body is not JSON"})
            return
        if path == "/control":
            self._control(body)
            return
        refused = standin_openai.refusal(st.args, body)
        if refused is not None:
            self._json(*refused)
            return
        if not st.ready:
            self._json(503, {"error": "model is loading"})
            return
        if st.args.fail_completions:
            self._json(500, {"error": {"message": "engine dead (--fail-completions)", "code": 500}})
            return
        standin_openai.serve(self, st, path == "/v1/chat/completions", body, log)


def make_server(args: argparse.Namespace) -> tuple[ThreadingHTTPServer, StandinState]:
    """Bind the server (not started) with its state."""
    state = StandinState(args)
    handler = type("StandinHandler", (_Handler,), {"state": state})
    server = ThreadingHTTPServer((args.host, args.port), handler)
    server.daemon_threads = True  # in-flight requests do not hold up the exit (vLLM aborts them too)
    return server, state


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.support.standin", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--version", default="0.0.0-standin", help="what GET /version reports")
    p.add_argument("--start-delay", type=float, default=0.0, help="seconds /health answers 503 (loading)")
    p.add_argument("--exit-at-once", action="store_true", help="exit 1 immediately")
    p.add_argument("--never-ready", action="store_true", help="/health never answers 200")
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument(
        "--orphan-on-sigterm", metavar="PATH", help="on SIGTERM leave a holder of PATH outside the cgroup"
    )
    p.add_argument(
        "--orphan-pid-file", metavar="FILE", help="where --orphan-on-sigterm writes the orphan's pid"
    )
    p.add_argument(
        "--hold-device", metavar="PATH", nargs="+", action="extend", default=[], help="files to keep open"
    )
    p.add_argument("--stop-delay", type=float, default=0.0, help="seconds SIGTERM takes before the exit")
    p.add_argument("--witness", metavar="FILE", help="append what this process saw at its start to FILE")
    p.add_argument("--request-seconds", type=float, default=0.0, help="how long a completion takes")
    p.add_argument(
        "--fail-completions", action="store_true", help="/health says ok, every completion answers 500"
    )
    p.add_argument(
        "-m", "--model", metavar="PATH", help="a model file to 'load' (must exist; its head is read)"
    )
    p.add_argument(
        "--load-model",
        action="store_true",
        help="read the whole --model file before /health answers 200 (as a real server loads it)",
    )
    p.add_argument(
        "--api-key", metavar="KEY", help="accepted as vLLM's is (a credential on the command line)"
    )
    p.add_argument(
        "--served-model-name",
        metavar="NAME",
        nargs="+",
        action="extend",
        help="names /v1/models lists (vLLM)",
    )
    p.add_argument("--alias", metavar="NAME", action="append", help="a name /v1/models lists (llama-server)")
    p.add_argument("--chunks", type=int, default=3, help="content chunks of a streamed answer")
    p.add_argument("--chunk-interval", type=float, default=0.0, help="seconds between two chunks")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the stand-in until SIGTERM (or forever, with --ignore-sigterm)."""
    args = parse_args(argv)
    log(f"starting: {' '.join(sys.argv[1:] if argv is None else argv)}")
    if args.exit_at_once:
        log("exiting at once (--exit-at-once)")
        return 1
    if args.model:
        try:
            with open(args.model, "rb") as model:  # as a real server would fail on a missing model
                model.read(4096)
        except OSError as e:
            log(f"cannot load model {args.model}: {e.strerror}")
            return 1
    devices: list[BinaryIO] = []
    for path in args.hold_device:
        try:
            devices.append(open(path, "rb"))  # noqa: SIM115 - held open for the process's life on purpose
        except OSError as e:
            log(f"cannot open device {path}: {e.strerror}")
            return 1
    if devices:
        log(f"holding {' '.join(args.hold_device)}")
    if args.witness:
        # after the devices are open: two processes starting at once each see the other
        write_witness(args.witness, args.hold_device)

    stop = threading.Event()

    def on_sigterm(signum: int, frame: object) -> None:
        if args.orphan_on_sigterm:
            leave_orphan(args.orphan_on_sigterm, args.orphan_pid_file, log)
        log("SIGTERM: stopping")
        stop.set()

    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        log("ignoring SIGTERM")
    else:
        signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, lambda s, f: stop.set())

    try:
        server, state = make_server(args)
    except OSError as e:
        log(f"cannot listen on {args.host}:{args.port}: {e.strerror}")
        return 1
    # The HTTP loop looks for shutdown() every 50 ms (the default, 0.5 s, made every SIGTERM take up
    # to half a second: a backend that stops "at once" should).
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="http", daemon=True)
    thread.start()
    if args.load_model:
        threading.Thread(target=state.load_model, name="load-model", daemon=True).start()
    log(f"listening on {args.host}:{args.port}, version {args.version}, ready in {args.start_delay:g} s")
    if args.start_delay > 0 and not args.never_ready:
        ready_note = threading.Timer(args.start_delay, lambda: log("ready"))
        ready_note.daemon = True
        ready_note.start()
    while not (stop.wait(0.2) or state.stop.is_set()):
        pass
    if args.stop_delay > 0 and not state.stop.is_set():
        log(f"stopping in {args.stop_delay:g} s")
        time.sleep(args.stop_delay)
    server.shutdown()
    server.server_close()
    for f in devices:
        f.close()
    log("stopped")
    return state.exit_code if state.exit_code is not None else 0


if __name__ == "__main__":
    sys.exit(main())

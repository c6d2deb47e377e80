"""The front door under test, alone in its process: gpushift's ``FrontDoor`` with a fixed view.

Not a benchmark itself: bench/frontdoor_procs.py starts it as
``python bench/frontdoor_runner.py --config FILE --control SOCKET --active NAME`` so that the
benchmarks measure the front door's own CPU and memory (/proc/PID of this process).  It builds
``gpushift.frontdoor.core.FrontDoor`` from the config file, gives it a fixed
``gpushift.frontdoor.view.DaemonView`` in place of the daemon link (connected, ``--active`` serving,
each backend's models from the config), and calls ``serve(None)`` (it binds ``[frontdoor] listen``).

In place of the daemon's D-Bus calls, a control socket (a Unix socket, one JSON line per command,
one JSON line back) calls the core's public methods on the same event loop, as the daemon link would:

    {"op": "update", "view": {...DaemonView fields...}}   → FrontDoor.update(view)
    {"op": "close", "backend": B}                         → await FrontDoor.close(B) (in flight)
    {"op": "in_flight", "backend": B}                     → FrontDoor.in_flight(B)
    {"op": "release", "serving": S}                       → await FrontDoor.release(S) (held, longest_s)
    {"op": "status"}                                      → FrontDoor.status()

Each answer is ``{"result": ..., "took_s": x}`` or ``{"error": "..."}``.  SIGTERM stops it
(``FrontDoor.stop()``).  Its log lines (the access lines too) are JSON lines on stdout, as the front
door's command writes them off the journal.  ``--profile FILE``: cProfile over CPU time, the stats
written to FILE at the end (what bench/frontdoor_procs.py passes for ``$GPUSHIFT_FDBENCH_PROFILE``).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import importlib
import importlib.util
import json
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpushift.config.reader import load  # noqa: E402


def core(name: str) -> tuple[Any, Any]:
    """(FrontDoor, DaemonView) of the module ``name`` (``--core``; the product's by default)."""
    try:
        mod = importlib.import_module(name)
        view = (
            getattr(mod, "DaemonView", None) or importlib.import_module("gpushift.frontdoor.view").DaemonView
        )
        return mod.FrontDoor, view
    except (ImportError, AttributeError) as e:  # the front door is not in this checkout (yet)
        raise SystemExit(f"frontdoor_runner: no front door to measure in {name!r} ({e})") from None


def view_of(view_cls: Any, config: Any, fields: dict[str, Any]) -> Any:
    """A DaemonView: the daemon connected, each backend's models from the config, then ``fields``."""
    models = {name: tuple(b.models or ()) for name, b in config.backends.items()}
    base: dict[str, Any] = {"connected": True, "phase": "idle", "mode": "schedule", "models": models}
    base.update(fields)
    if "models" in fields:
        base["models"] = {k: tuple(v) for k, v in fields["models"].items()}
    return view_cls(**base)


async def command(fd: Any, view_cls: Any, config: Any, req: dict[str, Any]) -> Any:
    op = req.get("op")
    if op == "update":
        fd.update(view_of(view_cls, config, req.get("view", {})))
        return None
    if op == "close":
        return await fd.close(req["backend"])
    if op == "in_flight":
        return fd.in_flight(req["backend"])
    if op == "release":
        held, longest = await fd.release(req["serving"])
        return [held, longest]
    if op == "status":
        return fd.status()
    raise ValueError(f"unknown op {op!r}")


def log_setup() -> None:
    """Logging as the front door's own command sets it up off the journal: JSON lines on stdout
    (here the runner's log file; under systemd the journal gets the same lines as entries)."""
    try:
        logs: Any = importlib.import_module("gpushift.host.logs")
    except ImportError:  # before the front door's process had its own: the daemon's module, alone
        # (importing it through its package would load the whole daemon into this process)
        spec = importlib.util.spec_from_file_location(
            "fdbench_logs", ROOT / "gpushift" / "daemon" / "logs.py"
        )
        assert spec is not None and spec.loader is not None
        logs = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(logs)
    logs.setup("info", stream=sys.stdout)


async def main_async(args: argparse.Namespace, front_door: Any, view_cls: Any) -> None:
    config = load(args.config)
    log_setup()
    fd = front_door(config)
    fd.update(view_of(view_cls, config, {"active": args.active}))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                t0 = time.monotonic()
                try:
                    result = await command(fd, view_cls, config, json.loads(line))
                    answer: dict[str, Any] = {"result": result, "took_s": time.monotonic() - t0}
                except Exception as e:  # noqa: BLE001 - the bench shows it
                    answer = {"error": f"{type(e).__name__}: {e}"}
                writer.write(json.dumps(answer).encode() + b"\n")
                await writer.drain()
        finally:
            writer.close()

    control = await asyncio.start_unix_server(handle, path=args.control)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    serving = asyncio.create_task(fd.serve(None))  # returns once it accepts (or serves until stop)
    stopping = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if serving in done:
        serving.result()  # a listen address that could not be bound: show why
        await stopping
    control.close()
    await fd.stop()
    serving.cancel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="the gpushift config file (with a [frontdoor] table)")
    ap.add_argument("--control", required=True, help="the control socket's path (a Unix socket)")
    ap.add_argument("--active", default="a", help="the backend the fixed view says is serving")
    ap.add_argument(
        "--core",
        default="gpushift.frontdoor.core",
        help="the module whose FrontDoor (and DaemonView) to serve (default: the product's)",
    )
    ap.add_argument(
        "--profile", metavar="FILE", help="profile with cProfile (CPU time) and write its stats here"
    )
    args = ap.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # as LimitNOFILE= of the unit
    front_door, view_cls = core(args.core)  # imported before the loop starts (a module may set its policy)
    if not args.profile:
        asyncio.run(main_async(args, front_door, view_cls))
        return
    # CPU time, not wall time: on a busy machine a process waits for a core in any frame
    prof = cProfile.Profile(time.thread_time_ns, 1e-9)
    prof.enable()
    try:
        asyncio.run(main_async(args, front_door, view_cls))
    finally:
        prof.disable()
        prof.dump_stats(args.profile)


if __name__ == "__main__":
    main()

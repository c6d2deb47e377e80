"""`make demo`: gpushift end to end on any Linux machine, no GPU needed.

Boots a private systemd user manager and D-Bus session bus (tests.support.sandbox), installs the
SHIPPED units/gpushift.service with a small drop-in (paths, log file, a shared writable
directory), two demo backends (tests.support.standin HTTP servers holding SIMULATED GPU device
files), starts the daemon, switches with live progress, and prints status and the ledger.

Run from the repository root (it is not part of the installed package)::

    python -m tests.support.demo [run]     # start (idempotent: a running demo is stopped first)
    python -m tests.support.demo stop

The unit and drop-in templates here are shared with the integration tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import standin

REPO = Path(__file__).resolve().parents[2]

# Everything this drop-in changes on the shipped unit, each for the reason its comment states.
DAEMON_DROPIN = """\
[Service]
# path: the daemon comes from this checkout's virtualenv, not /usr/local/bin
ExecStart=
ExecStart={gpushift} daemon
ExecReload=
ExecReload={gpushift} reload
# group: a test host has no gpushift group (make install creates it through sysusers.d)
Group=
# environment: where this instance's config lives
Environment=GPUSHIFT_CONFIG={config}
{extra_env}
# log output: the sandbox's private journal, as on a host (the daemon sees $JOURNAL_STREAM and
# writes native entries: GPUSHIFT_TICKET=, GPUSHIFT_PHASE=, ...)
StandardOutput=journal
StandardError=journal
# paths: config, state and runtime dir live in one directory under /tmp or the checkout, so the
# daemon shares /tmp with the test and may write there under ProtectSystem=strict; every other
# hardening line of the shipped unit applies as on a host
PrivateTmp=no
ReadWritePaths={writable}
"""


def daemon_dropin(gpushift_bin: str, config: str, extra_env: Sequence[str] = ()) -> str:
    return DAEMON_DROPIN.format(
        gpushift=gpushift_bin,
        config=config,
        writable=os.path.dirname(os.path.abspath(config)),
        extra_env="\n".join(f"Environment={e}" for e in extra_env),
    )


def standin_unit(
    description: str,
    port: int,
    version: str,
    devices: Sequence[str],
    log: str,
    conflicts: Sequence[str] = (),
    args: Sequence[str] = (),
    timeout_stop_s: int = 3,
    exec_start: str | None = None,
    python: str = sys.executable,
    environment: dict[str, str] | None = None,
    extra_service: str = "",
) -> str:
    """A backend unit running the stand-in server; ``${STANDIN_*}`` are expanded by systemd.

    Its output goes to the journal; the stand-in appends its lines to ``log`` as well.
    """
    holds = " ".join(f"--hold-device {d}" for d in devices)
    cmd = (
        exec_start
        or (
            f"{standin.unit_command(python)} --port ${{STANDIN_PORT}} --version ${{STANDIN_VERSION}} "
            f"{holds} {' '.join(args)}"
        ).strip()
    )
    conflict_line = f"Conflicts={' '.join(conflicts)}\n" if conflicts else ""
    extra_env = "".join(f"Environment={k}={v}\n" for k, v in (environment or {}).items())
    return f"""\
[Unit]
Description={description}
{conflict_line}
[Service]
Type=simple
Environment=STANDIN_PORT={port}
Environment=STANDIN_VERSION={version}
Environment=PYTHONUNBUFFERED=1
Environment={standin.UNIT_ENVIRONMENT}
Environment="STANDIN_LOG_FILE={log}"
{extra_env}ExecStart={cmd}
KillMode=control-group
SendSIGKILL=yes
TimeoutStopSec={timeout_stop_s}
StandardOutput=journal
StandardError=journal
{extra_service}"""


def _demo_dir() -> Path:
    return Path(os.environ.get("GPUSHIFT_DEMO_DIR", REPO / ".demo")).resolve()


def _say(msg: str) -> None:
    print(f"\n==> {msg}", flush=True)


def stop() -> int:
    from .sandbox import Sandbox

    d = _demo_dir()
    if not (d / "sandbox.json").exists() and not any(d.glob("*.json")):
        print(f"no demo running under {d}")
        return 0
    try:
        Sandbox.attach(d).stop()
    except Exception as e:  # a half-started demo: say what happened, do not hide it
        print(f"stopping the demo under {d}: {e}", file=sys.stderr)
        return 1
    print(f"demo stopped (its files stay in {d})")
    return 0


#: Files an earlier demo left in its directory: its ledger, override and run store, the spool, the
#: backends' logs.  A new demo starts from none of them (an earlier run's hold of demo-night made
#: the new daemon reconcile to it while the demo asked for its first switch).
_EARLIER = ("state", "run", "demo-day.log", "demo-night.log", "gpushift.toml")


def _reset(d: Path) -> None:
    """Remove what an earlier demo left in ``d`` (after it was stopped), and say so."""
    left = [name for name in _EARLIER if (d / name).exists()]
    if not left:
        return
    _say(f"resetting the earlier demo's files under {d} ({', '.join(left)}): this demo starts afresh")
    for name in left:
        path = d / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def run() -> int:
    from .sandbox import Sandbox

    d = _demo_dir()
    if d.exists():
        if stop() != 0:
            print(
                f"an earlier demo under {d} could not be stopped: see above, then `make demo-stop`",
                file=sys.stderr,
            )
            return 1
        _reset(d)
    d.mkdir(parents=True, exist_ok=True)
    _say(f"booting a private systemd user manager and D-Bus session bus under {d}")
    sb = Sandbox(d).start()
    try:
        rc = _run_in(sb, d)
    except BaseException:
        _stop_failed(sb, d)
        raise
    if rc != 0:
        _stop_failed(sb, d)
    return rc


def _stop_failed(sb: Any, d: Path) -> None:
    """A demo that failed stops everything it started (the daemon, the stand-ins, the manager, the
    bus, journald); its files stay for a look."""
    print(f"\nthe demo failed: stopping what it started (its files stay in {d})", file=sys.stderr, flush=True)
    try:
        sb.stop()
    except Exception as e:
        print(f"stopping the demo failed too ({e}): run `make demo-stop`", file=sys.stderr)
        return
    print("everything the demo started is stopped; `make demo` runs it again", file=sys.stderr)


def _run_in(sb: Any, d: Path) -> int:
    """The demo's steps in a started sandbox; 0 when every one succeeded."""
    gpushift_bin = str(Path(sys.executable).parent / "gpushift")
    state = d / "state"
    broken = os.environ.get("GPUSHIFT_DEMO_BREAK") == "night"  # tests: the night backend never starts
    cfg = d / "gpushift.toml"
    simdir = state / "simgpu"
    cfg.write_text(
        f"""\
# gpushift demo config: session bus, SIMULATED GPUs (a 2x V100 16GB host)
[daemon]
bus = "session"
state_dir = "{state}"
runtime_dir = "{d / "run"}"
on_failure = "rollback"
schedule = ""                    # the demo switches by hand; see etc/gpushift/schedule

[gpu]
provider = "simulated"
simulated_gpus = 2
simulated_total_mib = 16384
release_timeout_s = 10

[backends.demo-day]
unit = "demo-day.service"
health_url = "http://127.0.0.1:18000/health"
version_url = "http://127.0.0.1:18000/version"
metrics_url = "http://127.0.0.1:18000/metrics"
start_timeout_s = 30
gpus = [0, 1]
simulated_vram_mib = 14500

[backends.demo-night]
unit = "demo-night.service"
health_url = "http://127.0.0.1:18080/health"
version_url = "http://127.0.0.1:18080/version"
metrics_url = "http://127.0.0.1:18080/metrics"
start_timeout_s = 30
gpus = [0, 1]
simulated_vram_mib = 6800
"""
    )
    devices = [str(simdir / "nvidia0"), str(simdir / "nvidia1")]
    # name, stands in for, port, version, start delay (s), the other
    for name, what, port, version, delay, other in (
        ("demo-day", "vLLM", 18000, "0.8.5-demo", 2, "demo-night"),
        ("demo-night", "llama-server", 18080, "b6143-demo", 1, "demo-day"),
    ):
        text = standin_unit(
            f'gpushift demo backend "{name}" (stand-in for {what})',
            port,
            version,
            devices,
            str(d / f"{name}.log"),
            conflicts=[f"{other}.service"],
            args=["--start-delay", str(delay)]
            + (["--exit-at-once"] if broken and name == "demo-night" else []),
        )
        sb.install_unit(f"{name}.service", text)
    sb.install_unit("gpushift.service", (REPO / "units" / "gpushift.service").read_text())
    sb.install_dropin("gpushift.service", "50-demo.conf", daemon_dropin(gpushift_bin, str(cfg)))
    sb.daemon_reload()
    _say("starting the shipped gpushift.service (Type=notify: systemd waits for READY=1)")
    r = sb.systemctl("start", "gpushift.service", check=False, timeout_s=90)
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        print(sb.journal_text("SYSLOG_IDENTIFIER=gpushift", lines=40), file=sys.stderr)
        return 1
    print(sb.systemctl("status", "gpushift.service", "--lines=0", check=False).stdout)

    env = dict(sb.env, GPUSHIFT_CONFIG=str(cfg))

    def gs(*args: str) -> int:
        print(f"$ gpushift {' '.join(args)}", flush=True)
        return subprocess.run([gpushift_bin, *args], env=env).returncode

    steps = [
        ("morning: the team's API comes up", ("switch", "demo-day", "--reason", "demo: morning")),
        (
            "evening: switch the GPUs to the night backend",
            ("switch", "demo-night", "--reason", "demo: evening"),
        ),
        ("status", ("status",)),
        ("the deployment ledger", ("ledger",)),
    ]
    for title, args in steps:
        _say(title)
        if gs(*args) not in (0,):
            print(f"demo step failed: gpushift {' '.join(args)}", file=sys.stderr)
            print(sb.journal_text("SYSLOG_IDENTIFIER=gpushift", lines=40), file=sys.stderr)
            return 1
        time.sleep(0.2)
    _say("the demo is still running")
    print(f"  try:    source {d}/env; export GPUSHIFT_CONFIG={cfg}; {gpushift_bin} status")
    print(f"  logs:   journalctl -D {d}/journal -u gpushift   (one switch: ... GPUSHIFT_TICKET=<ticket>)")
    print("  stop:   make demo-stop")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    cmd = args[0] if args else "run"
    if cmd == "run":
        return run()
    if cmd == "stop":
        return stop()
    print("usage: python -m tests.support.demo [run|stop]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

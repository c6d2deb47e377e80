"""A gpushift installation inside a private systemd user manager, for end-to-end tests.

`GpushiftEnv` writes a config (session bus, simulated GPUs), installs stand-in backend units (real
HTTP servers from `tests.support.standin` that hold simulated GPU device files), installs the SHIPPED
`units/gpushift.service` with a test drop-in, starts it, and runs the real CLI as a subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.demo import daemon_dropin, standin_unit

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
GPUSHIFT = str(VENV_BIN / "gpushift")
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Backend:
    name: str
    port: int
    gpus: list[int]
    version: str = "1.0.0"
    vram_mib: int = 6000
    args: list[str] = field(default_factory=list)  # extra stand-in flags
    start_timeout_s: float = 20.0
    timeout_stop_s: int = 3
    exec_start: str | None = None  # replaces the stand-in entirely (e.g. a missing binary)
    kind: str = "generic"
    environment: dict[str, str] = field(default_factory=dict)
    version_command: list[str] | None = None
    drain_timeout_s: float = 10.0
    extra_service: str = ""  # more [Service] lines
    extra_config: list[str] = field(default_factory=list)  # more lines of its [backends.NAME] table
    url_userinfo: str = ""  # "user:password@" in its health URL (credentials gpushift must not show)

    @property
    def unit(self) -> str:
        return f"gs-{self.name}.service"


def instances_config(
    text: str,
    members: Sequence[Backend],
    *,
    start_timeout_s: float,
    drain_timeout_s: float,
    vram_mib: int,
    name: str = "night",
    kind: str = "generic",
    lines: Sequence[str] = (),
) -> str:
    """A rig's config ``text`` with its members' own tables (the last ones, from the first member's on)
    replaced by one backend ``name`` of ``kind`` whose ``instances`` are the members' units, each with
    its own health URL and GPUs; ``lines`` are more keys of that table."""
    head, _, _tables = text.partition(f"\n[backends.{members[0].name}]")
    table = ["", f"[backends.{name}]", f'kind = "{kind}"', "instances = ["]
    table += [
        f'  {{ unit = "{b.unit}", health_url = "http://127.0.0.1:{b.port}/health", gpus = {json.dumps(b.gpus)} }},'
        for b in members
    ]
    table += [
        "]",
        *lines,
        f"start_timeout_s = {start_timeout_s}",
        f"drain_timeout_s = {drain_timeout_s}",
        f"simulated_vram_mib = {vram_mib}",
    ]
    return head + "\n".join(table) + "\n"


class GpushiftEnv:
    """One daemon, its config and its backends inside a Sandbox."""

    def __init__(self, sandbox: Any, base: Path, backends: list[Backend], **daemon_opts: Any) -> None:
        self.sb = sandbox
        self.base = base
        self.backends = {b.name: b for b in backends}
        self.state_dir = base / "state"
        self.runtime_dir = base / "run"
        self.simdir = self.state_dir / "simgpu"
        self.config_path = base / "gpushift.toml"
        self.opts = {
            "on_failure": "rollback",
            "release_timeout_s": 3,
            "residual_mib": 256,
            "simulated_release_delay_s": 0.3,
            "simulated_foreign_mib": 9318,
            "poll_interval_s": 0.2,
            "reconcile_interval_s": 30,
        }
        self.opts.update(daemon_opts)
        self.extra_env: list[str] = []
        # False: the backend units carry no Conflicts= (the soak: one backend at a time is then
        # gpushift's doing alone, not systemd's)
        self.conflicts = True
        # Red/green checks: run the daemon and the CLI from another checkout of gpushift (e.g. the
        # code before a change) while the tests stay these ones.
        self.product_path = os.environ.get("GPUSHIFT_TEST_PRODUCT_PATH")
        if self.product_path:
            self.extra_env.append(f"PYTHONPATH={self.product_path}")
        self.gpushift = GPUSHIFT  # the command the unit and the CLI calls run (another install's, in a test)
        # Every daemon of the integration tests serves /metrics, on a port of its own (not when the
        # daemon is another checkout's, which may not know [metrics]); a test may turn it off
        # (metrics_listen="") or add a textfile (metrics_textfile=PATH).
        default_listen = "" if self.product_path else f"127.0.0.1:{free_port()}"
        self.metrics_listen = str(self.opts.get("metrics_listen", default_listen))

    # ------------------------------------------------------------ setup

    def config_text(self) -> str:
        o = self.opts
        lines = [
            "[daemon]",
            'bus = "session"',
            f'state_dir = "{self.state_dir}"',
            f'runtime_dir = "{self.runtime_dir}"',
            f'on_failure = "{o["on_failure"]}"',
            f"poll_interval_s = {o['poll_interval_s']}",
            # gpushift waits for a stop job longer than any unit's TimeoutStopSec= (systemd kills first)
            f"stop_timeout_s = {max([30, *(b.timeout_stop_s + 15 for b in self.backends.values())])}",
            f"reconcile_interval_s = {o['reconcile_interval_s']}",
        ]
        if "sample_interval_s" in o:  # else the daemon's default
            lines.append(f"sample_interval_s = {o['sample_interval_s']}")
        lines.append(f'schedule = "{o.get("schedule") or ""}"')
        lines += list(o.get("daemon_lines") or [])  # more [daemon] keys
        lines += [
            "",
            "[gpu]",
            'provider = "simulated"',
            "simulated_gpus = 2",
            "simulated_total_mib = 16384",
            f"residual_mib = {o['residual_mib']}",
            f"release_timeout_s = {o['release_timeout_s']}",
            f"simulated_release_delay_s = {o['simulated_release_delay_s']}",
            f"simulated_foreign_mib = {o['simulated_foreign_mib']}",
        ]
        if self.metrics_listen or o.get("metrics_textfile"):
            lines += ["", "[metrics]", f'listen = "{self.metrics_listen}"']
            if o.get("metrics_textfile"):
                lines += [f'textfile = "{o["metrics_textfile"]}"', "textfile_interval_s = 60"]
        for b in self.backends.values():
            lines += [
                "",
                f"[backends.{b.name}]",
                f'unit = "{b.unit}"',
                f'kind = "{b.kind}"',
                f'health_url = "http://{b.url_userinfo}127.0.0.1:{b.port}/health"',
            ]
            if b.kind == "generic":  # the real kinds bring their own endpoints
                if not b.version_command:  # a version URL would be asked instead of the command
                    lines.append(f'version_url = "http://127.0.0.1:{b.port}/version"')
                lines.append(f'metrics_url = "http://127.0.0.1:{b.port}/metrics"')
            if b.version_command:
                lines.append(f"version_command = {json.dumps(b.version_command)}")
            lines += [
                f"start_timeout_s = {b.start_timeout_s}",
                f"drain_timeout_s = {b.drain_timeout_s}",
                f"gpus = {json.dumps(b.gpus)}",
                f"simulated_vram_mib = {b.vram_mib}",
                *b.extra_config,
            ]
        return "\n".join(lines) + "\n"

    def unit_text(self, b: Backend) -> str:
        return standin_unit(
            f"gpushift test backend {b.name} (stand-in)",
            b.port,
            b.version,
            [str(self.simdir / f"nvidia{i}") for i in b.gpus],
            str(self.base / f"{b.name}.log"),
            conflicts=self.unit_conflicts(b),
            args=[a.format(simdir=self.simdir) for a in b.args],
            timeout_stop_s=b.timeout_stop_s,
            exec_start=b.exec_start,
            environment=b.environment,
            extra_service=b.extra_service,
        )

    def unit_conflicts(self, b: Backend) -> list[str]:
        """The units ``b``'s unit has ``Conflicts=`` with: every other backend's (none when
        ``conflicts`` is off)."""
        return [o.unit for o in self.backends.values() if o.name != b.name] if self.conflicts else []

    def write_config(self, text: str | None = None) -> None:
        self.config_path.write_text(text if text is not None else self.config_text())

    def install(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.write_config()
        for b in self.backends.values():
            self.sb.install_unit(b.unit, self.unit_text(b))
        self.sb.install_unit("gpushift.service", (REPO / "units" / "gpushift.service").read_text())
        self.sb.install_dropin(
            "gpushift.service",
            "50-test.conf",
            daemon_dropin(self.gpushift, str(self.config_path), self.extra_env),
        )
        self.sb.daemon_reload()

    def start_daemon(self) -> None:
        r = self.sb.systemctl("start", "gpushift.service", check=False, timeout_s=90)
        if r.returncode != 0:
            raise AssertionError(
                f"gpushift.service did not start: {r.stderr}\n--- daemon log:\n{self.daemon_log()}"
            )

    def up(self) -> GpushiftEnv:
        self.install()
        self.start_daemon()
        return self

    # ------------------------------------------------------------ using it

    def cli(
        self, *args: str, timeout_s: float = 120, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        env = dict(self.sb.env)
        if self.product_path:
            env["PYTHONPATH"] = self.product_path
        env["GPUSHIFT_CONFIG"] = str(self.config_path)
        r = subprocess.run([self.gpushift, *args], env=env, capture_output=True, text=True, timeout=timeout_s)
        if check and r.returncode != 0:
            raise AssertionError(
                f"gpushift {' '.join(args)} exited {r.returncode}\nstdout: {r.stdout}\nstderr: {r.stderr}"
                f"\n--- daemon log:\n{self.daemon_log()[-4000:]}"
            )
        return r

    def cli_popen(self, *args: str) -> subprocess.Popen[str]:
        env = dict(self.sb.env)
        if self.product_path:
            env["PYTHONPATH"] = self.product_path
        env["GPUSHIFT_CONFIG"] = str(self.config_path)
        return subprocess.Popen(
            [self.gpushift, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def status(self) -> dict[str, Any]:
        r = self.cli("status", "--json")
        try:
            return dict(json.loads(r.stdout))
        except ValueError:
            raise AssertionError(f"status --json printed no JSON: {r.stdout!r} {r.stderr!r}") from None

    def ledger(self) -> list[dict[str, Any]]:
        r = self.cli("ledger", "--json", "--limit", "50", check=True)
        return list(json.loads(r.stdout))

    def ledger_row(self, row_id: int) -> dict[str, Any]:
        r = self.cli("ledger", "show", str(row_id), "--json", check=True)
        return dict(json.loads(r.stdout))

    def metrics_url(self) -> str:
        host, _, port = self.metrics_listen.rpartition(":")
        return f"http://{host}:{port}/metrics"

    def active_state(self, unit: str) -> str:
        return self.sb.show(unit, "ActiveState")["ActiveState"]

    def main_pid(self, unit: str) -> int:
        return int(self.sb.show(unit, "MainPID")["MainPID"])

    def daemon_journal(self, *matches: str) -> list[dict[str, Any]]:
        """The daemon's journal entries that also fit ``matches``.

        Matched by ``SYSLOG_IDENTIFIER=gpushift`` (its own entries, and what it prints, named after
        its command), not by unit: a daemon that refuses to start has exited before journald reads
        its cgroup, and its lines carry no ``_SYSTEMD_UNIT``.
        """
        return list(self.sb.journal("SYSLOG_IDENTIFIER=gpushift", *matches))

    def daemon_log(self) -> str:
        """The daemon's log, one line per journal entry: a structured entry as the JSON object it
        was logged as (``GPUSHIFT_TICKET`` → ``"ticket"``, PRIORITY → ``"level"``; values as the journal
        holds them, i.e. text), anything it printed as it was printed."""
        try:
            entries = self.daemon_journal()
        except Exception as e:  # an assertion message must not hide the failure it reports
            return f"(no daemon log: {e})"
        return "\n".join(log_line(e) for e in entries) or "(no daemon log)"

    def kill_daemon(self, timeout_s: float = 40) -> int:
        """SIGKILL the daemon and wait until systemd has restarted it (its unit active again under
        another PID); returns the killed PID."""
        pid = int(self.sb.show("gpushift.service", "MainPID")["MainPID"])
        os.kill(pid, signal.SIGKILL)
        self.wait_for(
            lambda: (
                self.sb.show("gpushift.service", "MainPID")["MainPID"] not in ("0", str(pid))
                and self.active_state("gpushift.service") == "active"
            ),
            timeout_s,
            "systemd to restart the daemon",
        )
        return pid

    def wait_for(self, predicate: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}\n{self.daemon_log()[-3000:]}")

    def hold_device(self, gpu: int) -> subprocess.Popen[bytes]:
        """A foreign process (outside every backend unit) holding a simulated GPU."""
        return subprocess.Popen(
            [PY, "-m", "gpushift.host.simgpu", "hold", str(self.simdir / f"nvidia{gpu}")],
            start_new_session=True,
        )


_LEVEL = {"7": "debug", "6": "info", "5": "notice", "4": "warning", "3": "error", "2": "critical"}


def log_line(entry: dict[str, Any]) -> str:
    """One journal entry as a line of text (see :meth:`GpushiftEnv.daemon_log`)."""

    def text(v: Any) -> Any:
        if isinstance(v, list) and all(isinstance(x, int) for x in v):  # binary data: its bytes
            return bytes(v).decode("utf-8", "replace")
        return v

    if "GPUSHIFT_EVENT" not in entry:
        return str(text(entry.get("MESSAGE", "")))
    line: dict[str, Any] = {"event": text(entry["GPUSHIFT_EVENT"])}
    line["level"] = _LEVEL.get(str(entry.get("PRIORITY")), str(entry.get("PRIORITY")))
    for key, value in entry.items():
        if key.startswith("GPUSHIFT_") and key != "GPUSHIFT_EVENT":
            line[key[len("GPUSHIFT_") :].lower()] = text(value)
    return json.dumps(line)


def end(proc: subprocess.Popen[Any]) -> None:
    """Stop a process this test started (by PID), even when it ignores SIGTERM."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def env_dirs(tmp_root: str) -> Path:
    p = Path(tmp_root)
    p.mkdir(parents=True, exist_ok=True)
    os.chmod(p, 0o755)
    return p

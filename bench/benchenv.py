"""gpushift as a deployment runs it, inside a private systemd user manager, for the benchmarks.

The shipped ``units/gpushift.service`` with the test drop-in (``tests/integration/gpushift_env.py``:
the checkout's virtualenv, a log file, the hardening a container cannot do turned off), two
stand-in backends (``tests/support/standin.py``: real HTTP servers holding simulated GPU device
files, found by the same /proc fd scan as on a real GPU), on a private session bus
(``tests/support/sandbox.py``).  The config leaves every timing at the daemon's DEFAULT (poll
interval, sample interval, timeouts): only what a benchmark must set is written — the session bus,
its directories, the simulated GPUs, the backends, and the lines a benchmark adds.

Each backend unit also gets ``StartLimitIntervalSec=0``: a benchmark starts the same unit more
often than systemd's default start limit (5 starts in 10 s) allows.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # tests.support and tests.integration live in the checkout
    sys.path.insert(0, str(ROOT))

from benchdoc import bytecode_cached  # noqa: E402

from tests.integration.gpushift_env import Backend, GpushiftEnv, free_port  # noqa: E402
from tests.support.sandbox import Sandbox, SandboxError, missing_tools  # noqa: E402

#: Both backends use both simulated GPUs (a whole-host swap, as vLLM by day and llama by night).
GPUS = [0, 1]


class BenchEnv(GpushiftEnv):
    """A :class:`GpushiftEnv` whose config keeps the daemon's defaults (see the module's docstring)."""

    def __init__(
        self,
        sandbox: Sandbox,
        base: Path,
        backends: list[Backend],
        gpu_lines: Sequence[str] = (),
        daemon_lines: Sequence[str] = (),
        extra_config: Sequence[str] = (),
        schedule: str = "",
    ) -> None:
        super().__init__(sandbox, base, backends)
        self.gpu_lines = list(gpu_lines)
        self.daemon_lines = list(daemon_lines)
        self.extra_config = list(extra_config)
        self.schedule = schedule

    def config_text(self) -> str:
        lines = [
            "[daemon]",
            'bus = "session"',
            f'state_dir = "{self.state_dir}"',
            f'runtime_dir = "{self.runtime_dir}"',
            f"schedule = {json.dumps(self.schedule)}",
            *self.daemon_lines,
            "",
            "[gpu]",
            'provider = "simulated"',
            f"simulated_gpus = {len(GPUS)}",
            *self.gpu_lines,
        ]
        for b in self.backends.values():
            origin = f"http://127.0.0.1:{b.port}"
            lines += [
                "",
                f"[backends.{b.name}]",
                f'unit = "{b.unit}"',
                'kind = "generic"',
                f'health_url = "{origin}/health"',
                f'version_url = "{origin}/version"',
                f'metrics_url = "{origin}/metrics"',
                f"gpus = {json.dumps(b.gpus)}",
                f"simulated_vram_mib = {b.vram_mib}",
                *b.extra_config,
            ]
        if self.extra_config:
            lines += ["", *self.extra_config]
        return "\n".join(lines) + "\n"

    def install(self) -> None:
        super().install()
        for b in self.backends.values():
            self.sb.install_dropin(b.unit, "50-bench.conf", "[Unit]\nStartLimitIntervalSec=0\n")
        self.sb.daemon_reload()

    def cli_env(self) -> dict[str, str]:
        """The environment a measured CLI run gets: the sandbox's bus, this config, byte-code cached."""
        env = dict(self.sb.env)
        env["GPUSHIFT_CONFIG"] = str(self.config_path)
        if self.product_path:  # GPUSHIFT_TEST_PRODUCT_PATH: another checkout's gpushift (the daemon's too)
            env["PYTHONPATH"] = self.product_path
        return bytecode_cached(env, self.base / "pycache")

    def product(self) -> str:
        """Which gpushift runs: this checkout's, or the one ``GPUSHIFT_TEST_PRODUCT_PATH`` names."""
        return f"the gpushift in {self.product_path}" if self.product_path else "this checkout's gpushift"

    def daemon_pid(self) -> int:
        return self.main_pid("gpushift.service")

    def settle(self, *active: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """Wait until the daemon answers ``status``, idle (no switch in flight) and, when backends are
        named, with one of them serving; return that status."""
        deadline = time.monotonic() + timeout_s
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            r = self.cli("status", "--json")
            with contextlib.suppress(ValueError):
                last = json.loads(r.stdout)
            d = last.get("daemon") or {}
            if d.get("running") and d.get("state") == "idle" and (not active or last.get("active") in active):
                return last
            time.sleep(0.2)
        raise SystemExit(
            f"the daemon did not settle within {timeout_s:g} s: {last}\n{self.daemon_log()[-3000:]}"
        )


def backends(start_delay_s: float) -> list[Backend]:
    """Backends ``a`` and ``b`` (stand-ins answering healthy ``start_delay_s`` after they start)."""
    args = ["--start-delay", f"{start_delay_s:g}"]
    return [
        Backend("a", free_port(), list(GPUS), version="1.0.0", vram_mib=14500, args=list(args)),
        Backend("b", free_port(), list(GPUS), version="2.0.0", vram_mib=6800, args=list(args)),
    ]


@contextlib.contextmanager
def running(env_factory: Any, **sandbox_opts: Any) -> Iterator[BenchEnv]:
    """Boot a sandbox, build the env with ``env_factory(sandbox, base)``, start the daemon; stop all after.

    ``sandbox_opts`` go to :class:`Sandbox` (``bus_limits=SYSTEM_BUS_LIMITS``: the system bus's limits).
    Fails with a message naming what is missing when systemd or D-Bus cannot be used here.
    """
    missing = missing_tools()
    if missing:
        raise SystemExit(
            "this benchmark needs a systemd user manager and D-Bus: missing " + ", ".join(missing)
        )
    base = Path(tempfile.mkdtemp(prefix="gpushift-bench-"))
    os.chmod(base, 0o755)
    sb = Sandbox(**sandbox_opts)
    try:
        try:
            sb.start()
        except SandboxError as e:
            raise SystemExit(f"could not boot the private systemd user manager: {e}") from None
        env: BenchEnv = env_factory(sb, base)
        env.up()
        yield env
    finally:
        sb.stop()
        subprocess.run(["rm", "-rf", str(base)], check=False)

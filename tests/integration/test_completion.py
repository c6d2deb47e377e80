"""Completion as a person meets it: a real interactive bash on a pty, the completion script that
``make build`` ships (click's ``_GPUSHIFT_COMPLETE=bash_source``) loaded, and ``<TAB><TAB>`` typed
after ``gpushift switch`` and ``gpushift ledger --backend``: the configured backend names appear."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

GPUSHIFT_DIR = str(Path(sys.executable).parent)

CONFIG = """\
[daemon]
bus = "session"
[gpu]
provider = "simulated"
[backends.vllm-day]
unit = "gs-vllm-day.service"
health_url = "http://127.0.0.1:1/health"
[backends.llama-night]
unit = "gs-llama-night.service"
health_url = "http://127.0.0.1:2/health"
"""


class Bash:
    """An interactive bash on a pty (no rc files), ended by PID."""

    def __init__(self, env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            ["bash", "--norc", "--noprofile", "-i"],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            close_fds=True,
        )
        os.close(slave)
        self.seen = b""

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def read_until(self, wanted: bytes, timeout_s: float = 30.0) -> bytes:
        deadline = time.monotonic() + timeout_s
        while wanted not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"bash never printed {wanted!r}; it printed:\n{self.seen.decode(errors='replace')}"
                )
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    self.seen += os.read(self.master, 65536)
                except OSError:
                    break
        return self.seen

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
        os.close(self.master)


def test_bash_completes_backend_names_from_the_config(tmp_path: Path) -> None:
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text(CONFIG)
    script = subprocess.run(
        [f"{GPUSHIFT_DIR}/gpushift"],
        env=dict(os.environ, _GPUSHIFT_COMPLETE="bash_source"),
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "_gpushift_completion" in script
    (tmp_path / "gpushift.bash").write_text(script)
    env = dict(
        os.environ,
        PATH=f"{GPUSHIFT_DIR}:{os.environ['PATH']}",
        GPUSHIFT_CONFIG=str(cfg),
        PS1="READY> ",
        TERM="dumb",
        HOME=str(tmp_path),
    )
    bash = Bash(env)
    try:
        bash.type(f"source {tmp_path / 'gpushift.bash'}; echo LOADED\n")
        bash.read_until(b"LOADED\r\n")
        start = len(bash.seen)
        bash.type("gpushift switch \t\t")
        bash.read_until(b"llama-night")
        shown = bash.seen[start:].decode(errors="replace")
        assert "vllm-day" in shown and "off" in shown, shown
        bash.type("\x15")  # ctrl-u: a fresh line
        start = len(bash.seen)
        bash.type("gpushift ledger --backend vl\t")
        bash.read_until(b"vllm-day")  # one match: bash completes it in place
        # an unreadable config completes nothing and prints nothing
        bash.type("\x15")
        start = len(bash.seen)
        bash.type(f"GPUSHIFT_CONFIG={tmp_path}/missing.toml gpushift switch \t\techo DONE\n")
        out = bash.read_until(b"DONE").decode(errors="replace")[start:]
        assert "Traceback" not in out and "Error" not in out, out
    finally:
        bash.close()

"""A hook that prints 200 MB, on the real daemon (issue 20, point 8): its output is capped while it
runs — nothing of it lands in ``runtime_dir`` (a tmpfs ``/run`` on a real host, which the output
file used to fill until the hook ended) — and the switch's ledger row keeps its end, after a note
of its whole size.

The hook says when it has printed everything (a file) and then waits for the test's word (another
file) before it ends: the runtime directory is sampled while the hook certainly runs, with all of
its output written, whatever the machine's speed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpushift_env import Backend, GpushiftEnv, end, free_port

from gpushift.host.hookunits import KEPT_BYTES, OUTPUT_CHARS

FLOOD_BYTES = 200 * 1000 * 1000
LAST_LINE = "END OF THE FLOOD"
#: What the runtime directory may hold besides the cap (the daemon's own small files).
MARGIN_BYTES = 1024 * 1024

FLOODER = f"""#!/bin/sh
d="$1"
yes "a hook that will not stop talking, line after line after line" 2>/dev/null | head -c {FLOOD_BYTES}
touch "$d/printed"
i=0
while [ ! -e "$d/release" ] && [ "$i" -lt 1800 ]; do sleep 0.1; i=$((i + 1)); done
echo "{LAST_LINE}"
"""


@pytest.fixture
def hook_dir() -> Iterator[Path]:
    """The script, and a directory its user (nobody) may write its signal to."""
    d = Path(tempfile.mkdtemp(prefix="gs-flood-", dir=os.environ.get("GPUSHIFT_TEST_TMP", "/tmp")))
    try:
        d.chmod(0o755)
        (d / "sig").mkdir()
        (d / "sig").chmod(0o777)
        (d / "flood").write_text(FLOODER)
        (d / "flood").chmod(0o755)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def tree_bytes(root: Path) -> int:
    """Bytes of every file under ``root`` (a file removed while it is walked counts nothing)."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def test_a_hook_printing_200_mb_is_capped_while_it_runs(sandbox: Any, hook_dir: Path) -> None:
    base = Path(sandbox.base_dir) / "gs"
    base.mkdir(parents=True, exist_ok=True)
    a = Backend("a", free_port(), [0, 1], version="1.0.0", vram_mib=6000)
    env = GpushiftEnv(sandbox, base, [a])
    plain = env.config_text
    hooks = f'\n[hooks]\nafter_ready = {{ argv = ["{hook_dir / "flood"}", "{hook_dir / "sig"}"], timeout_s = 300 }}\n'
    env.config_text = lambda: plain() + hooks  # type: ignore[method-assign]
    env.up()
    pid = env.main_pid("gpushift.service")

    client = env.cli_popen("switch", "a", "--reason", "flood")
    try:
        peak, deadline = 0, time.monotonic() + 240
        while not (hook_dir / "sig" / "printed").exists():
            assert client.poll() is None, client.communicate()
            assert time.monotonic() < deadline, (
                f"the hook never finished printing\n{env.daemon_log()[-3000:]}"
            )
            peak = max(peak, tree_bytes(env.runtime_dir))
            time.sleep(0.05)
        # Everything is printed and the hook still runs: what the runtime directory holds now is
        # what the output costs it.
        for _ in range(10):
            peak = max(peak, tree_bytes(env.runtime_dir))
            time.sleep(0.05)
        assert peak <= KEPT_BYTES + MARGIN_BYTES, f"runtime_dir held {peak} bytes while the hook ran"
        (hook_dir / "sig" / "release").touch()
        out, err = client.communicate(timeout=180)
    finally:
        end(client)
    assert client.returncode == 0, f"{out}\n{err}\n{env.daemon_log()[-3000:]}"

    row = env.ledger_row(env.ledger()[0]["id"])
    (hook,) = row["extra"]["hooks"]
    assert (hook["event"], hook["result"], hook["exit_status"]) == ("after_ready", "success", 0), hook
    output = hook["output"]
    whole = FLOOD_BYTES + len(LAST_LINE) + 1
    assert output.startswith(f"[gpushift: {whole} bytes of output in all; the last"), output[:200]
    assert output.rstrip("\n").endswith(LAST_LINE), output[-200:]
    assert len(output) <= OUTPUT_CHARS + 100
    assert env.main_pid("gpushift.service") == pid
    assert env.sb.show("gpushift.service", "NRestarts")["NRestarts"] == "0"
    assert tree_bytes(env.runtime_dir) <= MARGIN_BYTES

"""A port impostor cannot make a switch "ok" nor a backend healthy (issue 20, point 2).

The shipped gpushift.service under a private systemd user manager, two stand-in backends ``a`` and
``b``.  An impostor — a plain process of user ``nobody`` started by the test, outside every unit of
the manager — binds ``b``'s port while a switch ``a`` → ``b`` stops ``a``, and answers 200 on every
path with a version of its own choosing.  ``b``'s own server then cannot bind its port (it sets up
for a few seconds first, as vLLM does, then exits).

Before the check (fac402f) the switch believed the impostor: it exited 0, the ledger recorded an
``ok`` launch of ``b`` with the impostor's version, and nothing was serving once ``b`` exited.  Now
the readiness poll finds that the server end of its connection is held outside ``gs-b.service``'s
cgroup: the start fails naming the impostor (PID, user, command, cgroup), the rollback brings
``a`` back, and no ``ok`` row carries the impostor's version.  The second test starts ``b`` by hand
while the impostor holds its port: ``status`` never shows ``b`` as healthy, and names the impostor.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from gpushift_env import Backend, GpushiftEnv, free_port

from tests.support import impostor

FAKE_VERSION = impostor.VERSION


def two_backends(sandbox: Any, b_args: list[str]) -> tuple[GpushiftEnv, Backend, Backend]:
    # a takes 2 s to stop (the window in which the impostor binds), b sets up before it binds.
    a = Backend("a", free_port(), [0, 1], args=["--stop-delay", "2"], timeout_stop_s=10)
    b = Backend("b", free_port(), [1], version="2.0.0", args=b_args, start_timeout_s=30)
    env = GpushiftEnv(sandbox, Path(sandbox.base_dir) / "gs", [a, b]).up()
    env.cli("switch", "a", "--reason", "setup", check=True)
    return env, a, b


def test_an_impostor_on_the_target_port_fails_the_switch_and_the_rollback_brings_the_previous_back(
    sandbox: Any, procs: list[subprocess.Popen[str]]
) -> None:
    impostor.require_root()
    env, a, b = two_backends(sandbox, ["--bind-delay", "5"])
    client = env.cli_popen("switch", "b", "--reason", "impostor test")
    procs.append(client)
    # The impostor binds b's port after the preflight, while a's stop job lasts.
    env.wait_for(lambda: env.active_state(a.unit) == "deactivating", 60, f"{a.unit} to be stopping")
    pid, said = impostor.listening(procs, b.port, env)
    try:
        out, err = client.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the switch did not end\n{env.daemon_log()[-3000:]}") from None
    log = env.daemon_log()[-4000:]
    assert client.returncode != 0, (
        f"the switch to b ended ok with an impostor on its port\n{out}\n{err}\n{log}"
    )

    rows = env.ledger()
    assert not [r for r in rows if r["outcome"] == "ok" and r.get("backend_version") == FAKE_VERSION], rows
    assert not [r for r in rows if r["outcome"] == "ok" and r["to"] == "b"], rows
    row = env.ledger_row(next(r["id"] for r in rows if r["to"] == "b"))
    assert row["outcome"] == "rolled_back" and row["failed_phase"] == "ready", row
    # The failure names the impostor: its PID, its user, its command; the row keeps the facts.
    assert f"PID {pid}" in row["message"] and "user nobody" in row["message"], row["message"]
    assert "python" in row["message"] and b.unit in row["message"], row["message"]
    foreign = row["extra"]["foreign_answer"]
    assert [p["pid"] for p in foreign["peers"]] == [pid] and foreign["uid"] == 65534, foreign
    assert foreign["expected_cgroup"].endswith("/" + b.unit), foreign
    assert f"PID {pid}" in out + err, (out, err)

    # The previous backend serves again, from its own unit; status says so, not the impostor.
    assert env.active_state(a.unit) == "active" and env.active_state(b.unit) != "active"
    assert impostor.version_of(a.port) == "1.0.0"
    st = env.status()
    assert st["active"] == "a", st
    assert st["backends"]["a"]["health"]["ok"] is True, st["backends"]["a"]
    # Nothing was sent to the impostor but connections: a request is checked before it is sent.
    assert not [line for line in said.lines if line.startswith(("GET", "POST"))], said.lines


def test_status_never_shows_an_impostor_as_the_backend_s_health(
    sandbox: Any, procs: list[subprocess.Popen[str]]
) -> None:
    impostor.require_root()
    # b sets up for longer than the test lasts: its unit is active, its port the impostor's.
    env, a, b = two_backends(sandbox, ["--bind-delay", "600"])
    pid, said = impostor.listening(procs, b.port, env)
    env.sb.systemctl("start", b.unit, check=True)  # a person starts b (Conflicts= stops a)

    def b_health() -> dict[str, Any] | None:
        h: dict[str, Any] | None = env.status()["backends"]["b"].get("health")
        return h if h is not None and h.get("age_s", 99) < 5 else None

    env.wait_for(lambda: b_health() is not None, 60, "status to show b's health")
    deadline = time.monotonic() + 5  # several sampling periods: never healthy
    while time.monotonic() < deadline:
        st = env.status()
        h = st["backends"]["b"]["health"]
        assert h["ok"] is False and st["active"] != "b", st
        assert h["foreign"]["peers"][0]["pid"] == pid and f"PID {pid}" in h["detail"], h
        time.sleep(0.5)
    assert env.active_state(b.unit) == "active"
    assert not [line for line in said.lines if line.startswith(("GET", "POST"))], said.lines

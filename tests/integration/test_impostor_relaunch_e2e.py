"""A port impostor between switches cannot leave the host serving nothing (issue 20, point 2).

The shipped gpushift.service under a private systemd user manager, two stand-in backends ``a`` and
``b``; ``b`` served, then ``a`` (the test's setup switches ``b`` then ``a``).  ``a`` is killed
(SIGKILL: it exits by itself, a crash), and an impostor — a plain process of user ``nobody``,
outside every unit of the manager, started and ended by the test by PID — binds ``a``'s port and
answers 200 on every path.  Every relaunch of ``a`` then fails: the preflight refuses it (the port
is taken by a process that is no backend), or its readiness check finds the impostor on the port,
or ``a``'s own server exits, its port taken.

The rule (docs/reliability.md, the port impostor between switches): after ``max_attempts`` failed
relaunches, with ``on_failure = "rollback"``, the keeper switches to the backend that served before
the crashed one — a ledger row of its own (trigger ``rollback``) whose reason names the failed
relaunches — and ``status`` says so.  No row is ``ok`` for the impostor's answers.  Before this rule
the keeper gave up after ``max_attempts`` and nothing served until a person acted.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from gpushift_env import Backend, GpushiftEnv, free_port

from tests.support import impostor

MAX_ATTEMPTS = 2


def rows(env: GpushiftEnv, **match: Any) -> list[dict[str, Any]]:
    return [r for r in env.ledger() if all(r.get(k) == v for k, v in match.items())]


def test_relaunches_failing_on_an_impostor_fall_back_to_the_backend_that_served_before(
    sandbox: Any, procs: list[subprocess.Popen[str]]
) -> None:
    impostor.require_root()
    # a sets up for 8 s before it binds (as vLLM does): the impostor binds first after a's death,
    # even when a relaunch starts before it (then it fails on the impostor's answer or its own exit).
    a = Backend("a", free_port(), [0, 1], args=["--bind-delay", "8"], start_timeout_s=40)
    b = Backend("b", free_port(), [1], version="2.0.0")
    lines = [f"max_attempts = {MAX_ATTEMPTS}", "retry_after_s = 1"]
    env = GpushiftEnv(
        sandbox, Path(sandbox.base_dir) / "gs", [a, b], reconcile_interval_s=2, daemon_lines=lines
    ).up()
    env.cli("switch", "b", "--reason", "setup: b serves first", check=True)
    env.cli("switch", "a", "--reason", "setup: then a", check=True)
    setup_ids = {r["id"] for r in env.ledger()}

    os.kill(env.main_pid(a.unit), signal.SIGKILL)  # a dies by itself
    env.wait_for(lambda: env.active_state(a.unit) != "active", 30, f"{a.unit} to be down")
    pid, said = impostor.listening(procs, a.port, env)

    def fell_back() -> bool:
        return bool([r for r in rows(env, to="b", outcome="ok") if r["id"] not in setup_ids])

    env.wait_for(fell_back, 240, "the keeper to bring b back after a's failed relaunches")
    new = [r for r in env.ledger() if r["id"] not in setup_ids]
    log = env.daemon_log()[-4000:]
    assert [r["outcome"] for r in new if r["to"] != "b"].count("crashed") == 1, (new, log)
    relaunches = [r for r in new if r["to"] == "a" and r["trigger"] == "recovery"]
    assert len(relaunches) == MAX_ATTEMPTS, (new, log)
    # Each was refused (the preflight sees the port taken by a process that is no backend), or
    # failed on the impostor's answer or on a's exit (its port taken), whichever came first.
    assert all(r["outcome"] in ("refused", "failed") for r in relaunches), relaunches
    for r in relaunches:
        full = env.ledger_row(r["id"])
        assert full["failed_phase"] in ("preflight", "start", "ready"), full
    # No ok row for the impostor's answers: none for a since its crash, none with its version.
    assert not [r for r in new if r["outcome"] == "ok" and r["to"] == "a"], new
    every = env.ledger()
    assert not [r for r in every if r["outcome"] == "ok" and r.get("backend_version") == impostor.VERSION]

    # The fallback is a row of its own, its reason naming the failed relaunches of a.
    (back,) = [r for r in new if r["to"] == "b"]
    assert back["trigger"] == "rollback" and back["outcome"] == "ok", back
    full = env.ledger_row(back["id"])
    assert f"{MAX_ATTEMPTS} failed relaunches of a" in full["reason"], full
    assert full["backend_version"] == "2.0.0", full

    # b serves from its own unit; status says b serves and why a does not.
    assert env.active_state(b.unit) == "active" and env.active_state(a.unit) != "active"
    assert impostor.version_of(b.port) == "2.0.0"
    env.wait_for(lambda: env.status()["active"] == "b", 30, "status to show b serving")
    st = env.status()
    assert "fell back to b" in (st.get("blocked") or ""), st
    assert st["relaunch"]["backend"] == "a" and st["relaunch"]["fell_back_to"] == "b", st
    text = env.cli("status").stdout
    assert "fell back to b" in text, text
    # Nothing was sent to the impostor but connections: a request is checked before it is sent.
    assert not [line for line in said.lines if line.startswith(("GET", "POST"))], said.lines
    assert pid > 0

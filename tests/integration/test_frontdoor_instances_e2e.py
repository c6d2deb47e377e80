"""Issue 23's second acceptance, end to end: a backend of two instances behind the real front door.

The shipped gpushift.service (a real systemd user manager) switches "night", two stand-in units
``gs-night0.service`` (GPU 0) and ``gs-night1.service`` (GPU 1) named in ``instances``, and the real
``gpushift frontdoor``, socket-activated from its shipped units, balances between them:

* 32 concurrent requests through the front door are spread over both instances (each answers some:
  the stand-in names its port in every answer, and logs every request in its own log);
* the test kills instance 1 by its MainPID (read from systemd): once the front door has marked it
  down (its first health miss, seen in the front door's own ``Status()``), every request is answered,
  all by instance 0 -- a request sent in between is retried on instance 0 when its connect is
  refused, and only one already sent there may fail;
* the crash is a ledger row of its own (``gpushift ledger --json``, outcome ``crashed``, the unit
  named).  ``on_crash = "stay"`` keeps instance 1 down (no relaunch), so "all traffic to instance 0"
  holds for as long as the test looks; ``min_ready = 1`` keeps the backend serving on one;
* ``gpushift status`` shows the front door's view of each instance (``frontdoor.instances``, and a
  ``front door night:`` line).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from frontdoor_env import DAY, DoorEnv, post, standin_backend
from gpushift_env import Backend, GpushiftEnv, free_port, instances_config

NIGHT = "night-model"
N0, N1 = "gs-night0.service", "gs-night1.service"
#: Each request sleeps this long in the stand-in, so 32 of them are in flight together.
SLEEP_S = 0.3


class _NightPair(GpushiftEnv):
    """The rig's "night0" and "night1" tables written as one backend "night" of two instances."""

    def config_text(self) -> str:
        n0, n1 = self.backends["night0"], self.backends["night1"]
        lines = ["min_ready = 1", 'on_crash = "stay"', f'models = ["{NIGHT}"]']
        lines.append(f'version_url = "http://127.0.0.1:{n0.port}/version"')
        return instances_config(
            super().config_text(), [n0, n1], start_timeout_s=30, drain_timeout_s=5, vram_mib=6800, lines=lines
        )

    def unit_conflicts(self, b: Backend) -> list[str]:
        return ["gs-day.service"] if b.name != "day" else [N0, N1]  # the instances conflict with day only


class _Env(DoorEnv, _NightPair):
    """The daemon, day, the night pair and the front door in one sandbox."""

    def frontdoor_status(self) -> dict[str, Any]:
        """The front door's own ``Status()`` over the sandbox's bus ({} when it does not answer)."""
        r = subprocess.run(
            ["busctl", "--user", "--json=short", "call", "org.gpushift.FrontDoor1", "/org/gpushift/FrontDoor1",
             "org.gpushift.FrontDoor1", "Status"],
            env=self.sb.env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if r.returncode != 0:
            return {}
        return dict(json.loads(json.loads(r.stdout)["data"][0]))

    def night_instance(self, n: int) -> dict[str, Any]:
        pairs = self.frontdoor_status().get("instances", {}).get("night") or [{}, {}]
        return dict(pairs[n])


def _ask(env: _Env) -> tuple[float, int, str]:
    """One completion for night-model through the front door: (sent, status, answering port)."""
    sent = time.monotonic()
    body = {"model": NIGHT, "messages": [{"role": "user", "content": "hi"}], "sleep": SLEEP_S}
    try:
        status, headers, _ = post(env.url("/v1/chat/completions"), body, timeout_s=120)
    except OSError as e:
        return sent, 0, f"{type(e).__name__}: {e}"
    return sent, status, headers.get("x-standin-port", "")


def _burst(env: _Env, n: int) -> list[tuple[float, int, str]]:
    """``n`` requests at once, each on a thread (and a connection) of its own."""
    out: list[tuple[float, int, str]] = []
    lock = threading.Lock()

    def one() -> None:
        r = _ask(env)
        with lock:
            out.append(r)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert len(out) == n, f"{n - len(out)} requests never came back"
    return out


def _requests_in_log(path: Path) -> int:
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    return sum("POST /v1/chat/completions" in line for line in text.splitlines())


@pytest.mark.timeout(600)
def test_frontdoor_spreads_over_both_instances_and_a_killed_one_loses_its_traffic_to_the_other(
    sandbox: Any,
) -> None:
    backends = [standin_backend("day", DAY)] + [
        Backend(
            f"night{i}", free_port(), [i], version="2.0.0", vram_mib=6800, args=["--served-model-name", NIGHT]
        )
        for i in (0, 1)
    ]
    env = _Env(sandbox, Path(sandbox.base_dir) / "gs", backends)
    env.up()
    env.cli("switch", "night", "--reason", "evening", check=True)
    assert env.active_state(N0) == "active" and env.active_state(N1) == "active"
    env.door.activate()
    p0, p1 = str(env.backends["night0"].port), str(env.backends["night1"].port)

    # 32 at once: both instances answer some
    first = _burst(env, 32)
    assert all(s == 200 for _, s, _ in first), first
    by_port = {p: sum(1 for _, _, q in first if q == p) for p in (p0, p1)}
    assert by_port[p0] > 0 and by_port[p1] > 0 and sum(by_port.values()) == 32, by_port
    logs = env.base / "night0.log", env.base / "night1.log"
    assert _requests_in_log(logs[0]) > 0 and _requests_in_log(logs[1]) > 0, [p.read_text() for p in logs]

    # kill instance 1 by its MainPID, with requests coming all the while
    pid = env.main_pid(N1)
    assert pid > 0
    seen: list[tuple[float, int, str]] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            seen.append(_ask(env))

    workers = [threading.Thread(target=load) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        env.wait_for(lambda: len(seen) >= 8, 120, "requests flowing before the kill")
        os.kill(pid, signal.SIGKILL)
        env.wait_for(lambda: env.night_instance(1).get("up") is False, 120, "instance 1 marked down")
        missed = time.monotonic()
        env.wait_for(
            lambda: sum(1 for sent, *_ in seen if sent > missed) >= 32, 120, "requests after the miss"
        )
    finally:
        stop.set()
        for w in workers:
            w.join(180)
    after = [r for r in seen if r[0] > missed]
    assert all(s == 200 and q == p0 for _, s, q in after), [r for r in after if r[1] != 200 or r[2] != p0]
    assert env.night_instance(0).get("up") is True, env.frontdoor_status()

    # and 32 at once again: every one answered, all by instance 0
    second = _burst(env, 32)
    assert all(s == 200 and q == p0 for _, s, q in second), second

    # the crash is a row of its own, naming instance 1; instance 1 stays down (on_crash = "stay")
    def crash_row() -> dict[str, Any] | None:
        rows = [r for r in env.ledger() if r["outcome"] == "crashed"]
        return rows[0] if rows else None

    env.wait_for(lambda: crash_row() is not None, 120, "the crash row of instance 1")
    row = env.ledger_row(crash_row()["id"])  # type: ignore[index]
    assert row["unit"] == N1 and row["to"] == "night", row
    assert row["extra"]["incident"]["unit"] == N1, row["extra"]
    assert env.active_state(N0) == "active" and env.active_state(N1) != "active"
    assert env.status()["active"] == "night"

    # gpushift status shows what the front door sees of each instance (at its next sample)
    def shown() -> list[Any]:
        pools = env.status().get("frontdoor", {}).get("instances", {})
        return [(e["instance"], e["up"]) for e in pools.get("night", [])]

    env.wait_for(lambda: shown() == [(N0, True), (N1, False)], 120, "status showing instance 1 down")
    text = env.cli("status", check=True).stdout
    line = next((x for x in text.splitlines() if x.startswith("front door night: ")), "")
    assert f"{N0} up " in line and f"{N1} DOWN 0" in line, text

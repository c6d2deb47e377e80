"""Issue 20, point 3, on the real daemon (the shipped gpushift.service under a real systemd user
manager, stand-in backends): a schedule of 1,000 entries and calendar exceptions — the bound — is
loaded and served (the daemon answers ``gpushift status`` and shows the next switch, through more
than one watchdog interval, under the same PID); one entry more is refused by ``gpushift schedule
check`` (exit 2, the message naming file, line and bound) and by a reload, which keeps the old
schedule and the daemon's PID.  Before the bound, ``schedule check`` accepted ~1 MiB of entries that
then kept the daemon from answering until the watchdog restarted it, for ever.
"""

from __future__ import annotations

import time
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from gpushift_env import Backend, GpushiftEnv, free_port

BOUND = 1000
WATCHDOG_S = 30  # units/gpushift.service: WatchdogSec=30


def at_the_bound(now: datetime) -> tuple[str, int]:
    """900 entries naming a (daily ones at different times, and rare ones: a 29 February that is a
    Sunday), 99 calendar exceptions far away, and one entry naming b six months from now: a is in
    effect, the next switch is that b.  Returns the text and the b entry's line."""
    lines = ["# the largest schedule gpushift accepts", "TZ=UTC"]
    for i in range(900):
        if i % 3 == 0:
            lines.append(f"{i % 60} {(i // 60) % 24} 29 2 */7 a")
        else:
            lines.append(f"{i % 60} {(i // 60) % 24} * * * a")
    first = date(2090, 1, 1)
    lines += [
        f"except {first + timedelta(days=2 * k)} .. {first + timedelta(days=2 * k)} a" for k in range(99)
    ]
    month = (now.month + 5) % 12 + 1
    lines.append(f"0 12 15 {month} * b")
    return "\n".join(lines) + "\n", len(lines)


def daemon_pid(env: GpushiftEnv) -> str:
    return env.sb.show("gpushift.service", "MainPID")["MainPID"]


def status_answers(env: GpushiftEnv) -> dict[str, Any]:
    r = env.cli("status", "--json", timeout_s=60)
    assert r.returncode == 0, (r.stdout, r.stderr, env.daemon_log()[-3000:])
    return env.status()


def test_schedule_at_the_bound_runs_and_one_over_is_refused_everywhere(sandbox: Any) -> None:
    base = Path(sandbox.base_dir) / "gs"
    base.mkdir(parents=True, exist_ok=True)
    sched = base / "schedule"
    text, b_line = at_the_bound(datetime.now(timezone.utc))
    sched.write_text(text)
    backends = [Backend("a", free_port(), [0, 1]), Backend("b", free_port(), [0, 1])]
    env = GpushiftEnv(sandbox, base, backends, schedule=str(sched), reconcile_interval_s=2).up()
    started = time.monotonic()
    pid = daemon_pid(env)

    st = status_answers(env)
    assert st["schedule"]["wants"] == "a", st["schedule"]
    nxt = st["schedule"]["next"]
    assert nxt is not None and (nxt["target"], nxt["line"]) == ("b", b_line), nxt
    env.wait_for(lambda: env.active_state("gs-a.service") == "active", 60, "a to run")

    check = env.cli("schedule", "check", str(sched))
    assert check.returncode == 0 and "OK: 901 entries, 99 calendar exceptions" in check.stdout, check

    # One over: schedule check refuses it, naming the file, the first line over the bound and the bound.
    over = base / "schedule.over"
    over.write_text(text + "30 6 * * * b\n")
    over_line = text.count("\n") + 1
    r = env.cli("schedule", "check", str(over))
    assert r.returncode == 2, (r.stdout, r.stderr)
    want = f"{over}:{over_line}: entries: more than {BOUND} entries and calendar exceptions"
    assert want in r.stderr and f"at most {BOUND}" in r.stderr, r.stderr

    # The reload refuses it too; the old schedule stays, and the daemon.
    sched.write_text(over.read_text())
    r = env.cli("reload")
    assert r.returncode == 2, (r.stdout, r.stderr)
    want = f"{sched}:{over_line}: entries: more than {BOUND} entries and calendar exceptions"
    assert want in r.stderr, r.stderr
    st = status_answers(env)
    assert want in (st["daemon"]["reload_error"] or ""), st["daemon"]
    assert st["schedule"]["wants"] == "a" and st["schedule"]["next"]["line"] == b_line, st["schedule"]

    # Served through more than a watchdog interval: status answers, no restart.
    while time.monotonic() - started < WATCHDOG_S + 5:
        st = status_answers(env)
        assert st["schedule"]["next"]["target"] == "b", st["schedule"]
        time.sleep(2)
    assert daemon_pid(env) == pid
    assert env.sb.show("gpushift.service", "NRestarts")["NRestarts"] == "0"
    assert env.active_state("gs-a.service") == "active"

"""Issue 3's acceptance on the real daemon: the shipped gpushift.service under a real systemd user
manager with the real clock (and libfaketime for a wall-clock jump, without touching the machine's
clock), the real CLI, stand-in backends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from gpushift_env import Backend, GpushiftEnv, free_port

FAKETIME_LIBS = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def cron_at(t: datetime) -> str:
    """The five cron fields that fire at UTC minute ``t`` every day."""
    return f"{t.minute} {t.hour} * * *"


@pytest.fixture
def sched_env(sandbox):
    """Backends a and b (both on GPUs 0,1), a schedule file, a fast reconcile interval."""

    def build(schedule_text: str, up: bool = True, extra_env: list[str] | None = None, **opts) -> GpushiftEnv:
        base = Path(sandbox.base_dir) / "gs"
        base.mkdir(parents=True, exist_ok=True)
        sched = base / "schedule"
        sched.write_text(schedule_text)
        a = Backend("a", free_port(), [0, 1], version="1.0.0", vram_mib=14500)
        b = Backend(
            "b",
            free_port(),
            [0, 1],
            version="2.0.0",
            vram_mib=6800,
            args=list(opts.pop("b_args", [])),
            start_timeout_s=opts.pop("b_timeout", 20.0),
        )
        opts.setdefault("reconcile_interval_s", 2)
        env = GpushiftEnv(sandbox, base, [a, b], schedule=str(sched), **opts)
        env.schedule_path = sched
        env.extra_env = extra_env or []
        if up:
            env.up()
        return env

    return build


class FakeClock:
    """The daemon's wall clock through libfaketime: an offset file the daemon re-reads once a second
    (its monotonic clock stays real, so the daemon sees a wall-clock jump).  Not at every call:
    libfaketime 0.9.10 with ``FAKETIME_NO_CACHE=1`` now and then gives a thread the real time (see
    tests/integration/test_soak.py), which undoes a jump for a moment."""

    def __init__(self, lib: str, path: Path) -> None:
        self.path = path
        self.env = [
            f"LD_PRELOAD={lib}",
            f"FAKETIME_TIMESTAMP_FILE={path}",
            "FAKETIME_CACHE_DURATION=1",
            "FAKETIME_DONT_FAKE_MONOTONIC=1",
        ]
        self.path.write_text("+0\n")

    def shift(self, spec: str) -> None:
        """Set the offset from the real clock, in libfaketime's form (``+4h``, ``+7200``)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(f"{spec}\n")
        os.replace(tmp, self.path)  # never an empty file for libfaketime to read

    def jump_to(self, at: datetime) -> None:
        """From now on the daemon's clock reads ``at`` (and runs on from there)."""
        self.shift(f"{(at - utc_now()).total_seconds():+.0f}")


@pytest.fixture
def fake_clock() -> Iterator[FakeClock]:
    lib = next((p for p in FAKETIME_LIBS if os.path.exists(p)), None)
    assert lib, "libfaketime is missing: apt-get install faketime (make deps does)"
    clock = FakeClock(lib, Path(os.environ.get("GPUSHIFT_TEST_TMP", "/run")) / f"gs-faketime-{os.getpid()}")
    try:
        yield clock
    finally:
        clock.path.unlink(missing_ok=True)


def wait_active(env: GpushiftEnv, unit: str, timeout_s: float) -> None:
    """Until ``unit`` runs AND the switch that started it has finished (its ledger row closed)."""
    env.wait_for(
        lambda: env.active_state(unit) == "active" and env.status()["daemon"].get("switch") is None,
        timeout_s,
        f"{unit} to become active and the switch to finish",
    )


def test_schedule_switches_at_entry_time_and_reconciles_at_start(sched_env):
    now = utc_now()
    # a has been in effect for hours ("night" started earlier): the daemon must bring it up alone
    earlier = now - timedelta(hours=3)
    # b fires at the next minute that is at least 25 s away
    at = (now + timedelta(seconds=85)).replace(second=0, microsecond=0)
    env = sched_env(f"TZ=UTC\n{cron_at(earlier)} a\n{cron_at(at)} b\n")
    wait_active(env, "gs-a.service", 30)
    row = env.ledger()[0]
    assert row["to"] == "a" and row["outcome"] == "ok"
    assert env.ledger_row(row["id"])["trigger"] == "reconcile"
    st = env.status()
    assert st["mode"] == "schedule"
    assert st["schedule"]["wants"] == "a"
    assert st["schedule"]["next"]["target"] == "b"
    # the entry's time: within a few seconds of it
    wait_active(env, "gs-b.service", (at - utc_now()).total_seconds() + 30)
    row = env.ledger_row(env.ledger()[0]["id"])
    assert row["trigger"] == "schedule" and row["to"] == "b"
    started = datetime.fromisoformat(row["started_at"])
    # Not before its time; after it within a deadline generous enough for a busy machine (the
    # boundary's timer is the daemon's, but the CPU it runs on is shared).
    assert timedelta(0) <= started - at < timedelta(seconds=30), (started, at)


def test_wall_clock_jump_is_noticed_by_the_real_daemon(sched_env, fake_clock):
    now = utc_now()
    later = now + timedelta(hours=3)
    env = sched_env(
        f"TZ=UTC\n{cron_at(now - timedelta(hours=2))} a\n{cron_at(later)} b\n",
        extra_env=fake_clock.env,
        reconcile_interval_s=600,  # only the jump can explain a switch within the test
    )
    wait_active(env, "gs-a.service", 30)
    fake_clock.shift("+4h")  # the daemon's wall clock jumps past b's entry
    wait_active(env, "gs-b.service", 30)
    assert '"clock_jump"' in env.daemon_log()
    row = env.ledger_row(env.ledger()[0]["id"])
    assert row["to"] == "b" and row["trigger"] in ("reconcile", "schedule")


def test_calendar_exception_is_followed_across_its_start_a_restart_and_its_end(sched_env, fake_clock):
    """A holiday on b in the middle of a's day: the daemon switches at its start and at its end (its
    boundary timer, not a reconcile), and a restart inside it keeps b."""
    now = utc_now()
    start = (now + timedelta(hours=2)).replace(second=0, microsecond=0)
    end = start + timedelta(hours=3)
    env = sched_env(
        f"TZ=UTC\n{cron_at(now - timedelta(hours=2))} a\n"
        f"except {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%dT%H:%M} b holidays\n",
        extra_env=fake_clock.env,
        reconcile_interval_s=600,  # a switch within the test comes from a boundary (or the start)
    )
    wait_active(env, "gs-a.service", 30)
    assert env.status()["schedule"]["next"]["target"] == "b"

    def last_switch() -> dict[str, Any]:
        return env.ledger_row(env.ledger()[0]["id"])

    # 1. its start: the daemon's clock 15 s before it; the switch comes at the start, trigger schedule
    fake_clock.jump_to(start - timedelta(seconds=15))
    wait_active(env, "gs-b.service", 60)
    row = last_switch()
    assert (row["from"], row["to"], row["trigger"], row["outcome"]) == ("a", "b", "schedule", "ok")
    assert f"schedule line 3 (except {start:%Y-%m-%dT%H:%M}..{end:%Y-%m-%dT%H:%M}) fired at" in row["reason"]
    assert "(calendar exception holidays)" in row["reason"]
    began = datetime.fromisoformat(row["started_at"])
    assert timedelta(0) <= began - start < timedelta(seconds=5), (began, start)
    st = env.status()["schedule"]
    assert st["wants"] == "b" and st["exception"]["name"] == "holidays"
    assert datetime.fromisoformat(st["exception"]["until"]) == end
    assert "calendar exception holidays until" in env.cli("status", check=True).stdout

    # 2. a restart inside it: the new daemon keeps b (no switch, no ledger row)
    rows_before = len(env.ledger())
    b_pid = env.main_pid("gs-b.service")
    d_pid = env.sb.show("gpushift.service", "MainPID")["MainPID"]
    env.sb.systemctl("restart", "gpushift.service", timeout_s=60)
    assert env.sb.show("gpushift.service", "MainPID")["MainPID"] != d_pid
    env.wait_for(
        lambda: "serves as the schedule wants" in (env.status()["schedule"].get("last_action") or ""),
        30,
        "the restarted daemon's first decision",
    )
    st = env.status()
    assert st["schedule"]["wants"] == "b" and st["schedule"]["exception"]["name"] == "holidays"
    assert env.active_state("gs-b.service") == "active" and env.main_pid("gs-b.service") == b_pid
    assert len(env.ledger()) == rows_before

    # 3. its end: the daemon's clock 15 s before it; back to a at the end, naming the entry and the exception
    fake_clock.jump_to(end - timedelta(seconds=15))
    wait_active(env, "gs-a.service", 60)
    row = last_switch()
    assert (row["from"], row["to"], row["trigger"], row["outcome"]) == ("b", "a", "schedule", "ok")
    assert row["reason"].startswith("schedule line 2 (")
    assert "(calendar exception holidays on line 3 ended)" in row["reason"]
    ended = datetime.fromisoformat(row["started_at"])
    assert timedelta(0) <= ended - end < timedelta(seconds=5), (ended, end)
    assert env.status()["schedule"]["exception"] is None


def test_manual_switch_lasts_until_next_boundary(sched_env, fake_clock):
    """The override holds until the schedule's next boundary, then the schedule acts.  The boundary
    is the faked clock's (it comes when the test moves the clock), never one of the real clock that
    a busy machine could put inside the test's window."""
    now = utc_now()
    boundary = (now + timedelta(hours=2)).replace(second=0, microsecond=0)
    env = sched_env(
        f"TZ=UTC\n{cron_at(boundary)} a\n",  # a is in effect; its one boundary a day is two hours away
        extra_env=fake_clock.env,
    )
    wait_active(env, "gs-a.service", 30)
    env.cli("switch", "b", "--reason", "a quick experiment", check=True)
    st = env.status()
    assert st["mode"].startswith("override b until")
    until = datetime.fromisoformat(st["override"]["until"])
    assert until == boundary, (until, boundary)
    time.sleep(5)  # two reconcile intervals: the schedule does not fight the override before its boundary
    assert env.active_state("gs-b.service") == "active"
    assert env.status()["mode"].startswith("override b until")
    fake_clock.jump_to(boundary - timedelta(seconds=3))
    wait_active(env, "gs-a.service", 60)
    env.wait_for(lambda: env.status()["mode"] == "schedule", 30, "the daemon to obey the schedule again")


def test_hold_survives_restart_and_resume_switches_back(sched_env):
    env = sched_env("TZ=UTC\n* * * * * a\n")
    wait_active(env, "gs-a.service", 30)
    env.cli("switch", "b", "--hold", check=True)
    env.sb.systemctl("restart", "gpushift.service", timeout_s=60)
    assert env.status()["mode"].startswith("hold b")
    time.sleep(65)  # past at least one boundary
    assert env.active_state("gs-b.service") == "active"
    r = env.cli("resume", check=True)
    assert "obeying the schedule" in r.stdout
    wait_active(env, "gs-a.service", 30)
    assert env.status()["mode"] == "schedule"


def test_systemctl_stop_is_not_undone_before_next_boundary(sched_env):
    env = sched_env("TZ=UTC\n0 0 1 1 * a\n")  # in effect since 1 January; next boundary next year
    wait_active(env, "gs-a.service", 30)
    env.sb.systemctl("stop", "gs-a.service")
    env.wait_for(
        lambda: env.status()["mode"].startswith("override off until"), 15, "the external stop to be noticed"
    )
    time.sleep(6)  # three reconcile intervals
    assert env.active_state("gs-a.service") != "active"
    rows = env.ledger()
    ext = env.ledger_row(rows[0]["id"])
    assert ext["trigger"] == "external" and ext["from"] == "a" and ext["to"] == "off"


def test_cancel_aborts_slow_start_and_previous_serves_again(sched_env):
    env = sched_env("TZ=UTC\n0 0 1 1 * a\n", b_args=["--start-delay", "120"], b_timeout=300)
    wait_active(env, "gs-a.service", 30)
    p = env.cli_popen("switch", "b")
    env.wait_for(
        lambda: (env.status()["daemon"].get("switch") or {}).get("phase") == "ready", 30, "the slow start"
    )
    r = env.cli("cancel", check=True)
    assert "cancelling" in r.stdout
    out, err = p.communicate(timeout=60)
    assert p.returncode != 0
    wait_active(env, "gs-a.service", 30)
    row = env.ledger_row(env.ledger()[0]["id"])
    assert row["outcome"] == "rolled_back" and "cancelled by root" in row["message"]


def test_reload_rejects_broken_schedule_and_applies_good_one(sched_env):
    env = sched_env("TZ=UTC\n0 0 1 1 * a\n")
    wait_active(env, "gs-a.service", 30)
    d_pid = env.sb.show("gpushift.service", "MainPID")["MainPID"]
    env.schedule_path.write_text("TZ=UTC\n0 25 * * * a\n")  # hour 25
    r = env.sb.systemctl("reload", "gpushift.service", check=False)
    assert r.returncode != 0
    st = env.status()
    assert "hour" in (st["daemon"]["reload_error"] or "")
    assert st["schedule"]["wants"] == "a"
    a_pid = env.main_pid("gs-a.service")
    env.schedule_path.write_text("TZ=UTC\n0 0 1 1 * b\n")
    env.sb.systemctl("reload", "gpushift.service")
    wait_active(env, "gs-b.service", 30)
    assert env.sb.show("gpushift.service", "MainPID")["MainPID"] == d_pid
    assert env.status()["daemon"]["reload_error"] is None
    assert a_pid != 0


def test_daemon_refuses_to_start_on_invalid_schedule(sched_env):
    env = sched_env("TZ=UTC\n0 8 * * 8 a\n", up=False)
    env.install()
    r = env.sb.systemctl("start", "gpushift.service", check=False, timeout_s=60)
    assert r.returncode != 0
    assert env.active_state("gpushift.service") in ("failed", "activating", "inactive")
    assert "refusing to start" in env.daemon_log() and "day-of-week" in env.daemon_log()
    env.sb.systemctl("stop", "gpushift.service", check=False)


def test_watchdog_ready_and_restart_of_a_hung_daemon(sched_env):
    env = sched_env("TZ=UTC\n0 0 1 1 * a\n")
    wait_active(env, "gs-a.service", 30)
    props = env.sb.show("gpushift.service", "Type", "WatchdogUSec", "StatusText", "MainPID", "NRestarts")
    assert props["Type"] == "notify" and props["NRestarts"] == "0"
    assert props["StatusText"].startswith("serving a")
    pid = int(props["MainPID"])
    os.kill(pid, signal.SIGSTOP)  # the loop stops: no more WATCHDOG=1
    try:
        env.wait_for(
            lambda: (
                env.sb.show("gpushift.service", "MainPID")["MainPID"] not in ("0", str(pid))
                and env.active_state("gpushift.service") == "active"
            ),
            90,
            "systemd to kill and restart the hung daemon",
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert int(env.sb.show("gpushift.service", "NRestarts")["NRestarts"]) >= 1
    assert env.active_state("gs-a.service") == "active"  # the backend was never touched

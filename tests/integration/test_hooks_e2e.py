"""Issue 14's hooks and webhook on the real daemon: the shipped gpushift.service under a real systemd
manager, the real CLI, stand-in backends, real hook scripts (which record who they ran as and
their environment) and a real local HTTP receiver; libfaketime for the look-ahead's wall clock.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from gpushift_env import Backend, GpushiftEnv, free_port
from test_schedule_e2e import cron_at, fake_clock, utc_now, wait_active  # noqa: F401 (fixture)

from tests.support.receiver import Receiver

NOBODY = "65534"

#: Records who it ran as and its GPUSHIFT_* environment, one file per run; says no (exit 7) to a
#: switch to the backend named in its second argument.
RECORDER = """#!/bin/sh
out="$1"; refuse="$2"
f="$out/$GPUSHIFT_EVENT.$$"
id -u > "$f.uid"
env | grep '^GPUSHIFT_' | sort > "$f.env"
echo "hook $GPUSHIFT_EVENT ran"
if [ -n "$refuse" ] && [ "$GPUSHIFT_TO" = "$refuse" ]; then
  echo "batch job 4411 still running"
  exit 7
fi
"""


@pytest.fixture
def hook_dir() -> Iterator[Path]:
    """Scripts every user may run, and a directory nobody may write its records to."""
    d = Path(tempfile.mkdtemp(prefix="gs-hooks-", dir=os.environ.get("GPUSHIFT_TEST_TMP", "/tmp")))
    try:
        d.chmod(0o755)
        (d / "rec").mkdir()
        (d / "rec").chmod(0o777)
        (d / "record").write_text(RECORDER)
        (d / "record").chmod(0o755)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(port=free_port())
    try:
        yield r
    finally:
        r.stop()


def runs(hook_dir: Path, event: str) -> list[dict[str, str]]:
    """The environments of ``event``'s runs, oldest first; each with its ``uid``."""
    out = []
    for f in sorted((hook_dir / "rec").glob(f"{event}.*.env"), key=lambda p: p.stat().st_mtime):
        env = dict(line.split("=", 1) for line in f.read_text().splitlines() if "=" in line)
        env["uid"] = f.with_suffix(".uid").read_text().strip()
        out.append(env)
    return out


def make_env(sandbox: Any, extra_toml: str, **opts: Any) -> GpushiftEnv:
    base = Path(sandbox.base_dir) / "gs"
    base.mkdir(parents=True, exist_ok=True)
    a = Backend("a", free_port(), [0, 1], version="1.0.0", vram_mib=14500)
    b = Backend("b", free_port(), [0, 1], version="2.0.0", vram_mib=6800)
    schedule = opts.pop("schedule_text", None)
    if schedule is not None:
        (base / "schedule").write_text(schedule)
        opts["schedule"] = str(base / "schedule")
    env = GpushiftEnv(sandbox, base, [a, b], **opts)
    plain = env.config_text
    env.config_text = lambda: plain() + extra_toml  # type: ignore[method-assign]
    return env


def test_hooks_run_as_nobody_with_the_documented_environment_a_required_one_refuses_and_the_webhook_delivers(
    sandbox: Any, hook_dir: Path, receiver: Receiver
) -> None:
    rec, script = hook_dir / "rec", hook_dir / "record"
    env = make_env(
        sandbox,
        f"""
[hooks]
before_stop = {{ argv = ["{script}", "{rec}", "b"], required = true, timeout_s = 30 }}
after_ready = ["{script}", "{rec}"]
on_failure = ["{script}", "{rec}"]

[notify]
webhook_url = "http://hookbot:PW-SECRET@127.0.0.1:{receiver.port}/hooks/PATH-TOKEN"
lead_s = 0
timeout_s = 2
""",
    )
    env.up()
    # --- a switch that goes through: before_stop, then after_ready; the receiver is down at first.
    r = env.cli("switch", "a", "--reason", "morning shift", check=True)
    assert env.active_state("gs-a.service") == "active", r.stdout
    before, after = runs(hook_dir, "before_stop"), runs(hook_dir, "after_ready")
    assert len(before) == 1 and len(after) == 1
    row_id = env.ledger()[0]["id"]
    row = env.ledger_row(row_id)
    b0 = before[0]
    assert b0["uid"] == NOBODY
    assert (b0["GPUSHIFT_EVENT"], b0["GPUSHIFT_FROM"], b0["GPUSHIFT_TO"]) == ("before_stop", "off", "a")
    assert (b0["GPUSHIFT_TRIGGER"], b0["GPUSHIFT_REASON"]) == ("manual", "morning shift")
    assert (b0["GPUSHIFT_TICKET"], b0["GPUSHIFT_LEDGER_ID"]) == (row["ticket"], str(row_id))
    assert b0["GPUSHIFT_TO_UNIT"] == "gs-a.service"
    assert after[0]["uid"] == NOBODY and after[0]["GPUSHIFT_MESSAGE"] == "a is serving"
    hooks = row["extra"]["hooks"]
    assert [(h["event"], h["result"], h["exit_status"], h["user"]) for h in hooks] == [
        ("before_stop", "success", 0, "nobody"),
        ("after_ready", "success", 0, "nobody"),
    ]
    assert "hook before_stop ran" in hooks[0]["output"]
    shown = env.cli("ledger", "show", str(row_id), check=True).stdout
    assert "Hooks" in shown and "as nobody: exit status 0" in shown
    env.wait_for(lambda: '"webhook_retry"' in env.daemon_log(), 20, "a failed first delivery")
    receiver.start()
    (first,) = receiver.wait(1, 30)
    assert (first["event"], first["to"], first["outcome"], first["ledger_id"]) == (
        "switch_finished",
        "a",
        "ok",
        row_id,
    )
    assert first["text"].endswith("off → a: ok — a is serving")
    assert receiver.posts[0].path == "/hooks/PATH-TOKEN"
    # --- a switch the required before_stop refuses: nothing stopped, on_failure told so.
    r = env.cli("switch", "b")
    assert r.returncode == 7, (r.stdout, r.stderr)
    assert env.active_state("gs-a.service") == "active" and env.active_state("gs-b.service") != "active"
    refused = env.ledger_row(env.ledger()[0]["id"])
    assert (refused["outcome"], refused["failed_phase"]) == ("refused", "hooks")
    assert "said no (exit status 7): batch job 4411 still running" in refused["message"]
    (failed,) = runs(hook_dir, "on_failure")
    assert failed["uid"] == NOBODY and (failed["GPUSHIFT_OUTCOME"], failed["GPUSHIFT_TO"]) == ("refused", "b")
    docs = receiver.wait(2, 30)
    assert (docs[1]["to"], docs[1]["outcome"]) == ("b", "refused")
    # The webhook's URL is shown as scheme and host only, its credentials nowhere.
    st = env.status()
    assert st["notices"]["webhook"]["url"] == f"http://127.0.0.1:{receiver.port}/***"
    assert st["notices"]["webhook"]["delivered"] == 2
    log = env.daemon_log() + json.dumps(st)
    for secret in ("PW-SECRET", "PATH-TOKEN", "hookbot"):
        assert secret not in log


def test_before_boundary_runs_once_its_lead_before_a_scheduled_switch_and_the_webhook_notice_goes_out(
    sandbox: Any,
    hook_dir: Path,
    receiver: Receiver,
    fake_clock: Any,  # noqa: F811 (the fixture)
) -> None:
    rec, script = hook_dir / "rec", hook_dir / "record"
    now = utc_now()
    at = (now + timedelta(hours=3)).replace(second=0, microsecond=0)
    receiver.port = 0  # up from the start: bound to a port the kernel picks (no race for a free one)
    receiver.start()
    env = make_env(
        sandbox,
        f"""
[hooks]
before_boundary = {{ argv = ["{script}", "{rec}"], lead_s = 120 }}

[notify]
webhook_url = "{receiver.url}/in"
lead_s = 120
""",
        schedule_text=f"TZ=UTC\n{cron_at(now - timedelta(hours=2))} a\n{cron_at(at)} b\n",
        reconcile_interval_s=2,
    )
    env.extra_env = fake_clock.env
    env.up()
    wait_active(env, "gs-a.service", 30)
    (started,) = receiver.wait(1, 30)  # the start's own switch (to a) has its document
    assert (started["event"], started["to"]) == ("switch_finished", "a")
    assert runs(hook_dir, "before_boundary") == []
    armed = env.status()["notices"]["lookahead"]["before_boundary"]["armed"]
    assert armed["to"] == "b" and datetime.fromisoformat(armed["at"]) == at
    fake_clock.jump_to(at - timedelta(seconds=75))  # inside the 120 s lead: due at once
    env.wait_for(lambda: len(runs(hook_dir, "before_boundary")) == 1, 30, "the before_boundary hook")
    (hook,) = runs(hook_dir, "before_boundary")
    assert hook["uid"] == NOBODY
    assert (hook["GPUSHIFT_FROM"], hook["GPUSHIFT_TO"], hook["GPUSHIFT_TRIGGER"]) == ("a", "b", "schedule")
    assert datetime.fromisoformat(hook["GPUSHIFT_AT"]) == at
    notice = receiver.wait(2, 30)[1]
    assert notice["event"] == "switch_coming" and notice["to"] == "b"
    assert notice["text"].endswith("a → b (scheduled)") and 0 < notice["in_s"] <= 75
    time.sleep(6)  # three reconciles re-evaluate the look-ahead: the same switch is not acted on again
    assert len(runs(hook_dir, "before_boundary")) == 1 and len(receiver.delivered()) == 2
    fake_clock.jump_to(at - timedelta(seconds=2))
    wait_active(env, "gs-b.service", 60)
    time.sleep(3)
    # The next switch (back to a) is a day away: nothing more ran.
    assert len(runs(hook_dir, "before_boundary")) == 1
    docs = receiver.wait(3, 30)
    assert [(d["event"], d["to"]) for d in docs] == [
        ("switch_finished", "a"),
        ("switch_coming", "b"),
        ("switch_finished", "b"),
    ]
    assert datetime.now(timezone.utc) < at  # the real clock never moved

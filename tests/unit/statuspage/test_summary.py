"""The status page's summary (``gpushift/statuspage/summary.py``) is built from an allowlist: a
status document and ledger rows full of command lines, environment values, API keys, holder PIDs,
user names and reasons give a summary holding none of them, and every field it does hold."""

from __future__ import annotations

import copy
import json
from datetime import date, datetime, timezone
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushift.daemon.wiring import Components, status_report
from gpushift.schedule import parse_schedule
from gpushift.schedule.week import Overlay, lay_out
from gpushift.statuspage.summary import build
from gpushift.values import Outcome, SwitchRecord

UTC = timezone.utc
NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
API_KEY = "sk-live-7c1f00d2a9e84b1fb3b2"
HF_TOKEN = "hf_QwErTyUiOpAsDfGhJkL"
SECRETS = [
    API_KEY,
    HF_TOKEN,
    "--api-key",
    "HF_TOKEN",
    "/opt/models/secret-model",
    "alice",
    "bob",
    "mallory",
    "nightly eval for customer X",
    "because the CEO said so",
    "python3",
    "/etc/gpushift/gpushift.toml",
    "gpushift-day.service",
    "/etc/systemd/system",
    "rollback impossible",
]
PIDS = [424242, 515151, 616161]


def secret_status(world: Any) -> dict[str, Any]:
    """The status document of a daemon at work (the real composition over the fakes), with a
    secret in every place one can reach it."""
    st = status_report(Components(world.config, world.ports), {"running": True, "state": "switching"})
    st["daemon"].update(
        pid=PIDS[0],
        config="/etc/gpushift/gpushift.toml",
        switch={
            "ticket": "t-1",
            "to": "night",
            "from": "day",
            "requested_by": "alice",
            "trigger": "manual",
            "reason": "nightly eval for customer X",
            "phase": "drain",
            "detail": f"waiting for 3 requests; argv --api-key {API_KEY}",
            "elapsed_s": 2.34,
            "cancel_requested_by": "mallory",
        },
    )
    st["override"] = {
        "mode": "override",
        "backend": "night",
        "until": "2026-03-02T20:00:00+00:00",
        "set_by": "bob",
        "set_at": "2026-03-02T11:00:00+00:00",
        "reason": "because the CEO said so",
        "source": "manual",
        "when_idle": False,
    }
    st["mode"] = "override night until 2026-03-02T20:00:00+00:00"
    st["schedule"] = {"path": "/etc/gpushift/schedule", "wants": "day", "last_action": "alice asked"}
    st["backends"]["day"].update(main_pid=PIDS[1], unit="gpushift-day.service", kind="vllm")
    st["backends"]["day"]["health"]["detail"] = f"Bearer {API_KEY}"
    for g in st["gpus"]:
        g["holders"] = [
            {
                "pid": PIDS[2],
                "user": "mallory",
                "command": "python3",
                "cmdline": ["python3", "-m", "vllm", "--api-key", API_KEY, "/opt/models/secret-model"],
                "unit": "gpushift-day.service",
                "used_mib": 1000.0,
            }
        ]
        g["unreadable_pids"] = [PIDS[0]]
    st["frontdoor"] = {
        "listen": ["[::]:8000"],
        "held": 3,
        "in_flight": {"day": 2, "night": 0, "/etc/passwd": 9},
        "closed": ["day"],
        "daemon": "connected",
        "requests": 100,
        "error": f"HF_TOKEN={HF_TOKEN}",
    }
    return st


def secret_rows() -> list[dict[str, Any]]:
    r = SwitchRecord(
        trigger="manual",
        requested_by="alice",
        reason="nightly eval for customer X",
        from_backend="night",
        to_backend="day",
        started_at=datetime(2026, 3, 2, 11, 0, tzinfo=UTC),
        finished_at=datetime(2026, 3, 2, 11, 1, 30, tzinfo=UTC),
        outcome=Outcome.ROLLED_BACK.value,
        failed_phase="ready",
        message="rollback impossible: /opt/models/secret-model --api-key",
        unit="gpushift-day.service",
        unit_path="/etc/systemd/system/gpushift-day.service",
        argv_configured=["vllm", "serve", "/opt/models/secret-model", "--api-key", API_KEY],
        argv_running=["vllm", "serve", "--api-key", API_KEY],
        uid=1000,
        id=7,
        durations_s={
            "drain": 1.234,
            "stop": 2.0,
            "release": 0.5,
            "start": 10.0,
            "ready": 30.25,
            "bogus": 9.0,
        },
        extra={"env": {"HF_TOKEN": HF_TOKEN}, "hooks": [{"output": "alice"}], "holders": PIDS},
    )
    return [r.to_dict()]


def test_the_summary_of_a_status_full_of_secrets_holds_none_of_them(world: Any) -> None:
    summary = build(secret_status(world), secret_rows(), None, ["day", "night"], NOW)
    text = json.dumps(summary)
    for secret in SECRETS:
        assert secret not in text, secret
    for pid in PIDS:
        assert str(pid) not in text, pid
    assert "uid" not in text and "reason" not in text and "argv" not in text and "message" not in text


def test_the_summary_holds_every_allowed_field(world: Any) -> None:
    summary = build(secret_status(world), secret_rows(), None, ["day", "night"], NOW)
    assert summary["version"] == 1 and summary["generated_at"] == "2026-03-02T12:00:00Z"
    assert summary["serving"]["backend"] == "day"
    assert summary["mode"] == "override"
    assert summary["override"] == {"mode": "override", "backend": "night", "until": "2026-03-02T20:00:00Z"}
    assert summary["switch"] == {
        "from": "day",
        "to": "night",
        "phase": "drain",
        "trigger": "manual",
        "elapsed_s": 2.3,
    }
    assert summary["recent"] == [
        {
            "id": 7,
            "from": "night",
            "to": "day",
            "trigger": "manual",
            "outcome": "rolled_back",
            "failed_phase": "ready",
            "started_at": "2026-03-02T11:00:00Z",
            "finished_at": "2026-03-02T11:01:30Z",
            "durations_s": {"drain": 1.23, "stop": 2.0, "release": 0.5, "start": 10.0, "ready": 30.25},
        }
    ]
    assert [b["name"] for b in summary["backends"]] == ["day", "night"]
    assert summary["backends"][0]["unit_state"] == "active" and summary["backends"][0]["health"] == "ok"
    assert all(set(g) == {"index", "name", "used_mib", "total_mib", "state"} for g in summary["gpus"])
    assert summary["gpus"][0]["index"] == 0 and summary["gpus"][0]["total_mib"] > 0
    assert summary["frontdoor"] == {"held": 3, "in_flight": {"day": 2, "night": 0}}  # no other name
    assert summary["week"] is None and summary["next"] == []


def test_the_week_and_the_next_switches_come_from_the_layout() -> None:
    sched = parse_schedule(
        "TZ=Europe/Berlin\n0 8 * * * day\n0 20 * * * night\nexcept 2026-03-04 .. 2026-03-04 off maint\n",
        "schedule",
        backends={"day", "night"},
    )
    ov = Overlay(
        "override", "night", datetime(2026, 3, 2, 11, tzinfo=UTC), datetime(2026, 3, 2, 19, tzinfo=UTC)
    )
    week = lay_out(sched, date(2026, 3, 2), 7, now=NOW, overlay=ov)
    s = build({"active": "night", "backends": {}, "schedule": {}}, [], week, ["day", "night"], NOW)
    assert s["next"][:3] == [
        {"backend": "day", "at": "2026-03-03T07:00:00Z", "source": "schedule"},
        {"backend": "night", "at": "2026-03-03T19:00:00Z", "source": "schedule"},
        {"backend": "off", "at": "2026-03-03T23:00:00Z", "source": "exception"},
    ]
    w = s["week"]
    assert w["zone"] == "Europe/Berlin" and len(w["days"]) == 7
    assert w["stretches"][1] == {
        "from": "2026-03-02T07:00:00Z",
        "until": "2026-03-02T11:00:00Z",
        "backend": "day",
        "source": "schedule",
        "exception": None,
    }
    assert w["stretches"][2]["source"] == "override"
    maint = [x for x in w["stretches"] if x["source"] == "exception"]
    assert maint == [
        {
            "from": "2026-03-03T23:00:00Z",
            "until": "2026-03-04T23:00:00Z",
            "backend": "off",
            "source": "exception",
            "exception": "maint",
        }
    ]
    day0 = w["days"][0]
    assert (day0["date"], day0["weekday"], day0["hours"], day0["clock_changes"]) == (
        "2026-03-02",
        "Mon",
        24.0,
        [],
    )
    assert day0["pieces"][0] == {"x0": 0, "x1": 8 * 3600, "stretch": 0, "begins": False}


# ---- whatever a string or a PID in the status or a row holds, only allowed fields carry it ---------


def _leaves(value: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in _leaves(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in _leaves(v, f"{path}[{i}]")]
    return [(path, value)]


def _replace(value: Any, fn: Any, path: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _replace(v, fn, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, fn, f"{path}[{i}]") for i, v in enumerate(value)]
    return fn(path, value)


# ``world`` is only read (the status is composed once per example and copied before planting).
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    # a word with digits: never one of gpushift's own words (a phase, an outcome) the summary keeps
    secret=st.from_regex(r"[A-Za-z]{2,8}[0-9]{3,6}[A-Za-z0-9_-]{0,8}", fullmatch=True),
    every=st.integers(min_value=1, max_value=4),
    pid=st.integers(min_value=100_000, max_value=4_000_000),
)
def test_a_secret_in_any_string_of_the_status_reaches_only_the_gpu_model_name(
    world: Any, secret: str, every: int, pid: int
) -> None:
    base, rows = secret_status(world), secret_rows()
    seen = [0]

    def plant(path: str, v: Any) -> Any:
        if isinstance(v, str):
            seen[0] += 1
            return f"{secret}" if seen[0] % every == 0 else v
        if (
            isinstance(v, int)
            and not isinstance(v, bool)
            and path.rsplit(".", 1)[-1] in ("pid", "main_pid", "uid")
        ):
            return pid
        return v

    status = _replace(copy.deepcopy(base), plant)
    planted_rows = _replace(copy.deepcopy(rows), plant)
    summary = build(status, planted_rows, None, ["day", "night"], NOW)
    where = [p for p, v in _leaves(summary) if isinstance(v, str) and secret in v]
    assert all(p.startswith(".gpus[") and p.endswith(".name") for p in where), where
    assert str(pid) not in json.dumps(summary)

"""What a person reads from `gpushift` is words, never Python (issue 25 point 4): no ``None``, no
exception repr, no traceback; without a daemon one line says what is wrong with the bus and what to
do; a ledger that does not exist yet is ``absent``, not ``ok``; `gpushift status` writes times as
the ledger's table does (``--json`` keeps ISO 8601); every summary in ``--help`` is a whole sentence.

The daemon's side is replaced at the client (click's CliRunner), or the bus is an address where
none listens; nothing here starts a process."""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from gpushift.bus import lightclient
from gpushift.cli import _LAZY, check, main, switching
from gpushift.cli.status_text import local_time, render_status
from gpushift.errors import DaemonUnavailable
from gpushift.ledger.text import local_time as ledger_local_time

#: Python showing through: None, an exception's repr or errno prefix, a traceback, an object's repr.
PYTHON = re.compile(
    r"\bNone\b|Traceback|\[Errno \d+\]|\b[A-Z]\w*(Error|Exception)\(|<\w[\w.]* object at|KeyError"
)


def python_in(text: str) -> list[str]:
    return [line for line in text.splitlines() if PYTHON.search(line)]


@pytest.fixture
def nobus(tmp_path: Path) -> str:
    """A session bus address where no bus listens."""
    return f"unix:path={tmp_path}/no-bus-here"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    cfg = tmp_path / "gpushift.toml"
    cfg.write_text(
        f'[daemon]\nbus = "session"\nstate_dir = "{tmp_path}/state"\nruntime_dir = "{tmp_path}/run"\n'
        'schedule = ""\n[gpu]\nprovider = "simulated"\nsimulated_gpus = 1\n'
        '[backends.a]\nunit = "gs-a.service"\nhealth_url = "http://127.0.0.1:9/health"\n'
        '[backends.b]\nunit = "gs-b.service"\nhealth_url = "http://127.0.0.1:9/health"\n'
    )
    return cfg


def run(config: Path, *args: str, env: dict[str, str | None] | None = None) -> Result:
    return CliRunner().invoke(main, ["--config", str(config), *args], env={"NO_COLOR": "1", **(env or {})})


# ------------------------------------------------------------------ no daemon


def test_status_without_a_bus_says_it_once_with_what_to_do(config: Path, nobus: str) -> None:
    r = run(config, "status", env={"DBUS_SESSION_BUS_ADDRESS": nobus})
    assert r.exit_code == 6, r.output
    out = r.output
    assert python_in(out) == [], out
    bus_lines = [line for line in out.splitlines() if "No such file" in line or re.search(r"\bbus\b", line)]
    assert len(bus_lines) == 1, out  # was five: the daemon, "active" and one per backend
    (line,) = bus_lines
    assert line.startswith("daemon:   DOWN") and "not running" in line, line
    assert "`systemctl --user start gpushift`" in line and "[daemon] bus" in line, line
    assert "  a          gs-a.service  unit state unknown" in out, out
    assert "active:   unknown: systemd could not be asked" in out, out


def test_status_json_without_a_bus_keeps_every_error(config: Path, nobus: str) -> None:
    r = run(config, "status", "--json", env={"DBUS_SESSION_BUS_ADDRESS": nobus})
    s = json.loads(r.output)
    assert all(b["error"].startswith("systemd not reachable") for b in s["backends"].values())
    assert "systemctl --user start gpushift" in s["daemon"]["error"]


def test_status_without_a_ledger_says_absent_not_ok(config: Path, nobus: str, tmp_path: Path) -> None:
    r = run(config, "status", env={"DBUS_SESSION_BUS_ADDRESS": nobus})
    assert f"ledger:   absent (no ledger yet: {tmp_path}/state/ledger.db does not exist" in r.output, r.output
    assert "ledger:   ok" not in r.output
    s = json.loads(run(config, "status", "--json", env={"DBUS_SESSION_BUS_ADDRESS": nobus}).output)
    assert s["ledger"]["state"] == "absent" and s["ledger"]["path"] == f"{tmp_path}/state/ledger.db"
    assert not (tmp_path / "state" / "ledger.db").exists()  # status made none


def test_switch_without_a_bus_says_the_daemon_is_not_running_and_how_to_start_it(
    config: Path, nobus: str
) -> None:
    r = run(config, "switch", "a", env={"DBUS_SESSION_BUS_ADDRESS": nobus})
    assert r.exit_code == 6, r.output
    assert "gpushift: the gpushift daemon (gpushift.service) is not running" in r.output, r.output
    assert "`systemctl --user start gpushift`" in r.output and "[daemon] bus" in r.output
    assert python_in(r.output) == [], r.output


@pytest.mark.parametrize("command", ["cancel", "resume", "reload"])
def test_the_other_calls_without_a_bus_say_how_to_start_the_daemon(
    config: Path, nobus: str, command: str
) -> None:
    r = run(config, command, env={"DBUS_SESSION_BUS_ADDRESS": nobus})
    assert r.exit_code == 6, r.output
    assert "not running" in r.output and "`systemctl --user start gpushift`" in r.output, r.output
    assert python_in(r.output) == [], r.output


def test_a_session_bus_without_its_address_is_named_not_a_key_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DBUS_SESSION_BUS_ADDRESS", raising=False)
    with pytest.raises(DaemonUnavailable) as e:
        lightclient.get_status("session")
    assert "$DBUS_SESSION_BUS_ADDRESS is not set" in str(e.value), str(e.value)
    assert "'DBUS_SESSION_BUS_ADDRESS'" not in str(e.value)


def test_the_system_bus_command_is_systemctl_start_gpushift() -> None:
    assert "`systemctl start gpushift`" in str(lightclient.no_daemon("system"))
    assert "on the system bus" in str(lightclient.no_daemon("system"))


class _NobodyOwnsTheName:
    """A jeepney connection on a bus where no daemon owns gpushift's name."""

    def send_and_get_reply(self, msg: Any, timeout: float | None = None) -> Any:
        from jeepney import new_error

        msg.header.serial = 1
        return new_error(msg, "org.freedesktop.DBus.Error.ServiceUnknown", "s", ("not activatable",))

    def close(self) -> None:
        pass


def test_a_bus_without_the_daemon_says_it_is_not_running_and_how_to_start_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lightclient, "_connect", lambda bus_kind: _NobodyOwnsTheName())
    for call in (
        lambda: lightclient.get_status("system"),
        lambda: lightclient.switch("system", "a", {}, wait=False),
    ):
        with pytest.raises(DaemonUnavailable) as e:
            call()
        assert str(e.value) == (
            "the gpushift daemon (gpushift.service) is not running on the system bus: start it with "
            "`systemctl start gpushift`, or set `[daemon] bus` in the config to the bus it runs on"
        )


# ------------------------------------------------------------------ times


@pytest.fixture
def kolkata(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The local zone UTC+05:30 (no daylight saving): 18:17 UTC is 23:47 here."""
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _unit(unit: str, states: str, pid: int | None, health: dict[str, Any]) -> dict[str, Any]:
    active, sub = states.split("/")
    return {"unit": unit, "active_state": active, "sub_state": sub, "main_pid": pid, "health": health,
            "in_flight": {"requests": 2}}  # fmt: skip


def full_status() -> dict[str, Any]:
    """A daemon's status with every part the text shows (times as the daemon writes them)."""
    return {
        "daemon": {
            "running": True,
            "pid": 42,
            "state": "switching",
            "version": "0.1.0",
            "switch": {
                "from": "a",
                "to": "b",
                "phase": "ready",
                "detail": "waiting",
                "elapsed_s": 1.5,
                "ticket": "t1",
                "requested_by": "alice",
            },
            "reload_error": "bad line",
            "override_ignored": "b is no longer configured",
            "override_not_saved": "disk full",
        },
        "mode": "override b until 2026-12-02T08:00:00+00:00",
        "override": {"mode": "override", "backend": "b", "until": "2026-12-02T08:00:00+00:00"},
        "active": "a",
        "running": ["a"],
        "since": "2026-12-01T18:17:06.763334+00:00",
        "schedule": {
            "wants": "a",
            "exception": {"name": "xmas", "until_local": "2026-12-26T00:00:00+01:00"},
            "next": {
                "target": "b",
                "at": "2026-12-02T07:00:00+00:00",
                "at_local": "2026-12-02T08:00:00+01:00",
            },
            "blocked": None,
        },
        "warning": "two backends share port 8000",
        "backends": {
            "a": _unit(
                "gs-a.service", "active/running", 43, {"state": "ok", "ok": True, "status": 200, "age_s": 0.4}
            ),
            "b": _unit(
                "gs-b.service",
                "inactive/dead",
                None,
                {"state": "failing", "status": 503, "detail": "loading", "failing_for_s": 3.0},
            ),
        },
        "gpus": [
            dict(
                index=0,
                name="V100",
                used_mib=6000,
                total_mib=16384,
                state="held",
                age_s=0.3,
                unreadable_pids=[7],
                holders=[dict(pid=43, command="vllm", user="llm", unit="gs-a.service", used_mib=6000)],
            ),
        ],
        "simulated": False,
        "blocked": "gave up after 3 attempts",
        "deferred": {"to": "b", "why": "deferred until 2026-12-01T18:27:06+00:00 at the latest: a is busy"},
        "last_switch": {
            "id": 7,
            "from": "b",
            "to": "a",
            "outcome": "ok",
            "trigger": "manual",
            "requested_by": "alice",
            "started_at": "2026-12-01T18:16:06+00:00",
            "finished_at": "2026-12-01T18:17:06.763334+00:00",
            "message": "a is serving",
            "warmup": {"ok": True, "ttft_s": 0.2, "total_s": 0.5},
        },
        "ledger": {
            "state": "degraded",
            "pending": 1,
            "error": "disk full",
            "alarm": "head moved",
            "chain_break": {"at": "2026-12-01T18:00:00+00:00", "reason": "deleted", "moved_to": "/x"},
        },
        "notices": {
            "webhook": {
                "url": "https://hooks/x",
                "queued": 1,
                "delivered": 2,
                "dropped": 0,
                "last_error": "503",
            },
            "lookahead": {
                "prewarm": {
                    "armed": {
                        "fires_at": "2026-12-02T06:50:00+00:00",
                        "to": "b",
                        "at": "2026-12-02T07:00:00+00:00",
                    }
                }
            },
        },
    }


def test_status_text_writes_times_as_the_ledger_table_does(kolkata: None) -> None:
    text = render_status(full_status())
    # no ISO time left but the calendar exception's end (docs/schedule.md shows it so: the report)
    assert re.findall(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}", text) == ["2026-12-26T00:00"], text
    assert "active:   a since 2026-12-01 23:47" in text, text
    assert "at 2026-12-01 23:47 (manual by alice)" in text, text  # the last switch
    assert "mode:     override b until 2026-12-02 13:30" in text, text
    assert "next:     b at 2026-12-02 12:30" in text, text
    assert "until 2026-12-26T00:00:00+01:00)" in text, text  # ISO until docs/schedule.md changes (the report)
    assert "deferred: deferred until 2026-12-01 23:57 at the latest" in text, text
    assert "ahead:    prewarm at 2026-12-02 12:20, before the switch to b at 2026-12-02 12:30" in text, text
    assert "ledger:   new chain since 2026-12-01 23:30" in text, text


def test_the_status_time_is_the_ledger_tables_time(kolkata: None) -> None:
    for iso in ("2026-12-01T18:17:06.763334+00:00", "2026-07-01T23:59:59+02:00", "2026-03-01T00:00:00"):
        t = datetime.fromisoformat(iso)
        assert local_time(iso) == ledger_local_time(t if t.tzinfo else t.replace(tzinfo=timezone.utc)), iso


def test_status_json_keeps_iso_times(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lightclient, "get_status", lambda bus, *a, **k: full_status())
    r = run(config, "status", "--json")
    s = json.loads(r.output)
    assert s["since"] == "2026-12-01T18:17:06.763334+00:00"
    assert s["last_switch"]["finished_at"] == "2026-12-01T18:17:06.763334+00:00"


# ------------------------------------------------------------------ no None


def _paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every key path of a JSON-like value, leaves and branches."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*path, k)
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield (*path, i)
            yield from _paths(v, (*path, i))


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    doc = copy.deepcopy(doc)
    target = doc
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    return doc


FULL = full_status()
PATHS = list(_paths(FULL))


@pytest.mark.parametrize("path", PATHS, ids=lambda p: ".".join(map(str, p)))
def test_status_text_shows_no_none_for_a_missing_value(path: tuple[Any, ...]) -> None:
    """Each value of the report in turn is null (an older daemon, a part that could not be read)."""
    text = render_status(_set(FULL, path, None))
    assert python_in(text) == [], text


def test_status_text_shows_an_error_without_its_repr() -> None:
    s = _set(FULL, ("ledger",), {"state": "unreadable", "pending": 0,
                                 "error": "LedgerError('the ledger /x/ledger.db is not a database')"})  # fmt: skip
    text = render_status(s)
    assert "ledger:   unreadable (0 pending) the ledger /x/ledger.db is not a database" in text, text
    assert python_in(text) == []


def test_status_text_of_a_daemon_down_without_its_reason() -> None:
    text = render_status({"daemon": {"running": False}, "backends": {}, "gpus": []})
    assert text.startswith("daemon:   DOWN: not running"), text
    assert python_in(text) == []


def test_check_without_nvml_says_why_not_none() -> None:
    report = {
        "config": {"path": "/etc/gpushift/gpushift.toml", "ok": True},
        "schedule": {"ok": True, "path": None},
        "gpu": {
            "simulated": False,
            "driver_version": None,
            "cuda_version": None,
            "gpus": [],
            "error": "NVML: init failed: NVML Shared Library Not Found",
        },
        "units": {},
        "findings": [],
        "errors": 0,
        "warnings": 0,
    }
    text = check._render(report)
    assert "GPUs  UNREADABLE: NVML: init failed: NVML Shared Library Not Found" in text, text
    assert python_in(text) == [], text
    report["gpu"] = {"driver_version": "550.120", "cuda_version": None,
                     "gpus": [{"index": 0, "name": "H100", "compute_capability": None}]}  # fmt: skip
    text = check._render(report)
    assert "GPUs  driver 550.120: GPU 0 H100 sm_?" in text, text
    assert python_in(text) == [], text


@pytest.mark.parametrize(
    "result",
    [
        {"ok": True, "message": None},
        {"ok": True, "already": True, "message": None},
        {"ok": False, "outcome": None, "message": None, "error": None},
    ],
)
def test_switch_result_without_a_message_shows_no_none(result: dict[str, Any], capsys: Any) -> None:
    switching.say_finished(result, time.monotonic(), as_json=False)
    out = capsys.readouterr()
    assert python_in(out.out + out.err) == [], out


# ------------------------------------------------------------------ --help


def _groups() -> list[tuple[tuple[str, ...], click.Group]]:
    found: list[tuple[tuple[str, ...], click.Group]] = []

    def walk(cmd: click.Command, path: tuple[str, ...], ctx: click.Context) -> None:
        if isinstance(cmd, click.Group):
            found.append((path, cmd))
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                walk(sub, (*path, name), click.Context(sub, parent=ctx, info_name=name))

    walk(main, (), click.Context(main, info_name="gpushift"))
    return found


GROUPS = _groups()


@pytest.mark.parametrize(("path", "group"), GROUPS, ids=lambda g: " ".join(g) if isinstance(g, tuple) else "")
def test_help_summaries_are_whole_short_sentences(path: tuple[str, ...], group: click.Group) -> None:
    """Click cuts a summary made from the docstring at 45 characters (its default, which shell
    completion uses too) or at the terminal's width: each command says its summary itself, short
    enough to be shown whole, and ``--help`` shows it on one line."""
    ctx = click.Context(group, info_name="gpushift")
    out = CliRunner().invoke(main, [*path, "--help"], env={"NO_COLOR": "1"}, terminal_width=80).output
    rows = out.split("Commands:\n", 1)[1].splitlines()
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        summary = cmd.get_short_help_str()  # click's default limit: 45
        assert summary == cmd.short_help, (name, summary)
        assert len(summary) <= 45 and summary.endswith(".") and not summary.endswith("..."), (name, summary)
        assert summary[0].isupper(), (name, summary)
        assert any(row.split() == [name, *summary.split()] for row in rows), (name, out)
        if not path and name in _LAZY:
            assert _LAZY[name][2] == summary, name  # the summary shown before the module is loaded

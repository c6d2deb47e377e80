"""gpushift.daemon.logs: what one log call becomes in the journal (fields, priority, bounds), when the daemon
logs there at all, and that a failing journal never costs a line or raises."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from gpushift.daemon import logs
from gpushift.host import journal
from tests.support.journal_format import parse_entry, stand_in_socket


@pytest.fixture
def journald(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket standing in for journald's, and its path; logging is reset afterwards."""
    path = str(tmp_path / "socket")
    try:
        with stand_in_socket(path) as rx:
            yield rx, path
    finally:
        structlog.reset_defaults()
        root = logging.getLogger()
        for h in list(root.handlers):
            if type(h).__name__ == "_JournalHandler":
                root.removeHandler(h)


def entry(rx: socket.socket) -> dict[str, str]:
    """The next entry the stand-in journald got, as {name: value}."""
    return {name: value.decode() for name, value in parse_entry(rx.recv(1 << 20))}


def test_logs_switch_line_carries_ticket_phase_backend_as_fields(journald) -> None:
    rx, path = journald
    log = logs.setup("info", journal_socket=path)
    log.info("switch_phase", ticket="4f2a", phase="stop", detail="stopping gs-a.service")
    e = entry(rx)
    assert e["GPUSHIFT_TICKET"] == "4f2a" and e["GPUSHIFT_PHASE"] == "stop"
    assert e["GPUSHIFT_EVENT"] == "switch_phase" and e["GPUSHIFT_DETAIL"] == "stopping gs-a.service"
    assert e["SYSLOG_IDENTIFIER"] == "gpushift" and e["PRIORITY"] == "6"
    assert e["MESSAGE"] == 'switch_phase ticket=4f2a phase=stop detail="stopping gs-a.service"'
    # the journal stamps the entry itself; the level is PRIORITY
    assert "GPUSHIFT_TIMESTAMP" not in e and "GPUSHIFT_LEVEL" not in e


def test_logs_finished_line_names_outcome_and_backend_from_to(journald) -> None:
    rx, path = journald
    log = logs.setup("info", journal_socket=path)
    result = {
        "ticket": "9c1",
        "ok": True,
        "outcome": "ok",
        "from": "a",
        "to": "b",
        "failed_phase": None,
        "durations_s": {"stop": 0.5, "ready": 1.25},
        "ledger_id": 7,
    }
    log.info("switch_finished", **result)
    e = entry(rx)
    assert e["GPUSHIFT_OUTCOME"] == "ok" and e["GPUSHIFT_BACKEND"] == "b" and e["GPUSHIFT_TO"] == "b"
    assert e["GPUSHIFT_FROM"] == "a" and e["GPUSHIFT_OK"] == "true" and e["GPUSHIFT_LEDGER_ID"] == "7"
    assert json.loads(e["GPUSHIFT_DURATIONS_S"]) == {"stop": 0.5, "ready": 1.25}
    assert "GPUSHIFT_FAILED_PHASE" not in e  # None: left out
    assert 'durations_s={"stop":0.5,"ready":1.25}' in e["MESSAGE"]


@pytest.mark.parametrize(
    ("fields", "backend"),
    [({"backend": "x", "to": "y"}, "x"), ({"to": "y"}, "y"), ({"target": "z"}, "z"), ({}, None)],
)
def test_logs_backend_field_comes_from_backend_then_to_then_target(fields, backend) -> None:
    got = dict(logs.journal_fields({"event": "e", "level": "info", **fields}))
    assert got.get("GPUSHIFT_BACKEND") == backend


@pytest.mark.parametrize(
    ("method", "priority"),
    [("debug", "7"), ("info", "6"), ("warning", "4"), ("error", "3"), ("critical", "2")],
)
def test_logs_priority_follows_the_level(journald, method: str, priority: str) -> None:
    rx, path = journald
    log = logs.setup("debug", journal_socket=path)
    getattr(log, method)("something_happened")
    assert entry(rx)["PRIORITY"] == priority


def test_logs_level_filter_applies_in_journal_mode(journald) -> None:
    rx, path = journald
    log = logs.setup("warning", journal_socket=path)
    log.info("too_chatty")
    log.warning("worth_it")
    assert entry(rx)["GPUSHIFT_EVENT"] == "worth_it"


def test_logs_exception_goes_as_a_multi_line_field_at_error(journald) -> None:
    rx, path = journald
    log = logs.setup("info", journal_socket=path)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("switch_crashed", ticket="t1")
    e = entry(rx)
    assert e["PRIORITY"] == "3" and e["GPUSHIFT_TICKET"] == "t1"
    assert e["GPUSHIFT_EXCEPTION"].startswith("Traceback") and "RuntimeError: boom" in e["GPUSHIFT_EXCEPTION"]
    assert "\n" in e["GPUSHIFT_EXCEPTION"]
    assert e["MESSAGE"].splitlines()[0] == "switch_crashed ticket=t1"
    assert "RuntimeError: boom" in e["MESSAGE"]


def test_logs_every_other_key_becomes_a_sanitised_field() -> None:
    got = dict(logs.journal_fields({"event": "e", "level": "info", "failed-phase": "stop", "héllo": 1}))
    assert got["GPUSHIFT_FAILED_PHASE"] == "stop" and got["GPUSHIFT_H_LLO"] == "1"
    assert all(journal.valid_name(name) for name in got)


def test_logs_long_value_is_cut_to_the_bound_and_says_so() -> None:
    huge = "é" * logs.VALUE_MAX_BYTES  # two bytes each: the cut falls inside a character
    got = dict(logs.journal_fields({"event": "ledger_pending", "level": "warning", "record": huge}))
    value = got["GPUSHIFT_RECORD"]
    assert isinstance(value, str)
    raw = value.encode()
    assert len(raw) <= logs.VALUE_MAX_BYTES
    assert value.endswith(f"[cut: {2 * logs.VALUE_MAX_BYTES} bytes in all]")
    assert value.startswith("é" * 1000)
    assert len(got["MESSAGE"].encode()) <= logs.VALUE_MAX_BYTES


def test_logs_value_below_the_bound_is_kept_whole() -> None:
    record = {"ticket": "t", "argv": ["x"] * 2000}
    got = dict(logs.journal_fields({"event": "ledger_pending", "level": "warning", "record": record}))
    assert json.loads(got["GPUSHIFT_RECORD"]) == record


def test_logs_falls_back_to_a_json_line_when_the_journal_is_gone(tmp_path: Path) -> None:
    out = io.StringIO()
    try:
        log = logs.setup("info", stream=out, journal_socket=str(tmp_path / "no-journald"))
        log.warning("ledger_pending", ticket="t7", record={"reason": "disk is full"})
        log.info("switch_phase", ticket="t7", phase="stop")
    finally:
        structlog.reset_defaults()
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [x["event"] for x in lines] == ["ledger_pending", "switch_phase"]
    assert lines[0]["record"] == {"reason": "disk is full"} and lines[0]["ticket"] == "t7"
    assert lines[0]["level"] == "warning" and "journal_error" in lines[0]


def test_logs_unrenderable_value_still_leaves_a_line(tmp_path: Path) -> None:
    class Hostile:
        def __str__(self) -> str:
            raise RuntimeError("no str for you")

    out = io.StringIO()
    try:
        log = logs.setup("info", stream=out, journal_socket=str(tmp_path / "no-journald"))
        log.info("odd_value", value=Hostile())  # must not raise
    finally:
        structlog.reset_defaults()
    assert json.loads(out.getvalue())["event"] == "odd_value"


def test_logs_json_lines_when_not_connected_to_the_journal(monkeypatch) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    out = io.StringIO()
    try:
        log = logs.setup("info", stream=out)
        log.info("switch_phase", ticket="t1", phase="stop")
    finally:
        structlog.reset_defaults()
    line = json.loads(out.getvalue())
    assert line["event"] == "switch_phase" and line["ticket"] == "t1" and line["level"] == "info"
    assert "timestamp" in line


def test_logs_setup_picks_the_journal_when_stderr_is_the_journal_stream(journald, monkeypatch) -> None:
    rx, path = journald
    st = os.fstat(2)
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    monkeypatch.setattr(journal, "SOCKET_PATH", path)
    log = logs.setup("info")
    log.info("daemon_ready", pid=1)
    assert entry(rx)["GPUSHIFT_EVENT"] == "daemon_ready"


def test_logs_stdlib_loggers_reach_the_journal_too(journald) -> None:
    rx, path = journald
    logs.setup("info", journal_socket=path)
    logging.getLogger("gpushift.host.nvml").warning("nvml_memory_v2_missing fallback=v1")
    e = entry(rx)
    assert e["GPUSHIFT_EVENT"] == "nvml_memory_v2_missing" and e["PRIORITY"] == "4"
    assert e["GPUSHIFT_LOGGER"] == "gpushift.host.nvml"
    assert e["MESSAGE"] == "gpushift.host.nvml: nvml_memory_v2_missing fallback=v1"


def test_logs_after_a_failure_the_journal_is_left_alone_for_a_while_then_used_again(tmp_path: Path) -> None:
    path = str(tmp_path / "socket")
    now = [100.0]
    out = io.StringIO()
    logger = logs.JournalLogger(journal.JournalSocket(path), out, monotonic=lambda: now[0])
    logger.msg({"event": "first", "level": "info", "ticket": "t"})  # no journald yet
    with stand_in_socket(path) as rx:
        now[0] += logs.RETRY_AFTER_S / 2
        logger.msg({"event": "second", "level": "info"})  # not tried: a stalled journald costs one wait
        now[0] += logs.RETRY_AFTER_S
        logger.msg({"event": "third", "level": "info"})
        assert entry(rx)["GPUSHIFT_EVENT"] == "third"
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [x["event"] for x in lines] == ["first", "second"]
    assert "not tried" in lines[1]["journal_error"] and "not tried" not in lines[0]["journal_error"]

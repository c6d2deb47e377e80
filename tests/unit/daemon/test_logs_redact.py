"""The daemon's log lines never carry a credential (gpushift/daemon/logs.py's redacting processor and
filter): a backend's argv, an environment, a URL, a message, a traceback, an object's text — in
JSON-lines mode, in journal mode (its fallback line), and from the standard library's loggers."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
import structlog

from gpushift.daemon import logs

SECRETS = ("s3cret", "hf_x", "pr0bepw", "sk-abcdef")


class Launch:
    def __str__(self) -> str:
        return "Launch(argv=['vllm', '--api-key', 's3cret'])"


def emit(log: object) -> None:
    log.info(  # type: ignore[attr-defined]
        "switch_requested",
        reason="rotate --api-key s3cret",
        argv=["vllm", "serve", "m", "--api-key", "s3cret"],
        environment={"HF_TOKEN": "hf_x", "PORT": "8000"},
        health="http://probe:pr0bepw@127.0.0.1:8000/health",
        launch=Launch(),
    )
    try:
        raise RuntimeError("backend said: Authorization: Bearer sk-abcdef")
    except RuntimeError:
        log.exception("switch_crashed")  # type: ignore[attr-defined]


@pytest.mark.parametrize("journal", [False, True])
def test_logs_lines_carry_no_credential(tmp_path: Path, journal: bool) -> None:
    out = io.StringIO()
    try:
        socket = str(tmp_path / "no-journald") if journal else None  # journal mode: its fallback line
        emit(logs.setup("info", stream=out, journal_socket=socket))
    finally:
        structlog.reset_defaults()
    text = out.getvalue()
    assert "switch_requested" in text and "switch_crashed" in text and "RuntimeError" in text
    assert not any(s in text for s in SECRETS), text
    assert "PORT" in text and "8000" in text  # what is not a credential stays


def test_logs_standard_library_loggers_are_redacted_too(caplog: pytest.LogCaptureFixture) -> None:
    try:
        logs.setup("info", stream=io.StringIO())
        with caplog.at_level(logging.WARNING):
            logging.getLogger("gpushift.nvml").warning("holder cmdline: %s", "vllm --api-key s3cret")
            try:
                raise OSError("GET http://probe:pr0bepw@127.0.0.1/ failed")
            except OSError:
                logging.getLogger("pydbus.registration").exception("handler crashed")
    finally:
        structlog.reset_defaults()
    assert "holder cmdline: vllm --api-key ***" in caplog.text
    assert "OSError" in caplog.text and not any(s in caplog.text for s in SECRETS)

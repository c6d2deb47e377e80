"""The shared logging (gpushift/host/logs.py) names the process it logs for: the daemon's lines are
``SYSLOG_IDENTIFIER=gpushift`` as before, the front door's ``gpushift-frontdoor``, with the same
``GPUSHIFT_*`` fields."""

from __future__ import annotations

from typing import Any

from gpushift.daemon import logs as daemon_logs
from gpushift.host import logs


class _Socket:
    def __init__(self) -> None:
        self.sent: list[list[tuple[str, Any]]] = []

    def send(self, fields: list[tuple[str, Any]]) -> None:
        self.sent.append(fields)


def test_the_identifier_is_the_daemons_unless_another_is_named() -> None:
    line = {"event": "frontdoor_serving", "level": "info", "listen": ["[::]:8000"]}
    assert dict(logs.journal_fields(line))["SYSLOG_IDENTIFIER"] == "gpushift"
    fields = dict(logs.journal_fields(line, "gpushift-frontdoor"))
    assert fields["SYSLOG_IDENTIFIER"] == "gpushift-frontdoor"
    assert fields["GPUSHIFT_EVENT"] == "frontdoor_serving" and fields["GPUSHIFT_LISTEN"] == '["[::]:8000"]'


def test_a_journal_logger_sends_its_own_identifier() -> None:
    sock = _Socket()
    out = logs.JournalLogger(sock, identifier="gpushift-frontdoor")  # type: ignore[arg-type]
    out.msg({"event": "frontdoor_stopped", "level": "info"})
    assert dict(sock.sent[0])["SYSLOG_IDENTIFIER"] == "gpushift-frontdoor"


def test_the_daemons_module_is_the_shared_one() -> None:
    assert daemon_logs.setup is logs.setup and daemon_logs.journal_fields is logs.journal_fields

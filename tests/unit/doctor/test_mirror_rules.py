"""`gpushift check`'s mirror finding (gpushift/doctor/mirror.py) and its section of the report
(gpushift/cli/check_mirror.py) with the connection replaced: reachable with the schema's version,
or not reachable with the reason, as a warning; no section without [mirror] url."""

from __future__ import annotations

from typing import Any

import pytest

from gpushift.cli import check_mirror
from gpushift.config.schema import parse
from gpushift.doctor import mirror as rules
from gpushift.errors import FleetError
from gpushift.fleet import db, schema

BACKEND = '[backends.a]\nunit = "a.service"\nhealth_url = "http://127.0.0.1:8001/health"\n'
MIRROR = '[mirror]\nurl = "postgresql://gs@db.lan:5433/fleet"\nconnect_timeout_s = 3\n'


def test_mirror_reachable_has_no_finding_and_names_the_schema_version() -> None:
    facts = rules.MirrorFacts("gs@db.lan:5433/fleet", True, schema_version=1, elapsed_s=0.04)
    assert rules.findings(facts) == []
    assert rules.summary(facts, 1) == "gs@db.lan:5433/fleet: reachable, schema version 1 (0.04 s)"
    assert "no gpushift schema yet" in rules.summary(rules.MirrorFacts("w", True, schema_version=0), 1)
    assert "newer than this gpushift's 1" in rules.summary(rules.MirrorFacts("w", True, schema_version=2), 1)


def test_mirror_unreachable_is_a_warning_with_the_reason() -> None:
    facts = rules.MirrorFacts("gs@db.lan:5433/fleet", False, error="connection refused", connect_timeout_s=3)
    [f] = rules.findings(facts)
    assert (f.severity, f.code, f.backend) == ("warning", "mirror-unreachable", "mirror")
    assert not f.is_error
    assert "gs@db.lan:5433/fleet is not reachable: connection refused" in f.message
    assert "connect_timeout_s (3 s)" in f.hint and "switches are not affected" in f.hint
    assert rules.summary(facts, 1) == "gs@db.lan:5433/fleet: NOT REACHABLE: connection refused"


class FakeConn:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_check_mirror_section_reachable(monkeypatch: pytest.MonkeyPatch) -> None:
    conn = FakeConn()
    seen: dict[str, Any] = {}

    def connect(m: Any, url: Any = None, application: str = "") -> FakeConn:
        seen.update(timeout=m.connect_timeout_s, application=application)
        return conn

    monkeypatch.setattr(db, "connect", connect)
    monkeypatch.setattr(schema, "version", lambda c: 1)
    sec = check_mirror.collect(parse(MIRROR + BACKEND))
    assert sec is not None
    assert seen == {"timeout": 3, "application": "gpushift-check"}  # the configured deadline
    assert conn.closed
    assert (sec["reachable"], sec["schema_version"], sec["errors"], sec["warnings"]) == (True, 1, 0, 0)
    assert sec["where"] == "gs@db.lan:5433/fleet" and sec["findings"] == []
    assert check_mirror.render(sec)[0].startswith(
        "mirror    gs@db.lan:5433/fleet: reachable, schema version 1"
    )


def test_check_mirror_section_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    def connect(m: Any, url: Any = None, application: str = "") -> FakeConn:
        raise FleetError("cannot reach the central database gs@db.lan:5433/fleet: connection refused")

    monkeypatch.setattr(db, "connect", connect)
    sec = check_mirror.collect(parse(MIRROR + BACKEND))
    assert sec is not None
    assert (sec["reachable"], sec["error"], sec["errors"], sec["warnings"]) == (
        False,
        "connection refused",
        0,
        1,
    )
    lines = check_mirror.render(sec)
    assert lines[0] == "mirror    gs@db.lan:5433/fleet: NOT REACHABLE: connection refused"
    assert "warning [mirror-unreachable]" in lines[1]


def test_check_mirror_no_url_no_section() -> None:
    assert check_mirror.collect(parse(BACKEND)) is None
    assert check_mirror.render(None) == []


def test_check_mirror_credential_outside_the_service_is_not_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    def connect(m: Any, url: Any = None, application: str = "") -> FakeConn:
        raise AssertionError("no connection without the credential")

    monkeypatch.setattr(db, "connect", connect)
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    cfg = parse(MIRROR + 'password_credential = "mirror.password"\n' + BACKEND)
    sec = check_mirror.collect(cfg)
    assert sec is not None and sec["reachable"] is False and (sec["errors"], sec["warnings"]) == (0, 1)
    [f] = sec["findings"]
    assert (f["severity"], f["code"]) == ("warning", "mirror-not-checked")
    assert "LoadCredential=mirror.password:" in f["hint"]
    assert check_mirror.render(sec)[0].startswith(
        "mirror    gs@db.lan:5433/fleet: NOT CHECKED: the password is"
    )

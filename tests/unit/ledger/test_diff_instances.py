"""``gpushift ledger diff`` compares a backend of several instances instance by instance (issue 23)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from gpushift.ledger.diff import describe_change, diff_records
from gpushift.values import SwitchRecord


def _launch(*instances: dict[str, Any]) -> SwitchRecord:
    return SwitchRecord(
        trigger="manual",
        requested_by="alice",
        reason="t",
        from_backend="day",
        to_backend="night",
        started_at=datetime(2026, 3, 2, 12, tzinfo=timezone.utc),
        outcome="ok",
        argv_running=["/usr/local/bin/llama-server", "--port", "8081"],
        extra={"instances": list(instances)},
    )


def _inst(n: int, **kw: Any) -> dict[str, Any]:
    port = 8081 + n
    return {"unit": f"l@{n}.service", "gpus": [n], "port": port, "outcome": "ready",
            "argv": ["/usr/local/bin/llama-server", "--port", str(port), "-c", "8192"], **kw}  # fmt: skip


def test_diff_same_instances_is_no_change() -> None:
    assert diff_records(_launch(_inst(0), _inst(1)), _launch(_inst(0), _inst(1))) == []


def test_diff_names_each_instance_s_own_change() -> None:
    old = _launch(_inst(0), _inst(1))
    new = _launch(
        _inst(0),
        _inst(1, outcome="failed", argv=["/usr/local/bin/llama-server", "--port", "8082", "-c", "4096"]),
        _inst(2),
    )
    changes = [(c["area"], c["change"], c["name"]) for c in diff_records(old, new)]
    assert changes == [
        ("instance", "changed", "l@1.service outcome"),
        ("instance", "changed", "l@1.service argv"),
        ("instance", "added", "l@2.service"),
    ]
    lines = [describe_change(c) for c in diff_records(old, new)]
    assert lines[0] == "instance        l@1.service outcome: ready → failed"
    assert lines[2] == "instance added  l@2.service GPU 2, port 8083, ready"


def test_diff_an_instance_s_secret_shows_as_a_digest_never_its_value() -> None:
    key = ["--api-key", "s3cret-value"]
    old = _launch(_inst(0, argv=["/x", *key]))
    new = _launch(_inst(0, argv=["/x", "--api-key", "other-value"]))
    (c,) = diff_records(old, new)
    assert c["name"] == "l@0.service argv"
    assert "s3cret" not in str(c) and "other-value" not in str(c)

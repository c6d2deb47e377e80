"""The soak's own checks (tests/support/soak.py) fire on what they are there to catch: a witness
line naming another backend or a foreign holder, a start with no ledger row around it (with the
daemon's clock moved), and the schedule model's choice at and around its boundaries."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

from tests.support import soak


def make_soak(tmp_path: Path) -> soak.Soak:
    backends = {
        "a": SimpleNamespace(unit="gs-a.service", port=1),
        "b": SimpleNamespace(unit="gs-b.service", port=2),
    }
    env = SimpleNamespace(backends=backends)
    return soak.Soak(
        env, 1, tmp_path / "w.jsonl", tmp_path / "clock", tmp_path / "filler", tmp_path / "log.jsonl"
    )


def witness(path: Path, pid: int, unit: str, others: list[dict[str, object]], t: float = 1000.0) -> None:
    with open(path, "a") as f:
        line = {
            "pid": pid,
            "cgroup": f"/x.slice/app.slice/{unit}",
            "time": t,
            "devices": [],
            "others": others,
        }
        f.write(json.dumps(line) + "\n")


def test_witness_of_another_backend_or_a_foreign_holder_is_a_violation(tmp_path: Path) -> None:
    s = make_soak(tmp_path)
    witness(s.witness, 10, "gs-a.service", [])
    witness(s.witness, 11, "gs-b.service", [{"pid": 10, "cgroup": "/x.slice/app.slice/gs-a.service"}])
    witness(s.witness, 12, "gs-a.service", [{"pid": 99, "cgroup": "/user.slice/session-1.scope"}])
    s.check_witnesses()
    assert [w["backend"] for w in s.unmatched] == ["a", "b", "a"]
    assert len(s.stats.violations) == 2
    assert ": one_backend: b (pid 11)" in s.stats.violations[0]
    assert ": vram_free_at_start: a (pid 12)" in s.stats.violations[1]
    s.check_witnesses()  # a line is read once
    assert len(s.unmatched) == 3 and s.stats.starts == 3


def test_a_start_is_recorded_only_by_a_row_about_its_backend_around_it(tmp_path: Path) -> None:
    s = make_soak(tmp_path)
    # the daemon's clock runs 2 h ahead since real time 500: rows carry its (fake) times
    s.offsets.append((500.0, 7200.0))
    fake = datetime.fromtimestamp(1000 + 7200, timezone.utc)
    start = {"backend": "b", "time": 1000.5, "pid": 5}
    row = {"from": "a", "to": "b", "started_at": fake.isoformat(), "finished_at": None}
    assert s.covers(row, start)  # an open row covers it
    closed = dict(row, finished_at=(fake + timedelta(seconds=3)).isoformat())
    assert s.covers(closed, start)
    assert s.covers(dict(closed, to="a", **{"from": "b"}), start)  # a rollback row names it as from
    assert not s.covers(dict(closed, to="a", **{"from": "a"}), start)
    later = dict(closed, started_at=(fake + timedelta(seconds=10)).isoformat())
    assert not s.covers(later, start)
    earlier = dict(closed, finished_at=(fake - timedelta(seconds=10)).isoformat())
    assert not s.covers(earlier, start)


def test_schedule_model_follows_its_two_entries_and_the_next_boundary() -> None:
    day = datetime(2026, 12, 1, tzinfo=timezone.utc)
    assert soak.scheduled(day + timedelta(hours=5, minutes=59)) == "b"
    assert soak.scheduled(day + timedelta(hours=6)) == "a"
    assert soak.scheduled(day + timedelta(hours=17, minutes=59)) == "a"
    assert soak.scheduled(day + timedelta(hours=18)) == "b"
    assert soak.next_boundary(day + timedelta(hours=6)) == day + timedelta(hours=18)
    assert soak.next_boundary(day + timedelta(hours=19)) == day + timedelta(days=1, hours=6)


def test_override_model_ends_at_its_boundary_and_a_hold_does_not(tmp_path: Path) -> None:
    s = make_soak(tmp_path)
    now = s.fake_now()
    s.override = ("b", now - timedelta(seconds=1))
    assert s.wanted() == soak.scheduled(now) and s.override is None
    s.override = ("b", None)
    s.offset_s = 30 * 24 * 3600.0
    assert s.wanted() == "b"


def test_report_goes_between_its_markers_only(tmp_path: Path) -> None:
    doc = tmp_path / "r.md"
    doc.write_text(f"head\n{soak.BEGIN}\nOLD BODY\n{soak.END}\ntail\n")
    stats = soak.Stats()
    stats.events["switch"] = 3
    stats.violations.append("event 2 (switch): serves_wanted: x")
    body = soak.report_markdown(stats, 7, "make soak", "abc1234")
    soak.write_report(doc, body)
    text = doc.read_text()
    assert text.startswith(f"head\n{soak.BEGIN}\n") and text.endswith(f"{soak.END}\ntail\n")
    assert "OLD BODY" not in text and "| `switch` | 3 |" in text and "**1 invariant violations**" in text
    assert "| `serves_wanted` | 0 | 1 |" in text


def test_ok_rows_with_the_impostor_s_version_are_found_in_the_ledger_and_the_spool(tmp_path: Path) -> None:
    import sqlite3

    s = make_soak(tmp_path)
    s.env.state_dir, s.env.runtime_dir = tmp_path / "state", tmp_path / "run"
    s.env.state_dir.mkdir()
    db = sqlite3.connect(s.env.state_dir / "ledger.db")
    db.execute("CREATE TABLE switches (id INTEGER PRIMARY KEY, outcome TEXT, backend_version TEXT)")
    rows = [(1, "ok", "1.0.0"), (2, "rolled_back", "6.6.6-impostor"), (3, "ok", "6.6.6-impostor")]
    db.executemany("INSERT INTO switches VALUES (?, ?, ?)", rows)
    db.commit()
    db.close()
    assert s.ok_rows_with_version("6.6.6-impostor") == [3]
    spool = s.env.runtime_dir / "ledger-pending"
    spool.mkdir(parents=True)
    (spool / "1.json").write_text(
        json.dumps({"record": {"outcome": "ok", "backend_version": "6.6.6-impostor"}})
    )
    assert s.ok_rows_with_version("6.6.6-impostor") == [3, -1]
    assert s.ok_rows_with_version("1.0.0") == [1]

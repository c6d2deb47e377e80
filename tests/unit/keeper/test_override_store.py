"""override.json when the state directory cannot be written (a full disk): the override goes to the
runtime directory's fallback, which a restart reads instead of the older file, and is written to the
state directory once it can be (gpushift/keeper/store.py)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from gpushift.keeper import Override
from gpushift.keeper.store import JsonOverrideStore
from gpushift.values import Mode

SET_AT = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
UNTIL = datetime(2026, 3, 2, 18, 0, tzinfo=timezone.utc)
BACKENDS = {"day", "night"}


def override(backend: str) -> Override:
    return Override(Mode.OVERRIDE, backend, UNTIL, "root", SET_AT, "test")


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, object]]] = []

    def error(self, event: str, **kw: object) -> None:
        self.events.append((event, kw))

    info = error


def stores(tmp_path: Path) -> tuple[Path, Path, Path]:
    state, run = tmp_path / "state", tmp_path / "run"
    state.mkdir()
    run.mkdir()
    return state, run / "override.json", state / "override.json"


def break_dir(state: Path) -> None:
    """The state directory can no longer be written: its place is taken by a file."""
    for p in state.iterdir():
        p.unlink()
    state.rmdir()
    state.write_text("not a directory")


def mend_dir(state: Path) -> None:
    state.unlink()
    state.mkdir()


def test_an_unsaved_override_is_read_back_from_the_fallback_not_the_older_file(tmp_path: Path) -> None:
    state, fallback, path = stores(tmp_path)
    log = Log()
    store = JsonOverrideStore(path, log, BACKENDS, fallback=fallback)
    store.save(override("night"))
    old = path.read_text()
    # the disk fills: the next override cannot replace the file (here: its directory is unusable)
    (tmp_path / "old.json").write_text(old)
    break_dir(state)
    store.save(override("day"))
    assert store.error is not None and "cannot save" in store.error and str(fallback) in store.error
    assert [e for e, _ in log.events] == ["override_not_saved"]
    assert json.loads(fallback.read_text())["backend"] == "day"
    # a restart: the fallback, newer than whatever the state directory holds, wins
    again = JsonOverrideStore(path, Log(), BACKENDS, fallback=fallback)
    assert again.load() == override("day")
    # retried every reconcile: quietly while it still fails, saved once it can be
    assert store.flush() is False and [e for e, _ in log.events] == ["override_not_saved"]
    mend_dir(state)
    assert store.flush() is True
    assert store.error is None and not fallback.exists()
    assert JsonOverrideStore(path, backends=BACKENDS).load() == override("day")
    assert [e for e, _ in log.events] == ["override_not_saved", "override_saved"]
    assert store.flush() is False  # nothing left to write


def test_a_resume_on_a_full_disk_is_not_undone_by_a_restart(tmp_path: Path) -> None:
    state, fallback, path = stores(tmp_path)
    store = JsonOverrideStore(path, backends=BACKENDS, fallback=fallback)
    store.save(override("night"))
    stale = path.read_text()
    break_dir(state)
    store.save(None)  # gpushift resume: back to the schedule
    restarted = JsonOverrideStore(path, backends=BACKENDS, fallback=fallback)
    mend_dir(state)
    path.write_text(stale)  # what the state directory still held
    assert restarted.load() is None  # not the night override of before
    assert restarted.flush() is True  # the restarted daemon writes what its fallback held
    assert JsonOverrideStore(path, backends=BACKENDS).load() is None


def test_without_a_fallback_the_override_holds_in_memory_and_says_so(tmp_path: Path) -> None:
    state, _, path = stores(tmp_path)
    break_dir(state)
    store = JsonOverrideStore(path, backends=BACKENDS)
    store.save(override("day"))
    assert store.error is not None and "in memory only" in store.error


def test_a_damaged_fallback_is_ignored_for_the_state_directory_file(tmp_path: Path) -> None:
    _, fallback, path = stores(tmp_path)
    JsonOverrideStore(path, backends=BACKENDS).save(override("night"))
    fallback.write_text("{not json")
    store = JsonOverrideStore(path, Log(), BACKENDS, fallback=fallback)
    assert store.load() == override("night")
    assert store.ignored is None

"""override.json that is no regular file of the state directory (gpushift/keeper/store.py): a FIFO,
a symlink out of the directory — never opened as such, moved aside, ignored and said so; the next
save writes a regular file again.  A link inside the directory is still read."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from unittest.mock import MagicMock

from gpushift.keeper import Override
from gpushift.keeper.store import JsonOverrideStore
from gpushift.values import Mode

SET_AT = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
VALID = {
    "mode": "hold",
    "backend": "night",
    "until": None,
    "set_by": "mallory",
    "set_at": SET_AT.isoformat(),
    "reason": "planted",
    "source": "manual",
    "when_idle": False,
}


def Log() -> MagicMock:  # noqa: N802 - stands in for a class
    """A log that records its calls (``log.error.call_args_list``)."""
    return MagicMock()


def test_override_linked_from_outside_the_state_directory_is_moved_aside(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "planted.json").write_text(json.dumps(VALID))
    (state / "override.json").symlink_to(tmp_path / "planted.json")
    log = Log()
    store = JsonOverrideStore(state / "override.json", log, {"day", "night"})
    assert store.load() is None
    (moved,) = state.glob("override.json.bad-*")
    assert os.path.islink(moved) and (tmp_path / "planted.json").exists()
    assert (
        store.ignored and store.ignored.startswith("a symbolic link out of") and store.moved_to == str(moved)
    )
    ((args, fields),) = log.error.call_args_list
    assert args == ("override_ignored",) and fields["moved_to"] == str(moved)
    store.save(Override(Mode.HOLD, "day", None, "root", SET_AT, "by hand"))
    assert store.ignored is None and store.moved_to is None and not os.path.islink(state / "override.json")
    assert json.loads((state / "override.json").read_text())["backend"] == "day"


def test_override_fifo_is_moved_aside(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "override.json")
    store = JsonOverrideStore(tmp_path / "override.json", Log(), {"day", "night"})
    assert store.load() is None
    (moved,) = tmp_path.glob("override.json.bad-*")
    assert moved.is_fifo() and store.ignored == "not a regular file (FIFO)" and store.moved_to == str(moved)


def test_override_link_inside_the_state_directory_is_read(tmp_path: Path) -> None:
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "ov.json").write_text(json.dumps(VALID))
    (tmp_path / "override.json").symlink_to(tmp_path / "saved" / "ov.json")
    ov = JsonOverrideStore(tmp_path / "override.json", Log(), {"day", "night"}).load()
    assert ov is not None and ov.backend == "night"


def test_override_a_wrong_file_stays_for_the_person_to_mend(tmp_path: Path) -> None:
    (tmp_path / "override.json").write_text("{not json")
    store = JsonOverrideStore(tmp_path / "override.json", Log(), {"day", "night"})
    assert store.load() is None and store.ignored and "not valid JSON" in store.ignored
    assert (tmp_path / "override.json").exists() and not list(tmp_path.glob("*.bad-*"))

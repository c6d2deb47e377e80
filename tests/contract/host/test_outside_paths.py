"""Paths named by a backend's command line, read by the root daemon: a FIFO, a symlink to a FIFO,
a device, a socket, an oversized file — the launch description (``launchinfo``) and the doctor's
``config.json`` read (``doctor_io``) never block on them, never open them, and say why they were
skipped.  Real files in a temp directory; every call runs under a deadline in a thread of its own,
and a FIFO is opened for writing at the end, so a reader stuck on it (the bug) is released."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpushift.doctor import facts as doctor_io
from gpushift.host.launchinfo import collect_launch_info, describe_model
from gpushift.values import UnitState

T = TypeVar("T")
DEADLINE_S = 5.0


def within(fn: Callable[[], T], deadline_s: float = DEADLINE_S) -> T:
    """``fn()``, which must return within ``deadline_s`` (it runs in a thread of its own)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(deadline_s)
    if t.is_alive():
        pytest.fail(f"still blocked after {deadline_s} s (a FIFO or device was opened)")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


@pytest.fixture
def fifo(fifos: Callable[[str], Path]) -> Path:
    """A FIFO nobody writes to (released at the end: a reader blocked on it would stay forever)."""
    return fifos("model.gguf")


STATE = UnitState(name="l.service", load_state="loaded", active_state="active", sub_state="running")


def test_launchinfo_fifo_model_is_skipped_not_opened(fifo: Path) -> None:
    m = within(lambda: describe_model("-m", str(fifo)))
    assert m["kind"] == "skipped" and m["skipped"] == "not a regular file (FIFO)"
    assert "fingerprint" not in m


def test_launchinfo_symlink_to_fifo_is_skipped(tmp_path: Path, fifo: Path) -> None:
    link = tmp_path / "current.gguf"
    link.symlink_to(fifo)
    info = within(lambda: collect_launch_info(STATE, ["llama-server", "-m", str(link)]))
    (m,) = info["models"]
    assert m["skipped"] == "not a regular file (FIFO)" and "fingerprint" not in m


def test_launchinfo_device_and_socket_models_are_skipped(tmp_path: Path) -> None:
    sock_path = tmp_path / "model.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock_path))
        info = within(
            lambda: collect_launch_info(
                STATE, ["llama-server", "-m", "/dev/zero", "--mmproj", str(sock_path)]
            )
        )
    dev, sock = info["models"]
    assert dev["skipped"] == "not a regular file (character device)" and "fingerprint" not in dev
    assert sock["skipped"] == "not a regular file (socket)"


def test_launchinfo_fifo_inside_a_model_directory_is_left_out(
    tmp_path: Path, fifos: Callable[[str], Path]
) -> None:
    d = tmp_path / "Qwen"
    d.mkdir()
    (d / "config.json").write_text("{}")
    fifos("Qwen/model.safetensors")
    (m,) = within(lambda: collect_launch_info(STATE, ["vllm", "serve", str(d)]))["models"]
    assert m["kind"] == "dir" and m["files"] == 1 and m["fingerprint"].startswith("fp1:")


def test_launchinfo_unit_file_that_is_a_fifo_is_not_hashed(tmp_path: Path, fifo: Path) -> None:
    info = within(lambda: collect_launch_info(dataclasses.replace(STATE, fragment_path=str(fifo)), []))
    assert info["unit"]["sha256"] is None and info["unit"]["error"] == "not a regular file (FIFO)"


def test_launchinfo_missing_model_is_reported_quickly(tmp_path: Path) -> None:
    m = within(lambda: describe_model("-m", str(tmp_path / "nowhere.gguf")))
    assert m["kind"] == "missing"


# --------------------------------------------------------------------------- the doctor's config.json


def _vllm_dir(tmp_path: Path) -> Path:
    d = tmp_path / "model"
    d.mkdir()
    return d


def test_doctor_io_config_json_fifo_is_not_read(tmp_path: Path, fifos: Callable[[str], Path]) -> None:
    d = _vllm_dir(tmp_path)
    fifos("model/config.json")
    assert within(lambda: doctor_io._checkpoint("vllm", ["vllm", "serve", str(d)], {})) is None


def test_doctor_io_config_json_symlink_to_a_device_is_not_read(tmp_path: Path) -> None:
    d = _vllm_dir(tmp_path)
    (d / "config.json").symlink_to("/dev/zero")
    assert within(lambda: doctor_io._checkpoint("vllm", ["vllm", "serve", str(d)], {})) is None


def test_doctor_io_config_json_over_the_bound_is_not_read(tmp_path: Path) -> None:
    d = _vllm_dir(tmp_path)
    big = {"torch_dtype": "bfloat16", "pad": "x" * (1024 * 1024)}  # valid JSON, just over 1 MiB
    (d / "config.json").write_text(json.dumps(big))
    assert within(lambda: doctor_io._checkpoint("vllm", ["vllm", "serve", str(d)], {})) is None
    (d / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))  # the same, small: read
    facts = within(lambda: doctor_io._checkpoint("vllm", ["vllm", "serve", str(d)], {}))
    assert facts is not None


def test_doctor_io_config_json_that_is_not_an_object_is_ignored(tmp_path: Path) -> None:
    d = _vllm_dir(tmp_path)
    (d / "config.json").write_text("[1, 2]")
    assert within(lambda: doctor_io._checkpoint("vllm", ["vllm", "serve", str(d)], {})) is None


# --------------------------------------------------------------------------- the pre-warm reader


def test_prewarm_reader_skips_a_fifo_and_a_device_without_opening_them(fifo: Path) -> None:
    from gpushift.prewarm.reader import read_file

    assert within(lambda: read_file(str(fifo), 1e9)) == {
        "path": str(fifo),
        "skipped": "not a regular file (FIFO)",
    }
    dev = within(lambda: read_file("/dev/zero", 1e9))
    assert dev["skipped"] == "not a regular file (character device)"

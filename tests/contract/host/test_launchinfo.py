"""Contract tests of the launch description: unit files and drop-ins, environment, model files and
their fast fingerprint, on real temp files.

The fingerprint reads at most the first and last 16 MiB: a changed byte in the middle of a large
file is NOT detected (the documented trade-off); a change of size, of the first or of the last
bytes is.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from gpushift.host import safefile
from gpushift.host.launchinfo import EDGE_BYTES, collect_launch_info, fingerprint_file
from gpushift.values import UnitState

GIB = 1024**3


class CountingOpen:
    """Wraps the one opener launchinfo reads files through (``safefile.open_regular``): counts
    opened files and bytes read."""

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.bytes_read = 0
        self.real = safefile.open_regular

    def __call__(self, path: Any) -> Any:
        self.opened.append(str(path))
        f = self.real(path)
        counter = self
        real_read = f.read

        def read(n: int = -1) -> Any:
            data = real_read(n)
            counter.bytes_read += len(data)
            return data

        f.read = read
        return f


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> CountingOpen:
    c = CountingOpen()
    monkeypatch.setattr(safefile, "open_regular", c)
    return c


def sparse(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that takes no disk space (a hole), like a model on a quick disk."""
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def poke(path: Path, offset: int) -> None:
    """Change the byte at ``offset`` (to its complement: random content may already hold any value)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        old = f.read(1) or b"\x00"
        f.seek(offset)
        f.write(bytes([old[0] ^ 0xFF]))


# --------------------------------------------------------------------------- fingerprint


def test_launchinfo_fingerprint_of_1gib_file_reads_only_head_and_tail(
    tmp_path: Path, counting: CountingOpen
) -> None:
    f = sparse(tmp_path / "model.gguf", GIB)
    fp = fingerprint_file(str(f))
    assert fp.startswith("fp1:") and len(fp) == 4 + 64
    assert counting.bytes_read == 2 * EDGE_BYTES  # 32 MiB of 1 GiB, never the whole file


def test_launchinfo_fingerprint_tradeoff_middle_byte_is_not_seen(tmp_path: Path) -> None:
    f = sparse(tmp_path / "model.gguf", GIB)
    base = fingerprint_file(str(f))
    poke(f, GIB // 2)  # a byte in the middle: outside both edges
    assert fingerprint_file(str(f)) == base  # the documented trade-off


@pytest.mark.parametrize("offset", [0, EDGE_BYTES - 1, GIB - EDGE_BYTES, GIB - 1])
def test_launchinfo_fingerprint_sees_first_and_last_bytes(tmp_path: Path, offset: int) -> None:
    f = sparse(tmp_path / "model.gguf", GIB)
    base = fingerprint_file(str(f))
    poke(f, offset)
    assert fingerprint_file(str(f)) != base


def test_launchinfo_fingerprint_sees_size_change(tmp_path: Path) -> None:
    f = sparse(tmp_path / "model.gguf", GIB)
    base = fingerprint_file(str(f))
    sparse(f, GIB + 4096)  # grown by a page of zeros: same first and last 16 MiB content
    assert fingerprint_file(str(f)) != base


def test_launchinfo_small_file_is_hashed_whole(tmp_path: Path) -> None:
    f = tmp_path / "mmproj-f16.gguf"
    f.write_bytes(os.urandom(3 * 1024 * 1024))
    base = fingerprint_file(str(f))
    poke(f, 1_500_000)  # the middle of a small file is inside the edges
    assert fingerprint_file(str(f)) != base


# --------------------------------------------------------------------------- the whole description


def test_launchinfo_collects_unit_env_dropins_models_and_host(tmp_path: Path) -> None:
    unit_file = tmp_path / "gpushift-llama.service"
    unit_file.write_text("[Service]\nExecStart=/usr/bin/llama-server -m q.gguf\n")
    drop = tmp_path / "gpushift-llama.service.d" / "override.conf"
    drop.parent.mkdir()
    drop.write_text("[Service]\nExecStart=\nExecStart=/usr/bin/llama-server -m q.gguf -c 16384\n")
    models = tmp_path / "models"
    models.mkdir()
    sparse(models / "q.gguf", 64 * 1024 * 1024)
    st = UnitState(
        name="gpushift-llama.service",
        load_state="loaded",
        active_state="active",
        sub_state="running",
        fragment_path=str(unit_file),
        drop_in_paths=(str(drop), str(tmp_path / "gone.conf")),
        environment=("LLAMA_ARG_THREADS=16", "HF_TOKEN=hf_abcdef", "EMPTY="),
        working_directory=str(models),
        user="llm",
    )
    info = collect_launch_info(st, ["/usr/bin/llama-server", "-m", "q.gguf", "--mmproj", "/nowhere/p.gguf"])
    unit = info["unit"]
    assert unit["path"] == str(unit_file)
    assert unit["sha256"] == hashlib.sha256(unit_file.read_bytes()).hexdigest()
    assert unit["drop_ins"][0] == {
        "path": str(drop),
        "sha256": hashlib.sha256(drop.read_bytes()).hexdigest(),
        "error": None,
    }
    assert unit["drop_ins"][1]["sha256"] is None and unit["drop_ins"][1]["error"]
    assert unit["user"] == "llm" and unit["working_directory"] == str(models)
    assert unit["environment"]["LLAMA_ARG_THREADS"] == "16" and unit["environment"]["EMPTY"] == ""
    assert "hf_abcdef" not in str(info) and info["redacted_env"] == ["HF_TOKEN"]
    m, missing = info["models"]
    assert m["resolved"] == str(models / "q.gguf")  # relative to WorkingDirectory
    assert m["size_bytes"] == 64 * 1024 * 1024 and m["kind"] == "file" and m["mtime"]
    assert m["fingerprint"] == fingerprint_file(str(models / "q.gguf"))
    assert missing["kind"] == "missing" and "error" in missing and "fingerprint" not in missing
    assert info["host"]["hostname"] and info["host"]["kernel"] == os.uname().release


def test_launchinfo_model_directory_fingerprint_follows_its_files(tmp_path: Path) -> None:
    d = tmp_path / "Qwen2.5-7B-Instruct"
    d.mkdir()
    (d / "config.json").write_text('{"hidden_size": 3584}')
    sparse(d / "model-00001-of-00002.safetensors", 200 * 1024 * 1024)
    sparse(d / "model-00002-of-00002.safetensors", 100 * 1024 * 1024)
    st = UnitState(name="v.service", load_state="loaded", active_state="active", sub_state="running")
    first = collect_launch_info(
        st, ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", str(d)]
    )
    (m,) = first["models"]
    assert (
        m["kind"] == "dir"
        and m["files"] == 3
        and m["size_bytes"] == 300 * 1024 * 1024 + len('{"hidden_size": 3584}')
    )
    poke(d / "model-00002-of-00002.safetensors", 100 * 1024 * 1024 - 1)
    second = collect_launch_info(
        st, ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", str(d)]
    )
    assert second["models"][0]["fingerprint"] != m["fingerprint"]


def test_launchinfo_cache_skips_unchanged_files(tmp_path: Path, counting: CountingOpen) -> None:
    f = sparse(tmp_path / "q.gguf", 100 * 1024 * 1024)
    st = UnitState(name="l.service", load_state="loaded", active_state="active", sub_state="running")
    cache: dict[Any, str] = {}
    a = collect_launch_info(st, ["llama-server", "-m", str(f)], cache)
    assert counting.opened.count(str(f)) == 1
    b = collect_launch_info(st, ["llama-server", "-m", str(f)], cache)
    assert counting.opened.count(str(f)) == 1  # same inode, size and mtime: taken from the cache
    assert a["models"][0]["fingerprint"] == b["models"][0]["fingerprint"]
    poke(f, 0)
    os.utime(f, ns=(1, 1))  # a different mtime: read again
    c = collect_launch_info(st, ["llama-server", "-m", str(f)], cache)
    assert counting.opened.count(str(f)) == 2
    assert c["models"][0]["fingerprint"] != a["models"][0]["fingerprint"]


def test_launchinfo_unreadable_unit_file_is_reported_not_raised(tmp_path: Path) -> None:
    st = UnitState(
        name="x.service",
        load_state="loaded",
        active_state="active",
        sub_state="running",
        fragment_path=str(tmp_path / "missing.service"),
    )
    info = collect_launch_info(st, [])
    assert info["unit"]["sha256"] is None and info["unit"]["error"]
    assert info["models"] == []


def test_doctor_io_listening_ports_sees_a_listening_socket_without_a_process_scan() -> None:
    import socket

    from gpushift.doctor.facts import TcpListeners, listening_ports

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port in listening_ports()
        holder = TcpListeners().get(port)
        assert holder is not None and holder.pid == os.getpid()
    assert TcpListeners().get(port) is None  # closed: not listened on

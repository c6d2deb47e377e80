"""A hook's output while it runs (gpushift/host/hookunits.py, :class:`OutputTail`): the pipe is
drained as it fills, only its last bytes are kept, and the text for the ledger row ends with them,
after a note of the whole size when some were dropped."""

from __future__ import annotations

import os
import threading

from gpushift.host.hookunits import KEPT_BYTES, OUTPUT_CHARS, OutputTail


def _write(fd: int, chunks: list[bytes]) -> threading.Thread:
    def go() -> None:
        with os.fdopen(fd, "wb") as f:
            for c in chunks:
                f.write(c)

    t = threading.Thread(target=go)
    t.start()
    return t


def test_a_short_output_is_kept_whole_without_a_note() -> None:
    r, w = os.pipe()
    tail = OutputTail(r)
    _write(w, [b"hook ran\n", b"to stderr\n"]).join()
    assert tail.text() == "hook ran\nto stderr\n"
    assert tail.total == 19


def test_a_flood_is_drained_while_it_is_written_and_only_its_end_kept() -> None:
    r, w = os.pipe()
    tail = OutputTail(r)
    line = b"x" * 1023 + b"\n"
    writer = _write(w, [line] * 50_000 + [b"the error at the end\n"])  # 50 MB through a 64 KiB pipe
    writer.join(60)
    assert not writer.is_alive(), "the pipe was not drained"
    assert len(tail._tail) <= 2 * KEPT_BYTES
    text = tail.text()
    whole = 50_000 * 1024 + 21
    assert text.startswith(
        f"[gpushift: {whole} bytes of output in all; the last {OUTPUT_CHARS} characters follow]\n"
    )
    assert text.endswith("the error at the end\n")
    assert tail.total == whole


def test_a_writer_that_never_ends_is_let_go_after_the_grace() -> None:
    r, w = os.pipe()
    tail = OutputTail(r)
    os.write(w, b"still holding the pipe\n")
    try:
        assert tail.text(grace_s=0.3) == "still holding the pipe\n"
    finally:
        os.close(w)


def test_secrets_and_terminal_escapes_are_masked() -> None:
    r, w = os.pipe()
    tail = OutputTail(r)
    _write(w, [b"HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123\n\x1b[31mred\n"]).join()
    text = tail.text()
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in text and "\x1b" not in text

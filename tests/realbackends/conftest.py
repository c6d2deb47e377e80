"""Fixtures of the real-backend tests: the venv that setup.sh builds, the tiny model, and servers
started as plain subprocesses that are always stopped again, even when the test fails.

Nothing here is skipped: a missing venv or model fails with a message naming the missing piece.
Every server listens on 127.0.0.1 only, on a free port (other people run tests on this machine at
the same time), and runs offline (no hub, no usage statistics).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from realbackends_support import (
    HERE,
    MODEL_DIR,
    OFFLINE_ENV,
    SETUP_HINT,
    VENV,
    RealBackends,
    Server,
    TinyModel,
)


@pytest.fixture(scope="session")
def realbackends() -> RealBackends:
    rb = RealBackends(
        venv=VENV,
        python=VENV / "bin" / "python",
        llama_server=VENV / "bin" / "llama-server",
        llama_quantize=VENV / "bin" / "llama-quantize",
    )
    missing = [str(p) for p in (rb.python, rb.llama_server, rb.llama_quantize) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"the real-backend venv is incomplete ({', '.join(missing)} missing): {SETUP_HINT}")
    return rb


@pytest.fixture(scope="session")
def tiny_model(realbackends: RealBackends) -> TinyModel:
    """The tiny model, made offline once and reused (kept beside the venv, outside the checkout)."""
    proc = subprocess.run(
        [str(realbackends.python), str(HERE / "make_tiny_model.py"), str(MODEL_DIR)],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, **OFFLINE_ENV, PATH=f"{realbackends.venv / 'bin'}:{os.environ.get('PATH', '')}"),
    )
    if proc.returncode != 0:
        pytest.fail(f"make_tiny_model.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"tiny model ready in {info['seconds']} s: {info}", file=sys.stderr)
    return TinyModel(hf_dir=Path(info["hf_dir"]), gguf=Path(info["gguf"]))


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Any]:
    """``start_server(name, argv, env)`` starts a server; every one is stopped after the test."""
    servers: list[Server] = []

    def start(name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Server:
        s = Server(name=name, argv=list(argv), log_path=tmp_path / f"{name}.log", env=dict(env or {}))
        servers.append(s)
        s.start()
        return s

    try:
        yield start
    finally:
        for s in reversed(servers):
            s.stop()

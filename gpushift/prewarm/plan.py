"""What to pre-warm before a boundary — the next backend's model files, within a memory budget.

The largest part of a real switch is the next backend reading its model from disk (on the H200
host a 16 GiB file read and copied to the GPU took 8.1 s from disk, 3.1 s from the page cache).
Read into the page cache before the boundary, that time is spent while the old backend still
serves.  Which files: the kind's model options (its module's ``prewarm_paths``: llama-server
``-m``/``--model``, vLLM ``--model`` or ``vllm serve MODEL``: a directory, or a Hugging Face id
resolved to its snapshot in the cache), with the unit's ``Environment=`` expanded the way systemd
does (``-m ${MODEL}``), or the backend's ``prewarm_paths``.  Never more than what the host can spare: ``MemAvailable`` minus a
margin; files are taken whole, largest last, until the budget is spent.

Pure: the caller lists directories and stats files (:class:`FileInfo`), this module decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpushift.backends import cmdline
from gpushift.backends.kinds import kind_of
from gpushift.config.schema import BackendConfig

#: Kept free of pre-warmed pages: what the host needs besides (the backends' own RAM, the OS).
MARGIN_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class FileInfo:
    """A path as the caller found it: a regular file's size, or why it is skipped."""

    path: str
    size: int = 0
    skipped: str | None = None  # "not a regular file (FIFO)", "missing", ...


@dataclass(frozen=True)
class Plan:
    files: tuple[FileInfo, ...]  # to read, in order
    skipped: tuple[FileInfo, ...]  # with why (not regular, missing, over the budget)
    budget_bytes: int

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def model_paths(b: BackendConfig, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """The paths to pre-warm for backend ``b`` launched as ``argv`` (expanded) with ``env``:
    ``prewarm_paths`` when configured, else the kind's model files or directories."""
    if b.prewarm_paths:
        return list(b.prewarm_paths)
    return kind_of(b.kind).prewarm_paths(cmdline.expand(argv, env), env)


def plan(files: Sequence[FileInfo], mem_available: int, margin: int = MARGIN_BYTES) -> Plan:
    """Which of ``files`` to read: regular files, whole, smallest first, within the budget."""
    budget = max(0, mem_available - margin)
    chosen: list[FileInfo] = []
    skipped = [f for f in files if f.skipped is not None]
    used = 0
    for f in sorted((f for f in files if f.skipped is None), key=lambda f: f.size):
        if used + f.size > budget:
            skipped.append(FileInfo(f.path, f.size, f"over the memory budget ({budget} bytes)"))
            continue
        chosen.append(f)
        used += f.size
    return Plan(tuple(chosen), tuple(skipped), budget)

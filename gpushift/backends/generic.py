"""The ``generic`` kind: any server with a health URL, and the kind of a backend that names none.

gpushift knows nothing of its own about it: the config gives its version and metrics URLs (a
``metrics_url`` is read as any kind's page would be: :func:`gpushift.backends.kinds.any_in_flight`),
its warm-up request (body included), and the doctor has only the rules for every backend.  What
it pre-warms are the model options of its command line (:data:`gpushift.backends.cmdline.MODEL_FILE_FLAGS`,
and ``serve MODEL``), unless ``prewarm_paths`` says otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpushift.backends import cmdline
from gpushift.backends.kind import Kind

NAME = "generic"


def prewarm_paths(args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Every model file or directory the command line names."""
    return [v for _flag, v in cmdline.model_files(args, NAME)]


KIND = Kind(name=NAME, prewarm_paths=prewarm_paths)

"""The doctor's table of backend kinds: what it knows about each server it has rules for.

A kind missing here (``generic``) gets only the common rules, and its port is the health URL's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpushift.doctor import llama, vllm
from gpushift.doctor.findings import Finding, Launch


def no_stop_rules(name: str, args: Sequence[str], timeout_stop_usec: int) -> list[Finding]:
    """For a kind whose server has no drain time of its own to compare ``TimeoutStopSec=`` with."""
    return []


@dataclass(frozen=True)
class KindRules:
    """What the doctor knows about one backend kind.

    Attributes:
        default_port: the port the server listens on when its command line has no ``--port``.
        launch: the kind's own rules on a launch (its flags against the GPUs), in rule order.
        model_paths: the filesystem paths on a command line (expanded) that must exist.
        stop: the kind's rules on a finite, non-zero ``TimeoutStopSec=`` (in microseconds).
    """

    default_port: int
    launch: Callable[[Launch], list[Finding]]
    model_paths: Callable[[Sequence[str]], list[str]]
    stop: Callable[[str, Sequence[str], int], list[Finding]] = no_stop_rules


KINDS: dict[str, KindRules] = {
    vllm.KIND: KindRules(vllm.DEFAULT_PORT, vllm.launch_rules, vllm.model_paths, vllm.stop_rules),
    llama.KIND: KindRules(llama.DEFAULT_PORT, llama.launch_rules, llama.model_paths),
}

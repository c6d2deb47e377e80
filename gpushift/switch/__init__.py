"""One switch — the run as plain data, its steps, its failure policy, and the switcher.

``run`` (SwitchRun, SwitchResult, Event) · ``preflight`` (checked before anything is touched) ·
``steps`` (drain, stop, VRAM gate, start, readiness, launch record) · ``failure`` (rollback or stay)
· ``machine`` (the Switcher: one switch at a time, on a worker thread).
"""

from gpushift.switch import recovery
from gpushift.switch.machine import Listener, Switcher
from gpushift.switch.run import Event, StepFailed, SwitchResult, SwitchRun

__all__ = ["Event", "Listener", "StepFailed", "SwitchResult", "SwitchRun", "Switcher", "recovery"]

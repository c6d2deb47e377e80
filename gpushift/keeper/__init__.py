"""The keeper — the schedule, people's overrides and changes behind gpushift's back.

``coming`` (the next switch the keeper will make by itself) · ``decide`` (the pure decision: snapshot → actions) · ``override`` (a person's choice and its
store) · ``keeper`` (takes snapshots, executes the decisions through the switcher).
"""

from gpushift.keeper.coming import Coming, coming_switch
from gpushift.keeper.control import BackendWatch, SwitchControl
from gpushift.keeper.decide import Attempts, Decision, Snapshot, WatchSettings, decide
from gpushift.keeper.keeper import Keeper
from gpushift.keeper.override import Override, OverrideStore

__all__ = [
    "Attempts",
    "BackendWatch",
    "Coming",
    "Decision",
    "Keeper",
    "Override",
    "OverrideStore",
    "Snapshot",
    "SwitchControl",
    "WatchSettings",
    "coming_switch",
    "decide",
]

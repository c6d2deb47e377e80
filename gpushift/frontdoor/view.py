"""What the front door knows of the daemon: a frozen picture of ``org.gpushift.Switcher1``'s
properties, replaced whole at every change the daemon link sees (``FrontDoor.update``).

Pure: plain values only.  The daemon link builds it from the properties (``ActiveBackend``,
``SwitchInProgress``, ``SwitchTarget``, ``Phase``, ``Mode``, ``Models``, ``NextServed``,
``TimeZone``); tests build it by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: ``ActiveBackend`` when no backend serves by decision.
OFF = "off"


@dataclass(frozen=True)
class DaemonView:
    connected: bool = False  # the daemon's name has an owner and we read its properties
    active: str = ""  # ActiveBackend: "" unknown, "off", or a backend name
    switching: bool = False  # SwitchInProgress
    target: str = ""  # SwitchTarget: where the switch in flight goes ("" none)
    phase: str = ""  # Phase
    mode: str = ""  # Mode
    models: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # Models: backend -> names
    next_served: Mapping[str, int] = field(default_factory=dict)  # NextServed: model -> UTC unix s
    zone: str = ""  # TimeZone: the schedule's zone name ("" = UTC)

    @property
    def serving(self) -> str:
        """The backend serving now: ``active`` when it names a backend, else ""."""
        return "" if self.active in ("", OFF) else self.active

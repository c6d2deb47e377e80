"""What the keeper needs of the rest of the daemon: the switcher (:class:`SwitchControl`) and the
backend watch between switches (:class:`BackendWatch`), as narrow Protocols."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from gpushift.switch import Event, SwitchRun
from gpushift.values import Caller, Outcome, Trigger, UnitState


class SwitchControl(Protocol):
    """What the keeper needs of the switcher (the Switcher implements it)."""

    def snapshot(self) -> tuple[bool, str | None]: ...
    def unit_states(self) -> dict[str, UnitState]: ...

    def request(
        self,
        target: str,
        reason: str,
        caller: Caller,
        trigger: Trigger = ...,
        skip_drain: bool = ...,
        *,
        relaunch: bool = ...,
        verify_running: bool = ...,
        recovery_attempt: int = ...,
        details: Mapping[str, str] | None = ...,
        restart_instances: tuple[str, ...] = ...,
    ) -> str: ...

    def take_finished(self) -> list[SwitchRun]: ...
    def adopt(self, backend: str, force: bool = False) -> None: ...
    def note_external(self, from_backend: str, to_backend: str) -> None: ...
    def note_relaunch(self, backend: str, detail: str) -> None: ...
    def record_incident(
        self,
        outcome: Outcome,
        backend: str,
        detail: str,
        exit: str,
        unit: str | None = None,
        serving: bool = False,
    ) -> None: ...

    def instance_states(self, backend: str) -> dict[str, UnitState]: ...

    def add_listener(self, listener: Callable[[Event], None]) -> None: ...


class BackendWatch(Protocol):
    """What the daemon sees of the backends between switches (its job watch and its sampler)."""

    def foreign_job(self, unit: str) -> bool | None:
        """A job gpushift did not start ran on ``unit`` since the last call (None: cannot tell)."""
        ...

    def unhealthy_for(self, backend: str) -> float | None:
        """Seconds the backend's health has failed without a break while its unit is active."""
        ...

    def instances_unhealthy_for(self, backend: str) -> dict[str, float]:
        """The same per instance of a backend of several (by unit; those failing only)."""
        ...

    def busy(self, backend: str) -> tuple[int | None, float | None]:
        """(requests in flight now — None: cannot be told, seconds without any — None: some are)."""
        ...

"""What the keeper sees of the backends between switches (:class:`gpushift.keeper.BackendWatch`).

* the job watch: which jobs ran on the backend units that gpushift did not queue (a person's
  ``systemctl``), from systemd's ``JobNew`` signal;
* the sampler's health history: how long the serving backend's health has failed without a break;
* a client reference on every backend unit, so that systemd keeps an exited unit loaded and its
  exit status readable.
"""

from __future__ import annotations

from typing import Any

from gpushift.config.instances import units_of
from gpushift.config.schema import Config
from gpushift.errors import GpushiftError
from gpushift.ports import Ports


class BackendWatcher:
    def __init__(self, ports: Ports, bus: Any, log: Any) -> None:
        self.ports = ports
        self.bus = bus
        self.log = log
        self.jobwatch: Any = None
        self.sampler: Any = None

    def start_jobwatch(self) -> None:
        """Watch systemd's JobNew (call on the loop thread)."""
        from gpushift.host.jobwatch import JobWatch

        own = getattr(self.ports.units, "own_jobs", None)
        if own is None:
            return
        watch = JobWatch(self.bus, lambda: list(own), log=self.log)
        try:
            watch.start()
        except Exception as e:  # without it a failed unit still counts as a crash: degrade, say so
            self.log.warning(
                "jobwatch_unavailable", error=repr(e), detail="an inactive unit counts as stopped by a person"
            )
            return
        self.jobwatch = watch

    def keep_units_loaded(self, config: Config) -> None:
        """Reference every backend unit, so an exit's status stays readable (systemd unloads an
        unreferenced unit that exited 0, and forgets how it ended)."""
        keep = getattr(self.ports.units, "keep_loaded", None)
        if keep is None:
            return
        for unit in (u for b in config.backends.values() for u in units_of(b)):  # every instance's too
            try:
                keep(unit)
            except GpushiftError as e:
                self.log.warning("unit_not_referenced", unit=unit, error=str(e))

    # -- BackendWatch

    def foreign_job(self, unit: str) -> bool | None:
        return self.jobwatch.foreign_job(unit) if self.jobwatch is not None else None

    def busy(self, backend: str) -> tuple[int | None, float | None]:
        """The sampler's in-flight count of ``backend`` and how long it has had none."""
        sample = self.sampler.snapshot() if self.sampler is not None else None
        b = sample.backend(backend) if sample is not None else None
        if sample is None or b is None or b.in_flight is None:
            return None, None
        now = self.ports.clock.monotonic()
        n = b.in_flight.known(now, sample.period_s)
        idle = float(now - b.idle_since) if b.idle_since is not None and n == 0 else None
        return (int(n) if n is not None else None), idle

    def unhealthy_for(self, backend: str) -> float | None:
        """How long the sampler has seen ``backend``'s health fail without a break (its unit active)."""
        if self.sampler is None:
            return None
        sample = self.sampler.snapshot()
        b = sample.backend(backend)
        now = self.ports.clock.monotonic()
        if b is None or b.unhealthy_since is None or sample.taken_at is None:
            return None
        if now - sample.taken_at > 2 * sample.period_s:
            return None  # the sampler is behind: do not judge a backend on an old picture
        return float(now - b.unhealthy_since)

    def instances_unhealthy_for(self, backend: str) -> dict[str, float]:
        """A backend of several instances: per instance whose health the sampler has seen fail
        without a break (its unit active), for how long (by unit; none when the sampler is behind)."""
        sample = self.sampler.snapshot() if self.sampler is not None else None
        b = sample.backend(backend) if sample is not None else None
        now = self.ports.clock.monotonic()
        if (
            sample is None
            or b is None
            or sample.taken_at is None
            or now - sample.taken_at > 2 * sample.period_s
        ):
            return {}
        return {u: float(now - since) for u, since in b.instance_unhealthy}

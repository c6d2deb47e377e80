"""The config's types: what a valid config file says, frozen (read and checked by
:mod:`gpushift.config.reader`; every key with its range in ``docs/config.md``)."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpushift.backends.kind import WarmupConfig as WarmupConfig  # a kind's default is one
from gpushift.backends.kinds import DEFAULT as DEFAULT_KIND
from gpushift.config.hooks import HooksConfig, NotifyConfig
from gpushift.config.mirror import MirrorConfig

#: The ranges' upper ends (docs/config.md gives each key's range).
MIB_MAX = 1024 * 1024  # 1 TiB
DAY_S = 86400
POLL_MAX_S = 60


@dataclass(frozen=True)
class DaemonConfig:
    bus: str = "system"
    state_dir: str = "/var/lib/gpushift"
    runtime_dir: str = "/run/gpushift"  # the pending spool lives here (another filesystem)
    on_failure: str = "rollback"
    schedule: str | None = None  # None: /etc/gpushift/schedule if it exists; "": no schedule
    poll_interval_s: float = 0.5
    # While a switch waits on the hardware (the VRAM gate, a backend's first seconds of loading) it
    # polls this often; readiness then backs off towards poll_interval_s for slow loaders.
    fast_poll_interval_s: float = 0.01
    evidence_lines: int = 50  # a failed start's or a crash's row keeps the unit's last log lines
    prewarm_rate_mib_s: float = 512.0  # the pre-warm reader's cap, so the serving backend keeps its disk
    stop_timeout_s: float = 180.0  # waiting for a stop job; systemd's TimeoutStopSec kills first
    log_level: str = "info"
    reconcile_interval_s: float = 30.0  # how often the schedule is checked against what runs
    max_attempts: int = 3  # failed scheduled switches per boundary before waiting for the next
    retry_after_s: float = 30.0  # spacing between those attempts
    allowed_group: str = "gpushift"  # besides root, who may switch
    sample_interval_s: float = 2.0  # how often the sampler reads units, health, GPUs (status, metrics)
    stagger_s: int = 0  # scheduled boundaries shift by a stable offset in [0, stagger_s) from the host name


@dataclass(frozen=True)
class GpuConfig:
    provider: str = "nvml"
    residual_mib: float = 256.0
    release_timeout_s: float = 120.0
    # The preflight waits this long for memory no process holds (a backend that just stopped: the
    # driver frees it a moment later) before it refuses a switch for it.
    orphan_wait_s: float = 10.0
    simulated_gpus: int = 2
    simulated_total_mib: float = 16384.0
    simulated_foreign_mib: float = 9318.0  # what a holder outside every backend unit holds
    simulated_release_delay_s: float = 0.5  # memory comes back this long after the last close
    simulated_dir: str | None = None  # default: <state_dir>/simgpu
    # Uncorrectable ECC errors a person examined and accepted, by GPU UUID.  NVML's aggregate count
    # never goes down, so without this one old error would refuse every launch forever.
    accepted_ecc_uncorrected: Mapping[str, int] = field(default_factory=dict)
    # GPUs whose new UUID a person accepted after a card was replaced or the bus reordered: until
    # then a GPU whose UUID changed since the last launch keeps every switch on it refused.
    accepted_gpu_uuids: tuple[str, ...] = ()


@dataclass(frozen=True)
class MetricsConfig:
    listen: str = ""  # "HOST:PORT" or "[IPv6]:PORT" serves /metrics there; "": no listener
    textfile: str = ""  # a *.prom file for node_exporter's textfile collector; "": none
    textfile_interval_s: float = 60.0  # the textfile is rewritten at least this often

    @property
    def address(self) -> tuple[str, int] | None:
        """(host, port) of ``listen`` (IPv6 without its brackets); None when it is off."""
        return split_listen(self.listen) if self.listen else None


@dataclass(frozen=True)
class InstanceConfig:
    """One instance of a backend of several (issue 23): its own unit, health URL and GPUs."""

    unit: str
    health_url: str
    gpus: tuple[int, ...] | None = None


@dataclass(frozen=True)
class BackendConfig:
    name: str
    unit: str
    health_url: str
    kind: str = DEFAULT_KIND  # a name in gpushift.backends.kinds.KINDS
    version_url: str | None = None
    version_command: tuple[str, ...] | None = None
    metrics_url: str | None = None
    start_timeout_s: float = 300.0
    drain_timeout_s: float = 30.0
    gpus: tuple[int, ...] | None = None  # None: all GPUs
    simulated_vram_mib: float = 0.0
    pinned_version: str | None = None
    on_crash: str = "restart"  # the backend exited by itself or wedged: relaunch it ("stay": leave it)
    unhealthy_after_s: float = 120.0  # health failing this long while the unit is active: wedged
    defer_while_busy_s: float = 0.0  # a boundary away from it waits this long for an idle moment (0: off)
    idle_s: float = 5.0  # an idle moment: no request in flight for this long
    prewarm_lead_s: float = 120.0  # read its model files into the page cache this long before (0: off)
    prewarm_paths: tuple[str, ...] = ()  # what to pre-warm instead of the kind's model files
    warmup: WarmupConfig | None = None  # a first completion after ready; None: none (generic default)
    # The model names it serves (config/frontdoor.py); None: its kind reads them from the unit's command
    # line (the daemon does, and announces them as the D-Bus property Models).
    models: tuple[str, ...] | None = None
    aliases: tuple[str, ...] = ()  # names that reach it through the front door whenever it serves
    instances: tuple[
        InstanceConfig, ...
    ] = ()  # several instances (issue 23); (): the backend is its one unit
    min_ready: int | None = None  # instances that must pass health and warm-up to serve; None: all


#: What the shipped example listens on: the ports the example backends had, so clients keep working.
DEFAULT_LISTEN = ("[::]:8000", "[::]:8080")
MIB = 1024 * 1024


@dataclass(frozen=True)
class FrontDoorConfig:
    listen: tuple[str, ...] = DEFAULT_LISTEN
    hold_timeout_s: float = 300.0  # a held request waits at most this long (then 503 + Retry-After)
    max_held: int = 1000  # requests held at once; beyond: 503 + Retry-After
    max_body_bytes: int = 16 * MIB  # a request body over this: 413
    max_connections: int = 4096  # client connections open at once; beyond, new ones wait in the backlog
    header_timeout_s: float = 10.0  # a request's head (line and headers) must arrive within this
    body_timeout_s: float = 60.0  # its body within this
    idle_timeout_s: float = 75.0  # a keep-alive connection with no request is closed after this
    upstream_connect_timeout_s: float = 5.0  # connecting to a backend
    metrics_listen: str = ""  # "HOST:PORT": the front door's own /metrics; "": none
    bus_timeout_s: float = 5.0  # the daemon's deadline for each call to org.gpushift.FrontDoor1

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        """(host, port) of each ``listen`` entry (IPv6 without its brackets)."""
        return tuple(split_listen(a) for a in self.listen)


@dataclass(frozen=True)
class Config:
    path: str
    daemon: DaemonConfig
    gpu: GpuConfig
    backends: Mapping[str, BackendConfig] = field(default_factory=dict)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    hooks: HooksConfig = field(default_factory=HooksConfig)  # config/hooks.py
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    frontdoor: FrontDoorConfig | None = None  # None: no [frontdoor] table, the daemon never calls one
    mirror: MirrorConfig = field(default_factory=MirrorConfig)  # config/mirror.py; url "": none

    def backend(self, name: str) -> BackendConfig:
        return self.backends[name]

    def gpus_of(self, name: str, all_gpus: tuple[int, ...]) -> tuple[int, ...]:
        """The GPUs a backend uses (all of them when it names none)."""
        gpus = self.backends[name].gpus
        return all_gpus if gpus is None else gpus

    def backend_for_unit(self, unit: str) -> str | None:
        for b in self.backends.values():
            if b.unit == unit or any(i.unit == unit for i in b.instances):
                return b.name
        return None

    @property
    def simulated_dir(self) -> str:
        return self.gpu.simulated_dir or os.path.join(self.daemon.state_dir, "simgpu")

    @property
    def ledger_path(self) -> str:
        return os.path.join(self.daemon.state_dir, "ledger.db")


_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def split_listen(text: str) -> tuple[str, int]:
    """``127.0.0.1:9840`` / ``[::1]:9840`` / ``localhost:9840`` → (host, port).

    Raises:
        ValueError: saying what is wrong (the config reader names the key).
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:9840 or [::1]:9840), got {text!r}")
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"expected a port 1-65535 after the last ':', got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{host} is not an IPv6 address, in {text!r}") from None
        return host[1:-1], int(port)
    if ":" in host:
        raise ValueError(f"write an IPv6 address in brackets, e.g. [::1]:9840, got {text!r}")
    if not (_is_ipv4(host) or (_HOSTNAME.fullmatch(host) and not host.replace(".", "").isdigit())):
        raise ValueError(f"{host!r} is neither an IPv4 address nor a host name, in {text!r}")
    return host, int(port)


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True

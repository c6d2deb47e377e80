"""The TOML config file → frozen, validated types.

Every problem is reported as a :class:`ConfigError` naming the file, the key and what was expected;
unknown keys are errors too (a typo must not silently fall back to a default).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushift.config import textfile, validate
from gpushift.config.hooks import HooksConfig, NotifyConfig, read_hooks, read_notify
from gpushift.config.keys import STRING_MAX, KeyReader
from gpushift.config.textfile import DEFAULT_CONFIG_PATH as DEFAULT_CONFIG_PATH
from gpushift.config.textfile import ENV_CONFIG as ENV_CONFIG
from gpushift.config.textfile import config_path as config_path
from gpushift.values import OFF, BackendKind

BACKEND_KINDS = tuple(k.value for k in BackendKind)

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


@dataclass(frozen=True)
class GpuConfig:
    provider: str = "nvml"
    residual_mib: float = 256.0
    release_timeout_s: float = 120.0
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
class WarmupConfig:
    """The warm-up request after ready: ``body`` None means the kind's default body."""

    path: str
    body: Mapping[str, Any] | None = None
    expect_status: int = 200
    timeout_s: float = 60.0


#: The kinds' warm-up requests: a few tokens of a completion, streamed (docs/config.md).
DEFAULT_WARMUP = {
    BackendKind.VLLM: WarmupConfig("/v1/completions"),
    BackendKind.LLAMA_SERVER: WarmupConfig("/completion"),
}


@dataclass(frozen=True)
class BackendConfig:
    name: str
    unit: str
    health_url: str
    kind: BackendKind = BackendKind.GENERIC
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


@dataclass(frozen=True)
class Config:
    path: str
    daemon: DaemonConfig
    gpu: GpuConfig
    backends: Mapping[str, BackendConfig] = field(default_factory=dict)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    hooks: HooksConfig = field(default_factory=HooksConfig)  # config/hooks.py
    notify: NotifyConfig = field(default_factory=NotifyConfig)

    def backend(self, name: str) -> BackendConfig:
        return self.backends[name]

    def gpus_of(self, name: str, all_gpus: tuple[int, ...]) -> tuple[int, ...]:
        """The GPUs a backend uses (all of them when it names none)."""
        gpus = self.backends[name].gpus
        return all_gpus if gpus is None else gpus

    def backend_for_unit(self, unit: str) -> str | None:
        for b in self.backends.values():
            if b.unit == unit:
                return b.name
        return None

    @property
    def simulated_dir(self) -> str:
        return self.gpu.simulated_dir or os.path.join(self.daemon.state_dir, "simgpu")

    @property
    def ledger_path(self) -> str:
        return os.path.join(self.daemon.state_dir, "ledger.db")


def _origin(url: str) -> str:
    """``http://127.0.0.1:8000/health`` → ``http://127.0.0.1:8000``."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


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


def load(path: str | None = None) -> Config:
    """Read and validate the config file."""
    p = config_path(path)
    return parse(read(p), p)


def read(path: str) -> str:
    """The config file's text (bounded, a regular file, UTF-8: gpushift/config/textfile.py)."""
    return textfile.read_text(path, "config file", f"set --config or ${ENV_CONFIG}")


def parse(text: str, path: str = "<config>") -> Config:
    """Validate config text.  Errors read ``path:LINE:COL: not valid TOML: ...`` or
    ``path:LINE: key: ...`` (the key's line, or the line of the table it is missing from)."""
    data = textfile.parse_toml(text, path)
    return _Reader(path, textfile.key_lines(text)).config(data)


class _Reader(KeyReader):
    def uuid_counts(self, d: Mapping[str, Any], where: str, key: str) -> dict[str, int]:
        v = d.get(key, {})
        if not isinstance(v, dict) or not all(
            isinstance(k, str)
            and validate.line_problem(k, 128) is None
            and isinstance(n, int)
            and not isinstance(n, bool)
            and 0 <= n <= 2**32
            for k, n in v.items()
        ):
            raise self.err(
                f"{where}.{key}",
                f'expected a table of GPU UUID = count 0 - 2^32 (e.g. {{ "GPU-1a2b…" = 2 }}), got {validate.shown(v)}',
            )
        return dict(v)

    def schedule_path(self, d: Mapping[str, Any]) -> str | None:
        """``schedule``: a path; ``""`` turns the schedule off; absent means the default path."""
        if "schedule" not in d:
            return None
        v = d["schedule"]
        if not isinstance(v, str):
            raise self.err(
                "daemon.schedule", f'expected a path (or "" for no schedule), got {validate.shown(v)}'
            )
        return self.one_line("daemon.schedule", v)

    def config(self, data: Mapping[str, Any]) -> Config:
        self.no_unknown(data, "", {"daemon", "gpu", "backends", "metrics", "hooks", "notify"})
        d = self.table(data, "daemon")
        self.no_unknown(d, "daemon", set(DaemonConfig.__dataclass_fields__))
        daemon = DaemonConfig(
            bus=self.string(d, "daemon", "bus", "system", ("system", "session")),
            state_dir=self.string(d, "daemon", "state_dir", DaemonConfig.state_dir),
            runtime_dir=self.string(d, "daemon", "runtime_dir", DaemonConfig.runtime_dir),
            on_failure=self.string(d, "daemon", "on_failure", "rollback", ("rollback", "stay")),
            schedule=self.schedule_path(d),
            poll_interval_s=self.number(
                d, "daemon", "poll_interval_s", 0.5, minimum=0.05, maximum=POLL_MAX_S
            ),
            fast_poll_interval_s=self.number(
                d, "daemon", "fast_poll_interval_s", 0.01, minimum=0.005, maximum=1.0
            ),
            evidence_lines=self.number(d, "daemon", "evidence_lines", 50, integer=True, maximum=1000),
            prewarm_rate_mib_s=self.number(
                d, "daemon", "prewarm_rate_mib_s", 512.0, minimum=1, maximum=100000
            ),
            stop_timeout_s=self.number(d, "daemon", "stop_timeout_s", 180.0, minimum=1, maximum=DAY_S),
            log_level=self.string(d, "daemon", "log_level", "info", ("debug", "info", "warning", "error")),
            reconcile_interval_s=self.number(
                d, "daemon", "reconcile_interval_s", 30.0, minimum=1, maximum=3600
            ),
            max_attempts=self.number(d, "daemon", "max_attempts", 3, minimum=1, integer=True, maximum=100),
            retry_after_s=self.number(d, "daemon", "retry_after_s", 30.0, maximum=DAY_S),
            allowed_group=self.string(d, "daemon", "allowed_group", "gpushift"),
            sample_interval_s=self.number(d, "daemon", "sample_interval_s", 2.0, minimum=0.5, maximum=60),
        )
        g = self.table(data, "gpu")
        self.no_unknown(g, "gpu", set(GpuConfig.__dataclass_fields__))
        gpu = GpuConfig(
            provider=self.string(g, "gpu", "provider", "nvml", ("nvml", "simulated")),
            residual_mib=self.number(g, "gpu", "residual_mib", 256.0, maximum=MIB_MAX),
            release_timeout_s=self.number(g, "gpu", "release_timeout_s", 120.0, minimum=0.1, maximum=DAY_S),
            simulated_gpus=self.number(g, "gpu", "simulated_gpus", 2, minimum=1, integer=True, maximum=64),
            simulated_total_mib=self.number(
                g, "gpu", "simulated_total_mib", 16384.0, minimum=1, maximum=MIB_MAX
            ),
            simulated_foreign_mib=self.number(g, "gpu", "simulated_foreign_mib", 9318.0, maximum=MIB_MAX),
            simulated_release_delay_s=self.number(g, "gpu", "simulated_release_delay_s", 0.5, maximum=3600),
            simulated_dir=self.string(g, "gpu", "simulated_dir", None),
            accepted_ecc_uncorrected=self.uuid_counts(g, "gpu", "accepted_ecc_uncorrected"),
            accepted_gpu_uuids=self.strings(g, "gpu", "accepted_gpu_uuids"),
        )
        b = self.table(data, "backends")
        backends: dict[str, BackendConfig] = {}
        units: dict[str, str] = {}
        for name, bd in b.items():
            where = f"backends.{name}"
            if name == OFF:
                raise self.err(where, f"{OFF!r} is reserved (it means: no backend); choose another name")
            problem = validate.name_problem(name)
            if problem is not None:
                raise self.err(where, f"backend name {validate.shown(name)}: {problem}")
            if not isinstance(bd, dict):
                raise self.err(where, f"expected a table [{where}]")
            backends[name] = self.backend(name, where, bd)
            unit = backends[name].unit
            if unit in units:
                raise self.err(f"{where}.unit", f"{unit!r} is already the unit of backend {units[unit]!r}")
            units[unit] = name
        if not backends:
            raise self.err("backends", "no backend configured (expected at least one [backends.NAME] table)")
        if gpu.provider == "simulated":
            for be in backends.values():
                for i in be.gpus or ():
                    if i >= gpu.simulated_gpus:
                        raise self.err(
                            f"backends.{be.name}.gpus",
                            f"GPU {i} does not exist on the simulated host of {gpu.simulated_gpus} GPUs",
                        )
        return Config(
            path=self.path,
            daemon=daemon,
            gpu=gpu,
            backends=backends,
            metrics=self.metrics(data),
            hooks=read_hooks(self, data),
            notify=read_notify(self, data),
        )

    def metrics(self, data: Mapping[str, Any]) -> MetricsConfig:
        m = self.table(data, "metrics")
        self.no_unknown(m, "metrics", set(MetricsConfig.__dataclass_fields__))
        listen = m.get("listen", "")
        if not isinstance(listen, str):
            raise self.err("metrics.listen", f'expected "HOST:PORT" (or "" for none), got {listen!r}')
        if listen:
            try:
                split_listen(listen)
            except ValueError as e:
                raise self.err("metrics.listen", str(e)) from None
        textfile = m.get("textfile", "")
        if not isinstance(textfile, str) or (
            textfile
            and not (
                os.path.isabs(textfile)
                and textfile.endswith(".prom")
                and validate.line_problem(textfile, STRING_MAX) is None
            )
        ):
            raise self.err(
                "metrics.textfile",
                f'expected an absolute path ending in .prom (or "" for none), got {textfile!r}',
            )
        return MetricsConfig(
            listen=listen,
            textfile=textfile,
            textfile_interval_s=self.number(
                m, "metrics", "textfile_interval_s", 60.0, minimum=1, maximum=3600
            ),
        )

    def backend(self, name: str, where: str, d: Mapping[str, Any]) -> BackendConfig:
        self.no_unknown(d, where, set(BackendConfig.__dataclass_fields__) - {"name"})
        unit = self.string(d, where, "unit", None)
        if unit is None:
            raise self.err(
                f"{where}.unit", "missing (expected a systemd unit name such as 'gpushift-x.service')"
            )
        problem = validate.unit_problem(unit)
        if problem is not None:
            raise self.err(f"{where}.unit", f"{validate.shown(unit)}: {problem}")
        vc = d.get("version_command")
        version_command: tuple[str, ...] | None = None
        if vc is not None:
            if not isinstance(vc, list) or not vc or not all(isinstance(x, str) and x for x in vc):
                raise self.err(
                    f"{where}.version_command",
                    f"expected a non-empty list of strings, got {validate.shown(vc)}",
                )
            version_command = tuple(self.one_line(f"{where}.version_command", x) for x in vc)
        gpus_raw = d.get("gpus")
        gpus: tuple[int, ...] | None = None
        if gpus_raw is not None:
            if (
                not isinstance(gpus_raw, list)
                or not gpus_raw
                or not all(
                    isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= 1023 for i in gpus_raw
                )
            ):
                raise self.err(
                    f"{where}.gpus",
                    f"expected a non-empty list of GPU indices 0 - 1023 (e.g. [0, 1]), got {validate.shown(gpus_raw)}",
                )
            if len(set(gpus_raw)) != len(gpus_raw):
                raise self.err(f"{where}.gpus", f"a GPU is listed twice in {gpus_raw!r}")
            gpus = tuple(gpus_raw)
        kind = BackendKind(self.string(d, where, "kind", "generic", BACKEND_KINDS))
        health_url = self.url(d, where, "health_url", required=True) or ""
        version_url = self.url(d, where, "version_url")
        metrics_url = self.url(d, where, "metrics_url")
        # A kind brings the endpoints its server always has, where the config names none.
        origin = _origin(health_url)
        if kind is BackendKind.VLLM:
            version_url = version_url or (None if version_command else origin + "/version")
            metrics_url = metrics_url or origin + "/metrics"
        elif kind is BackendKind.LLAMA_SERVER:
            # /props carries build_info; /slots tells per slot whether it is processing.
            version_url = version_url or (None if version_command else origin + "/props")
            metrics_url = metrics_url or origin + "/slots"
        return BackendConfig(
            name=name,
            unit=unit,
            kind=kind,
            health_url=health_url,
            version_url=version_url,
            version_command=version_command,
            metrics_url=metrics_url,
            start_timeout_s=self.number(d, where, "start_timeout_s", 300.0, minimum=0.1, maximum=DAY_S),
            drain_timeout_s=self.number(d, where, "drain_timeout_s", 30.0, maximum=DAY_S),
            gpus=gpus,
            simulated_vram_mib=self.number(d, where, "simulated_vram_mib", 0.0, maximum=MIB_MAX),
            pinned_version=self.string(d, where, "pinned_version", None),
            on_crash=self.string(d, where, "on_crash", "restart", ("restart", "stay")),
            unhealthy_after_s=self.number(d, where, "unhealthy_after_s", 120.0, minimum=5, maximum=DAY_S),
            warmup=self.warmup(d, where, kind),
            defer_while_busy_s=self.number(d, where, "defer_while_busy_s", 0.0, maximum=86400),
            idle_s=self.number(d, where, "idle_s", 5.0, minimum=0.5, maximum=3600),
            prewarm_lead_s=self.number(d, where, "prewarm_lead_s", 120.0, maximum=86400),
            prewarm_paths=self.absolute_paths(d, where, "prewarm_paths"),
        )

    def warmup(self, d: Mapping[str, Any], where: str, kind: BackendKind) -> WarmupConfig | None:
        """``warmup``: absent or ``true`` = the kind's default; ``false`` = none; a table = this request."""
        key = f"{where}.warmup"
        if "warmup" not in d:
            return DEFAULT_WARMUP.get(kind)
        v = d["warmup"]
        if v is True:
            if kind not in DEFAULT_WARMUP:
                raise self.err(
                    key, f"a {kind} backend has no default warm-up request: give a table with a body"
                )
            return DEFAULT_WARMUP[kind]
        if v is False:
            return None
        if not isinstance(v, dict):
            raise self.err(
                key, f"expected true, false or a table {{ path = ..., body = {{...}} }}, got {v!r}"
            )
        self.no_unknown(v, key, {"path", "body", "expect_status", "timeout_s"})
        path = v.get("path", DEFAULT_WARMUP[kind].path if kind in DEFAULT_WARMUP else None)
        if not isinstance(path, str) or not path.startswith("/") or validate.line_problem(path, STRING_MAX):
            raise self.err(
                f"{key}.path", f'expected a path such as "/v1/completions", got {validate.shown(path)}'
            )
        body = v.get("body")
        if body is not None and not isinstance(body, dict):
            raise self.err(f"{key}.body", f"expected a table (the JSON body), got {body!r}")
        if body is None and kind not in DEFAULT_WARMUP:
            raise self.err(f"{key}.body", f"a {kind} backend has no default warm-up body: give one")
        status = self.number(v, key, "expect_status", 200, minimum=100, integer=True, maximum=599)
        timeout = self.number(v, key, "timeout_s", 60.0, minimum=0.1, maximum=3600)
        return WarmupConfig(path, dict(body) if body is not None else None, int(status), float(timeout))

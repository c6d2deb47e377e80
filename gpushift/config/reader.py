"""The config file's reader: TOML text → :mod:`gpushift.config.types`, every value checked.

Every problem is reported as a :class:`ConfigError` naming the file, the key and what was expected;
unknown keys are errors too (a typo must not silently fall back to a default).  What a backend's
kind brings (its endpoints, its warm-up request) is asked of the table of kinds
(:mod:`gpushift.backends.kinds`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gpushift.backends.kind import Kind
from gpushift.backends.kinds import DEFAULT as DEFAULT_KIND
from gpushift.backends.kinds import KINDS
from gpushift.config import instances, textfile, validate
from gpushift.config.frontdoor import check_against_backends, model_names, read_frontdoor
from gpushift.config.hooks import read_hooks, read_notify
from gpushift.config.keys import STRING_MAX, KeyReader
from gpushift.config.mirror import read_mirror
from gpushift.config.textfile import ENV_CONFIG, config_path
from gpushift.config.types import (
    DAY_S,
    MIB_MAX,
    POLL_MAX_S,
    BackendConfig,
    Config,
    DaemonConfig,
    GpuConfig,
    MetricsConfig,
    WarmupConfig,
    split_listen,
)
from gpushift.values import OFF

#: The kinds a config may name (``kind = "..."``), in the table's order (the reader asks the table).
BACKEND_KINDS = tuple(KINDS)


def _origin(url: str) -> str:
    """``http://127.0.0.1:8000/health`` → ``http://127.0.0.1:8000``."""
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


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
        self.no_unknown(
            data, "", {"daemon", "gpu", "backends", "metrics", "hooks", "notify", "frontdoor", "mirror"}
        )
        daemon = self.daemon(data)
        gpu = self.gpu(data)
        backends = self.backends(data)
        if gpu.provider == "simulated":
            for be in backends.values():
                for i in be.gpus or ():
                    if i >= gpu.simulated_gpus:
                        raise self.err(
                            f"backends.{be.name}.gpus",
                            f"GPU {i} does not exist on the simulated host of {gpu.simulated_gpus} GPUs",
                        )
        frontdoor = read_frontdoor(self, data)
        if frontdoor is not None:
            check_against_backends(self, frontdoor, backends)
        return Config(
            path=self.path,
            daemon=daemon,
            gpu=gpu,
            backends=backends,
            metrics=self.metrics(data),
            hooks=read_hooks(self, data),
            notify=read_notify(self, data),
            frontdoor=frontdoor,
            mirror=read_mirror(self, data),
        )

    def daemon(self, data: Mapping[str, Any]) -> DaemonConfig:
        d = self.table(data, "daemon")
        self.no_unknown(d, "daemon", set(DaemonConfig.__dataclass_fields__))
        return DaemonConfig(
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
            stagger_s=self.number(d, "daemon", "stagger_s", 0, integer=True, maximum=3600),
        )

    def gpu(self, data: Mapping[str, Any]) -> GpuConfig:
        g = self.table(data, "gpu")
        self.no_unknown(g, "gpu", set(GpuConfig.__dataclass_fields__))
        return GpuConfig(
            provider=self.string(g, "gpu", "provider", "nvml", ("nvml", "simulated")),
            residual_mib=self.number(g, "gpu", "residual_mib", 256.0, maximum=MIB_MAX),
            release_timeout_s=self.number(g, "gpu", "release_timeout_s", 120.0, minimum=0.1, maximum=DAY_S),
            orphan_wait_s=self.number(g, "gpu", "orphan_wait_s", 10.0, maximum=600),
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

    def backends(self, data: Mapping[str, Any]) -> dict[str, BackendConfig]:
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
            for unit in instances.units_of(backends[name]):
                if unit in units:
                    key = f"{where}.instances" if backends[name].instances else f"{where}.unit"
                    raise self.err(key, f"{unit!r} is already the unit of backend {units[unit]!r}")
                units[unit] = name
        if not backends:
            raise self.err("backends", "no backend configured (expected at least one [backends.NAME] table)")
        return backends

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
        # With instances the backend's unit, health URL and GPUs are the instances' (config/instances.py).
        many = instances.read_instances(self, d, where)
        unit = many[0].unit if many else self.string(d, where, "unit", None)
        if unit is None:
            raise self.err(
                f"{where}.unit", "missing (expected a systemd unit name such as 'gpushift-x.service')"
            )
        problem = validate.unit_problem(unit)
        if problem is not None:
            raise self.err(f"{where}.unit", f"{validate.shown(unit)}: {problem}")
        version_command = self.version_command(d, where)
        gpus = instances.joined_gpus(many) if many else self.gpu_list(d, where)
        kind = KINDS[self.string(d, where, "kind", DEFAULT_KIND, tuple(KINDS))]
        health_url = many[0].health_url if many else self.url(d, where, "health_url", required=True) or ""
        # A kind brings the endpoints its server always has, where the config names none.
        origin = _origin(health_url)
        version_url = self.url(d, where, "version_url") or (
            origin + kind.version_path if kind.version_path and not version_command else None
        )
        metrics_url = self.url(d, where, "metrics_url") or (
            origin + kind.metrics_path if kind.metrics_path else None
        )
        return BackendConfig(
            name=name,
            unit=unit,
            kind=kind.name,
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
            models=model_names(self, d, where, "models"),
            aliases=model_names(self, d, where, "aliases") or (),
            instances=many,
            min_ready=instances.read_min_ready(self, d, where, len(many)),
        )

    def version_command(self, d: Mapping[str, Any], where: str) -> tuple[str, ...] | None:
        vc = d.get("version_command")
        if vc is None:
            return None
        if not isinstance(vc, list) or not vc or not all(isinstance(x, str) and x for x in vc):
            raise self.err(
                f"{where}.version_command",
                f"expected a non-empty list of strings, got {validate.shown(vc)}",
            )
        return tuple(self.one_line(f"{where}.version_command", x) for x in vc)

    def warmup(self, d: Mapping[str, Any], where: str, kind: Kind) -> WarmupConfig | None:
        """``warmup``: absent or ``true`` = the kind's default; ``false`` = none; a table = this request."""
        key = f"{where}.warmup"
        if "warmup" not in d:
            return kind.warmup
        v = d["warmup"]
        if v is True:
            if kind.warmup is None:
                raise self.err(
                    key, f"a {kind.name} backend has no default warm-up request: give a table with a body"
                )
            return kind.warmup
        if v is False:
            return None
        if not isinstance(v, dict):
            raise self.err(
                key, f"expected true, false or a table {{ path = ..., body = {{...}} }}, got {v!r}"
            )
        self.no_unknown(v, key, {"path", "body", "expect_status", "timeout_s"})
        path = v.get("path", kind.warmup.path if kind.warmup is not None else None)
        if not isinstance(path, str) or not path.startswith("/") or validate.line_problem(path, STRING_MAX):
            raise self.err(
                f"{key}.path", f'expected a path such as "/v1/completions", got {validate.shown(path)}'
            )
        body = v.get("body")
        if body is not None and not isinstance(body, dict):
            raise self.err(f"{key}.body", f"expected a table (the JSON body), got {body!r}")
        if body is None and kind.warmup_body is None:
            raise self.err(f"{key}.body", f"a {kind.name} backend has no default warm-up body: give one")
        status = self.number(v, key, "expect_status", 200, minimum=100, integer=True, maximum=599)
        timeout = self.number(v, key, "timeout_s", 60.0, minimum=0.1, maximum=3600)
        return WarmupConfig(path, dict(body) if body is not None else None, int(status), float(timeout))

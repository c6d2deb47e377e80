"""Gathers the host facts the preflight doctor's pure rules need (gpushift/doctor/).

Unit commands and environments come from systemd, GPU facts from the GPU provider, listeners from
the kernel's TCP table, model ``config.json`` files and paths from the filesystem, the last known
versions and ECC counts from the ledger.  Used before every switch (only the target's findings
count there) and by ``gpushift check``.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gpushift import doctor
from gpushift.backends import cmdline
from gpushift.backends.kinds import kind_of
from gpushift.backends.version import run_version_command
from gpushift.config.schema import BackendConfig, Config
from gpushift.errors import GpushiftError
from gpushift.host import safefile
from gpushift.ports import GpuProbe, Ledger, UnitControl
from gpushift.values import Holder, HostGpuFacts, UnitState

#: A model directory's ``config.json`` larger than this is not read (they are a few KiB).
CONFIG_JSON_LIMIT_BYTES = 1024 * 1024
#: A unit's ``EnvironmentFile=`` larger than this is not read (they are a few lines).
ENV_FILE_LIMIT_BYTES = 256 * 1024


def tcp_listeners() -> dict[int, Holder]:
    """Who listens on which local TCP port (pid, user, command, unit)."""
    import psutil

    from gpushift.host.procscan import process_info

    out: dict[int, Holder] = {}
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return out
    for c in conns:
        if c.status != psutil.CONN_LISTEN or not c.laddr or c.pid is None:
            continue
        info = process_info(c.pid)
        if info is None:
            continue
        out.setdefault(c.laddr.port, info.to_holder())
    return out


def listening_ports(paths: Sequence[str] = ("/proc/net/tcp", "/proc/net/tcp6")) -> set[int]:
    """The local TCP ports in LISTEN state, from the kernel's tables (no process lookup: cheap)."""
    ports: set[int] = set()
    for path in paths:
        try:
            with open(path, encoding="ascii") as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == "0A":  # TCP_LISTEN
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        except (OSError, ValueError):
            continue
    return ports


class TcpListeners(Mapping[int, Holder]):
    """Who listens on a port, looked up only for a port that is listened on: the preflight asks
    about its target's port, and mapping every socket to its process costs a scan of every
    process's open files."""

    def __init__(self) -> None:
        self._ports = listening_ports()
        self._holders: dict[int, Holder] | None = None

    def _all(self) -> dict[int, Holder]:
        if self._holders is None:
            self._holders = tcp_listeners()
        return self._holders

    def __getitem__(self, port: int) -> Holder:
        if port not in self._ports:
            raise KeyError(port)
        return self._all()[port]

    def __iter__(self) -> Iterator[int]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def _checkpoint(backend_kind: str, argv: Sequence[str], env: dict[str, str]) -> doctor.CheckpointFacts | None:
    """The model directory's config.json (dtype, quantization), for a kind that names one
    (vLLM: its model) when it is local."""
    model = kind_of(backend_kind).checkpoint_dir(cmdline.expand(argv, env))
    if not model or not os.path.isdir(model):
        return None
    try:
        # From the backend's command line: a regular file only, a bounded read (safefile.py).
        data = json.loads(safefile.read_bounded(os.path.join(model, "config.json"), CONFIG_JSON_LIMIT_BYTES))
    except (OSError, ValueError):  # missing, unreadable, skipped (not a regular file, too large)
        return None
    return doctor.checkpoint_facts_from_config(data) if isinstance(data, dict) else None


def unit_environment(st: UnitState | None) -> tuple[dict[str, str], list[str]]:
    """The variables ``st``'s command sees: its ``Environment=``, then each ``EnvironmentFile=``
    (systemd's order: a file's setting wins), each file read bounded and only when it is a regular
    file (safefile.py), a wildcard expanded as systemd does.  Also, one line per file that could
    not be read (a ``-`` file that is missing is no such line: systemd does not need it)."""
    env = cmdline.environment(st.environment if st else ())
    unread: list[str] = []
    for pattern, optional in st.environment_files if st else ():
        paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        for path in paths:
            try:
                text = safefile.read_bounded(path, ENV_FILE_LIMIT_BYTES).decode("utf-8", "replace")
            except FileNotFoundError:
                if not optional:
                    unread.append(f"{path}: does not exist")
                continue
            except OSError as e:  # unreadable (not root?), not a regular file, too large
                unread.append(f"{path}: {e.strerror or e}")
                continue
            env.update(cmdline.environment_file(text))
    return env, unread


def _ledger_memory(ledger: Ledger | None) -> tuple[dict[str, str], dict[str, int], dict[int, str] | None]:
    """The last version of each backend, the corrected ECC counts at the last launch, and the GPUs
    (index -> UUID) the last successful launch saw (None: no launch recorded yet)."""
    versions: dict[str, str] = {}
    ecc: dict[str, int] = {}
    known: dict[int, str] | None = None
    if ledger is None:
        return versions, ecc, known
    try:
        rows = ledger.list(limit=20)
    except Exception:
        return versions, ecc, known
    for r in rows:  # newest first
        if r.backend_version and r.to_backend not in versions and r.outcome == "ok":
            versions[r.to_backend] = r.backend_version
        if not ecc and r.gpu_facts:
            for g in r.gpu_facts.get("gpus", []):
                if g.get("uuid") and g.get("ecc_corrected") is not None:
                    ecc[g["uuid"]] = int(g["ecc_corrected"])
        gpus = (r.gpu_facts or {}).get("gpus") or []
        if known is None and r.outcome == "ok" and gpus and not (r.gpu_facts or {}).get("error"):
            known = {int(g["index"]): str(g["uuid"]) for g in gpus if g.get("uuid")}
    return versions, ecc, known


def run_checks(
    config: Config,
    units: UnitControl | None,
    gpu: GpuProbe,
    ledger: Ledger | None,
    facts: HostGpuFacts | None = None,
    probe_versions: bool = True,
    only: str | None = None,
    known_states: Mapping[str, UnitState] | None = None,
) -> tuple[list[doctor.Finding], HostGpuFacts, dict[str, UnitState | None]]:
    """Every finding for every configured backend (``only``: for that one alone, still compared with
    the others), with the facts it was based on.  ``known_states``: units just read by the caller,
    by backend name (the others are asked of systemd)."""
    facts = facts or gpu.facts()
    versions, ecc, known = _ledger_memory(ledger)
    states: dict[str, UnitState | None] = {}
    inputs = []
    for name, b in config.backends.items():
        st: UnitState | None = (known_states or {}).get(name)
        if st is None and units is not None:
            try:
                st = units.state(b.unit)
            except GpushiftError:
                st = None
        states[name] = st
        env, unread = unit_environment(st)
        argv = list(st.exec_start) if st else []
        version = versions.get(name)
        if probe_versions and b.version_command:
            version = run_version_command(b.version_command).version or version
        several = _instance_units(units, b) if only in (None, name) else None
        inputs.append(
            doctor.BackendInput(
                backend=b,
                unit=st,
                argv=argv,
                env=env,
                env_unread=tuple(unread),
                version=version,
                checkpoint=_checkpoint(b.kind, argv, env) if only in (None, name) else None,
                instance_units=several,
                instance_env={u: unit_environment(s)[0] for u, s in (several or {}).items() if s is not None},
            )
        )
    findings = doctor.check_all(
        inputs,
        facts,
        path_exists=os.path.exists,
        previous_ecc_corrected=ecc or None,
        accepted_ecc_uncorrected=dict(config.gpu.accepted_ecc_uncorrected) or None,
        known_gpus=known,
        accepted_gpu_uuids=config.gpu.accepted_gpu_uuids,
        listeners=TcpListeners(),
        only=only,
    )
    return findings, facts, states


def _instance_units(units: UnitControl | None, b: BackendConfig) -> dict[str, UnitState | None]:
    """Each instance's unit as systemd reports it (None: unreadable); {} for one unit."""
    out: dict[str, UnitState | None] = {}
    for i in b.instances if units is not None else ():
        assert units is not None
        try:
            out[i.unit] = units.state(i.unit)
        except GpushiftError:
            out[i.unit] = None
    return out


class HostDoctor:
    """The switcher's preflight doctor: findings about one target, from the real host."""

    def __init__(self, units: UnitControl, gpu: GpuProbe, ledger: Ledger) -> None:
        self.units = units
        self.gpu = gpu
        self.ledger = ledger

    def __call__(
        self,
        config: Config,
        target: str,
        facts: HostGpuFacts,
        states: Mapping[str, UnitState] | None = None,
    ) -> list[Any]:
        # Versions are not probed here: a version command may be slow, and the last recorded
        # version is what the pinned-version rule needs before a launch.  The GPU facts are the
        # ones the switcher already read for this switch.  Only the target is checked: another
        # backend's rules (the running one's port, taken by itself) would cost a scan of every
        # process's sockets and count for nothing here.
        findings, _facts, _states = run_checks(
            config,
            self.units,
            self.gpu,
            self.ledger,
            facts=facts,
            probe_versions=False,
            only=target,
            known_states=states,
        )
        return [f for f in findings if f.backend == target]
